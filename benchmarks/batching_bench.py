"""Dynamic batching, measured with ``inferd bench`` against one server in one run.

1. digits at concurrency 64, one row per request: batching off vs on (throughput, p50, p99).
2. resnet50 at concurrency 32, binary tensors, batching on, against onnxruntime in-process
   at batch 32 on the same machine in the same run (images/s).
For each served run, the distribution of executed batch sizes comes from the statistics API.

    .venv/bin/python benchmarks/batching_bench.py [--interval-ms 3000]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnxruntime as ort

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from inferd.demo.models import write_demo_repository
from tests.support import ServerProcess

CONFIGS = {
    "digits_plain": "max_batch_size: 64\n",
    "digits_batched": (
        "max_batch_size: 64\ndynamic_batching { max_queue_delay_microseconds: 500 }\n"
    ),
    "resnet50_batched": (
        "max_batch_size: 32\n"
        "dynamic_batching { preferred_batch_size: [32] max_queue_delay_microseconds: 50000 }\n"
    ),
}
SOURCES = {"digits_plain": "digits", "digits_batched": "digits", "resnet50_batched": "resnet50"}


def build_repository(root: Path) -> Path:
    demo = root / "demo"
    write_demo_repository(demo, models=["digits", "resnet50"])
    repo = root / "repo"
    for name, config in CONFIGS.items():
        target = repo / name / "1"
        target.mkdir(parents=True, exist_ok=True)
        model = target / "model.onnx"
        if not model.exists():
            os.link(demo / SOURCES[name] / "1" / "model.onnx", model)
        (repo / name / "config.pbtxt").write_text(f'name: "{name}"\n{config}')
    return repo


def bench(server: ServerProcess, model: str, concurrency: int, interval_ms: int) -> dict[str, Any]:
    report = Path(tempfile.mkstemp(suffix=".json")[1])
    args = [
        sys.executable,
        "-m",
        "inferd",
        "bench",
        "-m",
        model,
        "-u",
        server.http_address,
        "--concurrency-range",
        f"{concurrency}:{concurrency}:1",
        "-p",
        str(interval_ms),
        "--max-windows",
        "4",
        "--processes",
        "1",
        "--no-progress",
        "--json-report",
        str(report),
    ]
    subprocess.run(args, check=True, stdout=subprocess.DEVNULL)
    data = json.loads(report.read_text())
    report.unlink()
    rows = data["rows"] if isinstance(data, dict) else data
    return dict(rows[-1])


def batch_sizes(server: ServerProcess, model: str) -> dict[int, int]:
    stats = httpx.get(f"{server.http_url}/v2/models/{model}/stats").json()["model_stats"][0]
    return {b["batch_size"]: b["compute_infer"]["count"] for b in stats["batch_stats"]}


def distribution(before: dict[int, int], after: dict[int, int]) -> str:
    counts = {size: after[size] - before.get(size, 0) for size in after}
    counts = {s: c for s, c in counts.items() if c}
    total = sum(counts.values()) or 1
    mean = sum(s * c for s, c in counts.items()) / total
    top = sorted(counts.items(), key=lambda kv: -kv[1])[:6]
    shown = ", ".join(f"{s}: {100 * c / total:.0f}%" for s, c in sorted(top))
    return f"mean {mean:.1f} rows; {shown}"


def served(server: ServerProcess, model: str, concurrency: int, interval_ms: int) -> str:
    before = batch_sizes(server, model)
    row = bench(server, model, concurrency, interval_ms)
    dist = distribution(before, batch_sizes(server, model))
    return (
        f"| {model} | {concurrency} | {row['throughput_infer_per_s']:.0f} | "
        f"{row['latency_p50_ms']:.2f} | {row['latency_p99_ms']:.2f} | {dist} |"
    ), row["throughput_infer_per_s"]


def in_process_resnet(model: Path, seconds: float) -> float:
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    batch = np.random.default_rng(0).standard_normal((32, 3, 224, 224), dtype=np.float32)
    session.run(None, {"input": batch})
    calls = 0
    started = time.perf_counter()
    while time.perf_counter() - started < seconds:
        session.run(None, {"input": batch})
        calls += 1
    return 32 * calls / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--interval-ms", type=int, default=3000)
    args = parser.parse_args()
    root = Path(tempfile.gettempdir()) / "inferd-batching-bench"
    repo = build_repository(root)
    server = ServerProcess(repo, extra_args=["--allow-grpc=false"]).start()
    try:
        print("| model | concurrency | infer/s | p50 ms | p99 ms | executed batch sizes |")
        print("|---|---|---|---|---|---|")
        line, plain = served(server, "digits_plain", 64, args.interval_ms)
        print(line)
        line, batched = served(server, "digits_batched", 64, args.interval_ms)
        print(line)
        line, resnet = served(server, "resnet50_batched", 32, max(args.interval_ms, 8000))
        print(line)
    finally:
        server.stop()
    inproc = in_process_resnet(repo / "resnet50_batched" / "1" / "model.onnx", 20.0)
    print(f"\ndigits, batching on / off: {batched / plain:.2f}x")
    print(f"resnet50 in-process onnxruntime, batch 32: {inproc:.1f} images/s")
    print(f"resnet50 served with batching / in-process: {resnet / inproc:.2f}x")


if __name__ == "__main__":
    main()
