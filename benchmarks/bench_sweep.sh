#!/usr/bin/env bash
# `inferd bench` sweeps on the demo models: half_plus_two and digits over HTTP (binary tensors)
# and gRPC, a request-rate sweep, and, when the peer harness in ../shared/peers is set up, the
# same models on MLServer in the same run (JSON tensors for both servers, as MLServer takes no
# binary tensors). Prints the tables; CSV, JSON and PNG files go to $OUT.
#
#   benchmarks/bench_sweep.sh                        CONCS=1:13:4 INTERVAL_MS=1000 WINDOWS=5
#   PEERS="" benchmarks/bench_sweep.sh               inferd alone
#   CONCS=1:33:8 RATES=250:1000:250 benchmarks/bench_sweep.sh
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
PEERS_DIR=${PEERS_DIR:-$ROOT/../shared/peers}
PORT=${INFERD_BENCH_PORT:-18100}
GRPC_PORT=${INFERD_BENCH_GRPC_PORT:-18101}
MODELS=${INFERD_BENCH_MODELS:-/tmp/inferd-bench-models}
OUT=${OUT:-/tmp/inferd-bench-sweep}
CONCS=${CONCS:-1:13:4}
RATES=${RATES:-200:800:300}
INTERVAL_MS=${INTERVAL_MS:-1000}
WINDOWS=${WINDOWS:-5}
PEERS=${PEERS-mlserver}
MLSERVER_URL=127.0.0.1:18080
mkdir -p "$OUT"

.venv/bin/inferd demo-models "$MODELS" --model half_plus_two --model digits >/dev/null
.venv/bin/inferd serve --model-repository "$MODELS" --http-address 127.0.0.1 --http-port "$PORT" \
  --grpc-address 127.0.0.1 --grpc-port "$GRPC_PORT" >"$OUT/inferd.log" 2>&1 &
PID=$!
STARTED_MLSERVER=""
cleanup() {
  kill "$PID" 2>/dev/null || true
  wait "$PID" 2>/dev/null || true
  if [ -n "$STARTED_MLSERVER" ]; then "$PEERS_DIR/mlserver/stop.sh" >/dev/null 2>&1 || true; fi
}
trap cleanup EXIT
for _ in $(seq 150); do
  curl -sf "http://127.0.0.1:$PORT/v2/health/ready" >/dev/null && break
  sleep 0.2
done

bench() { .venv/bin/inferd bench --no-progress -p "$INTERVAL_MS" --max-windows "$WINDOWS" "$@"; }
INFERD_HTTP=inferd=127.0.0.1:$PORT
INFERD_GRPC=inferd=127.0.0.1:$GRPC_PORT

for model in half_plus_two digits; do
  bench -m "$model" -u "$INFERD_HTTP" --concurrency-range "$CONCS" \
    -f "$OUT/$model-http.csv" --json "$OUT/$model-http.json" --plot "$OUT/$model-http.png"
  bench -m "$model" -i grpc -u "$INFERD_GRPC" --concurrency-range "$CONCS" \
    -f "$OUT/$model-grpc.csv" --plot "$OUT/$model-grpc.png"
done
bench -m digits -u "$INFERD_HTTP" --request-rate-range "$RATES" --percentile 95 \
  -f "$OUT/digits-rate.csv" --plot "$OUT/digits-rate.png"

if [ -n "$PEERS" ] && [ -x "$PEERS_DIR/mlserver/start.sh" ] \
  && "$PEERS_DIR/setup.sh" --check >/dev/null 2>&1; then
  if ! curl -sf "http://$MLSERVER_URL/v2/health/ready" >/dev/null; then
    "$PEERS_DIR/mlserver/start.sh"
    STARTED_MLSERVER=1
    for _ in $(seq 300); do
      curl -sf "http://$MLSERVER_URL/v2/models/half_plus_two/ready" >/dev/null \
        && curl -sf "http://$MLSERVER_URL/v2/models/digits/ready" >/dev/null && break
      sleep 0.2
    done
  fi
  # MLServer's custom runtime describes no inputs: send the peers' own v2 bodies as written.
  # Its "digits" is the scikit-learn runtime (predict_proba), inferd's is the ONNX MLP.
  sed 's/"name":"x"/"name":"input"/' "$PEERS_DIR/bodies/v2_digits.json" >"$OUT/v2_digits.json"
  for model in half_plus_two digits; do
    data=$PEERS_DIR/bodies/v2_half_plus_two.json
    [ "$model" = digits ] && data=$OUT/v2_digits.json
    bench -m "$model" --json --input-data "$data" -u "$INFERD_HTTP" -u mlserver=$MLSERVER_URL \
      --concurrency-range "$CONCS" -f "$OUT/$model-vs-mlserver.csv" \
      --plot "$OUT/$model-vs-mlserver.png"
  done
else
  echo "(MLServer comparison skipped: PEERS empty or $PEERS_DIR not set up)"
fi
echo "CSV, JSON and plots in $OUT"
