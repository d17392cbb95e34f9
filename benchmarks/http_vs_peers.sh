#!/usr/bin/env bash
# half_plus_two and digits over HTTP JSON (one row per request, keep-alive, wrk) on inferd and on
# the peer servers (MLServer, TorchServe quiet, LitServe fast queue), all in the same run, using
# the peers harness in ../shared/peers. Prints the harness's markdown summary.
#
#   benchmarks/http_vs_peers.sh                      CONCS=16 DUR=10 PASSES=2
#   CONCS="1 16 64" PASSES=3 benchmarks/http_vs_peers.sh
#   PEERS="" benchmarks/http_vs_peers.sh             inferd alone
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
PEERS_DIR=${PEERS_DIR:-$ROOT/../shared/peers}
PORT=${INFERD_BENCH_PORT:-18100}
MODELS=${INFERD_BENCH_MODELS:-/tmp/inferd-bench-models}
WORK=$(mktemp -d)
export CONCS=${CONCS:-16} DUR=${DUR:-10} PASSES=${PASSES:-2} PEERS=${PEERS-mlserver torchserve litserve}
export QUIET=${QUIET:-1} LITSERVE_FAST_QUEUE=${LITSERVE_FAST_QUEUE:-1} PARALLEL_WORKERS=${PARALLEL_WORKERS:-0}
export INPROC=${INPROC:-0}

.venv/bin/inferd demo-models "$MODELS" --model half_plus_two --model digits >/dev/null
.venv/bin/inferd serve --model-repository "$MODELS" --http-address 127.0.0.1 --http-port "$PORT" \
  --allow-grpc=false >"$WORK/inferd.log" 2>&1 &
PID=$!
trap 'kill $PID 2>/dev/null; wait $PID 2>/dev/null; rm -rf "$WORK"' EXIT
for _ in $(seq 100); do
  curl -sf "http://127.0.0.1:$PORT/v2/health/ready" >/dev/null && break
  sleep 0.2
done

echo '{"instances": [1.0]}' >"$WORK/tf_half_plus_two.json"
# The same held-out digit as the peers get; our demo model names its input "input".
sed 's/"name":"x"/"name":"input"/' "$PEERS_DIR/bodies/v2_digits.json" >"$WORK/v2_digits.json"
cat >"$WORK/cells" <<CELLS
inferd/half_plus_two(v2 json)|http://127.0.0.1:$PORT/v2/models/half_plus_two/infer|$PEERS_DIR/bodies/v2_half_plus_two.json|$PID|
inferd/half_plus_two(tf rest)|http://127.0.0.1:$PORT/v1/models/half_plus_two:predict|$WORK/tf_half_plus_two.json|$PID|
inferd/digits(v2 json)|http://127.0.0.1:$PORT/v2/models/digits/infer|$WORK/v2_digits.json|$PID|
CELLS
curl -sf -d @"$PEERS_DIR/bodies/v2_half_plus_two.json" "http://127.0.0.1:$PORT/v2/models/half_plus_two/infer"
echo
if [ -n "$PEERS" ]; then
  EXTRA_CELLS="$WORK/cells" "$PEERS_DIR/run_all.sh"
else
  "$PEERS_DIR/setup.sh" --check >/dev/null || true
  EXTRA_CELLS="$WORK/cells" JSON_OUT="$WORK/servers.jsonl" "$PEERS_DIR/bench_servers.sh" || true
  python3 "$PEERS_DIR/summarize.py" "$WORK/servers.jsonl" 2>/dev/null || cat "$WORK/servers.jsonl"
fi
