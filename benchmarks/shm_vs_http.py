"""A 16 MB image batch (28 x 3 x 224 x 224 FP32) through system shared memory vs binary HTTP.

Two models take the same batch: ``resnet50`` (the demo model: the whole request, compute
included) and ``mean`` (a ReduceMean over each image: the transport alone). For each, rounds
alternate the two paths, and the figures are the medians of client latency and of the server's
CPU time per request (from /proc). The shared-memory path counts the client's copy of the batch
into the region in every request. Usage:

    .venv/bin/python benchmarks/shm_vs_http.py [--rounds 3] [--per-round 3] [--mean-per-round 20]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from onnx import TensorProto, helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from inferd.demo.models import write_demo_repository
from tests.support import ServerProcess

BATCH = 28  # 28 x 602,112 bytes = 16.1 MiB
IN_BYTES = BATCH * 3 * 224 * 224 * 4


def _mean_model(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    graph = helper.make_graph(
        [helper.make_node("ReduceMean", ["input"], ["output"], axes=[2, 3], keepdims=0)],
        "mean",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 3, 224, 224])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["N", 3])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(path / "model.onnx"))


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _measure(pid: int, call: Callable[[], None], count: int) -> tuple[list[float], float]:
    latencies = []
    cpu_before = _cpu_s(pid)
    for _ in range(count):
        started = time.perf_counter()
        call()
        latencies.append(time.perf_counter() - started)
    return latencies, (_cpu_s(pid) - cpu_before) / count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--per-round", type=int, default=3)
    parser.add_argument("--mean-per-round", type=int, default=20)
    args = parser.parse_args()

    root = Path(tempfile.gettempdir()) / "inferd-bench-shm"
    write_demo_repository(root, models=["resnet50"])
    _mean_model(root / "mean" / "1")
    batch = np.random.default_rng(0).standard_normal((BATCH, 3, 224, 224), dtype=np.float32)
    server = ServerProcess(root, extra_args=["--allow-grpc=false"]).start()
    key = f"/inferd_bench_{os.getpid()}"
    region = shm.create_shared_memory_region("batch", key, IN_BYTES + 1000 * 4 * BATCH)
    try:
        assert server.proc is not None
        pid = server.proc.pid
        client = httpclient.InferenceServerClient(server.http_address, network_timeout=300)
        client.register_system_shared_memory("batch", key, IN_BYTES + 1000 * 4 * BATCH)
        print(f"batch {batch.shape} FP32 = {batch.nbytes / 2**20:.1f} MiB; `uptime`:")
        print("  " + os.popen("uptime").read().strip())
        for model, per_round in (("mean", args.mean_per_round), ("resnet50", args.per_round)):
            out_size = (3 if model == "mean" else 1000) * 4 * BATCH

            def over_http(model: str = model) -> None:
                tensor = httpclient.InferInput("input", list(batch.shape), "FP32")
                tensor.set_data_from_numpy(batch, binary_data=True)
                out = httpclient.InferRequestedOutput("output", binary_data=True)
                client.infer(model, [tensor], outputs=[out]).as_numpy("output")

            def over_shm(model: str = model, out_size: int = out_size) -> None:
                shm.set_shared_memory_region(region, [batch])
                tensor = httpclient.InferInput("input", list(batch.shape), "FP32")
                tensor.set_shared_memory("batch", IN_BYTES)
                out = httpclient.InferRequestedOutput("output")
                out.set_shared_memory("batch", out_size, offset=IN_BYTES)
                client.infer(model, [tensor], outputs=[out])
                width = out_size // 4 // BATCH
                shm.get_contents_as_numpy(region, np.float32, [BATCH, width], offset=IN_BYTES)

            over_http()
            over_shm()  # warm both paths
            latency: dict[str, list[float]] = {"http": [], "shm": []}
            cpu: dict[str, list[float]] = {"http": [], "shm": []}
            for _ in range(args.rounds):
                for name, call in (("http", over_http), ("shm", over_shm)):
                    seconds, cpu_s = _measure(pid, call, per_round)
                    latency[name] += seconds
                    cpu[name].append(cpu_s)
            for name in ("http", "shm"):
                ms = statistics.median(latency[name]) * 1e3
                print(
                    f"{model:9s} {name:4s}: median latency {ms:8.1f} ms,"
                    f" server CPU {statistics.median(cpu[name]) * 1e3:8.1f} ms/request"
                    f" ({len(latency[name])} requests)"
                )
            ratio = statistics.median(latency["http"]) / statistics.median(latency["shm"])
            print(f"{model:9s} binary HTTP / shared memory latency: {ratio:.2f}x")
        client.unregister_system_shared_memory()
    finally:
        shm.destroy_shared_memory_region(region)
        server.stop()


if __name__ == "__main__":
    main()
