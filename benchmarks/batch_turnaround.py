"""Where a dynamic batcher's round goes while the model waits: each thread's CPU per request.

At c=64 with batches of 64 every client is in the batch, so each round is the model's
execution, then a turnaround in which the event loop answers 64 requests and reads the next 64
while the model is idle. This takes the model out: an echo model (``backend: "echo"``,
``delay_ms`` 25, a model that takes 25 ms and no CPU) is served with the wide-MLP benchmark's
batching configuration (max_batch_size 64, preferred 64, 50 ms delay) and loaded as
``core_bench.py`` loads the MLP (wrk, c=64, one 1x1024 FP32 row per request, HTTP binary). A
round is then 25 ms plus the turnaround, and the CPU of each thread over the load says who
spends it: the event loop (the process's main thread), the other threads (granian's, the
instance's). The minimal batcher (``empty_rsgi.py --batch``: parse, queue, 64 at a time to
onnxruntime on a thread, answer) is measured the same way with a one-node model, whose rounds
are all turnaround.

    python benchmarks/batch_turnaround.py [--passes 3] [--seconds 8] [--tree LABEL=PATH ...]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.core_bench import CACHE, MLP_DIMS, binary_body, floor_server, trees_from, wrk
from tests.support import ServerProcess

DELAY_MS = 25
ECHO = f"""name: "echo_batched"
backend: "echo"
max_batch_size: 64
input [{{ name: "input" data_type: TYPE_FP32 dims: [{MLP_DIMS[0]}] }}]
output [{{ name: "output" data_type: TYPE_FP32 dims: [{MLP_DIMS[0]}] }}]
parameters {{ key: "delay_ms" value: {{ string_value: "{DELAY_MS}" }} }}
dynamic_batching {{ preferred_batch_size: [64] max_queue_delay_microseconds: 50000 }}
"""


def thread_cpu_s(pid: int) -> dict[int, float]:
    """CPU seconds of each live thread of a process, by thread id."""
    ticks = os.sysconf("SC_CLK_TCK")
    found: dict[int, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        found[int(task.name)] = (int(fields[11]) + int(fields[12])) / ticks
    return found


def load(
    url: str, pid: int, body: bytes, headers: dict[str, str], seconds: float
) -> dict[str, float]:
    """rows/s, and the event loop's and the other threads' CPU-µs per request, under wrk."""
    with tempfile.TemporaryDirectory() as work:
        body_file = Path(work) / "body.bin"
        body_file.write_bytes(body)
        wrk(url, body_file, headers, 64, 2)
        before = thread_cpu_s(pid)
        r = wrk(url, body_file, headers, 64, seconds)
        after = thread_cpu_s(pid)
    requests = max(1, r["requests"])
    spent = {tid: after[tid] - before.get(tid, 0.0) for tid in after}
    loop = spent.pop(pid, 0.0)
    return {
        "rows_s": r["rps"],
        "loop_cpu_us": loop / requests * 1e6,
        "other_cpu_us": sum(spent.values()) / requests * 1e6,
        "errors": r["errors"],
    }


@contextmanager
def echo_server(tree: Path, label: str) -> Iterator[ServerProcess]:
    with tempfile.TemporaryDirectory() as work:
        repo = Path(work) / "models"
        (repo / "echo_batched" / "1").mkdir(parents=True)
        (repo / "echo_batched" / "config.pbtxt").write_text(ECHO)
        env = {"PYTHONPATH": str(tree / "src")}
        server = ServerProcess(repo, env=env, log_path=CACHE / f"turnaround-{label}.log")
        server.start(timeout_s=120)
        try:
            yield server
        finally:
            server.stop()


def measure_inferd(
    tree: Path, label: str, body: bytes, headers: dict[str, str], seconds: float
) -> dict[str, float]:
    with echo_server(tree, label) as server:
        assert server.proc is not None
        url = f"{server.http_url}/v2/models/echo_batched/infer"
        result = load(url, server.proc.pid, body, headers, seconds)
        stats = httpx.get(f"{server.http_url}/v2/models/echo_batched/stats").json()
        executed = stats["model_stats"][0]
        batch = executed["inference_count"] / max(1, executed["execution_count"])
    result["mean_batch"] = batch
    result["turnaround_ms"] = batch / result["rows_s"] * 1e3 - DELAY_MS
    return result


def one_node_onnx(path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper

    shape: list[str | int | None] = ["batch", MLP_DIMS[0]]
    graph = helper.make_graph(
        [helper.make_node("Relu", ["input"], ["output"])],
        "relu",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, shape)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))


def measure_minimal(body: bytes, headers: dict[str, str], seconds: float) -> dict[str, float]:
    model = CACHE / "relu_1024.onnx"
    if not model.exists():
        one_node_onnx(model)
    path = "/v2/models/batch/infer"
    with floor_server("--batch", str(model), path=path, body=body, headers=headers) as (url, pid):
        result = load(url, pid, body, headers, seconds)
    result["turnaround_ms"] = 64 / result["rows_s"] * 1e3
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tree", action="append", default=[], help="LABEL=PATH (repeat)")
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=8.0)
    args = parser.parse_args()
    trees = trees_from(args.tree)
    x = np.random.default_rng(2).standard_normal((1, MLP_DIMS[0]), dtype=np.float32)
    body, headers = binary_body("input", x)
    print(f"load average at start: {os.getloadavg()[0]:.2f}", flush=True)
    rows: dict[str, list[dict[str, float]]] = {label: [] for label, _ in trees}
    rows["minimal batcher"] = []
    for p in range(args.passes):
        for label, tree in trees:
            row = measure_inferd(tree, label, body, headers, args.seconds)
            rows[label].append(row)
            print(json.dumps({"server": label, "pass": p + 1, **row}), flush=True)
        row = measure_minimal(body, headers, args.seconds)
        rows["minimal batcher"].append(row)
        print(json.dumps({"server": "minimal batcher", "pass": p + 1, **row}), flush=True)
    print(f"load average at end: {os.getloadavg()[0]:.2f}\n")
    print("| server | rows/s | turnaround per round, ms | event loop CPU-us/req | other threads |")
    print("|---|---|---|---|---|")
    for label, found in rows.items():
        med = {k: statistics.median(r[k] for r in found) for k in found[0]}
        print(
            f"| {label} | {med['rows_s']:,.0f} | {med['turnaround_ms']:.1f} | "
            f"{med['loop_cpu_us']:,.0f} | {med['other_cpu_us']:,.0f} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
