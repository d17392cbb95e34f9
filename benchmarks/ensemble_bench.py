"""Ensembles, measured against one server in one run.

1. ``chain`` (half_plus_two -> half_plus_two, an ensemble) vs a single ``half_plus_two`` at
   concurrency 16 with ``inferd bench`` (HTTP v2 binary): req/s of each, and the ratio
   (target: the ensemble at >= 60 % of the single model).
2. The ``resnet`` demo pipeline (JPEG bytes -> Python preprocess -> resnet50 with dynamic
   batching -> Python top 5) at concurrency 4 over HTTP v2 binary, vs the same three steps
   called in one process in a loop (decode, onnxruntime, softmax top 5): images/s of each
   (target: >= 80 %). ``--skip-resnet`` leaves it out.

    .venv/bin/python benchmarks/ensemble_bench.py [--interval-ms 3000] [--resnet-seconds 30]
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import struct
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.batching_bench import bench  # inferd bench at one concurrency, one row
from inferd.demo import pipeline
from inferd.demo.models import write_demo_repository
from tests.e2e.ensemble_support import CHAIN
from tests.support import ServerProcess

RESNET_BATCHING = (
    "max_batch_size: 8\n"
    "dynamic_batching { preferred_batch_size: [4, 8] max_queue_delay_microseconds: 20000 }\n"
)


def build_repository(root: Path) -> Path:
    demo = root / "demo"
    write_demo_repository(demo, models=["half_plus_two", "resnet50"])
    repo = root / "repo"
    write_demo_repository(repo, models=["half_plus_two", *pipeline_names()])
    (repo / "chain" / "1").mkdir(parents=True, exist_ok=True)
    (repo / "chain" / "config.pbtxt").write_text(CHAIN)
    model = repo / "resnet50" / "1" / "model.onnx"
    model.parent.mkdir(parents=True, exist_ok=True)
    if not model.exists():
        os.link(demo / "resnet50" / "1" / "model.onnx", model)
    (repo / "resnet50" / "config.pbtxt").write_text(f'name: "resnet50"\n{RESNET_BATCHING}')
    return repo


def pipeline_names() -> list[str]:
    return [pipeline.PREPROCESS, pipeline.POSTPROCESS, pipeline.PIPELINE]


def _jpeg() -> bytes:
    from PIL import Image

    pixels = np.random.default_rng(0).integers(0, 255, (480, 640, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="JPEG", quality=90)
    return out.getvalue()


def _v2_binary_body(jpeg: bytes) -> tuple[bytes, int]:
    tensor = struct.pack("<I", len(jpeg)) + jpeg
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "image_bytes",
                    "datatype": "BYTES",
                    "shape": [1, 1],
                    "parameters": {"binary_data_size": len(tensor)},
                }
            ],
            "outputs": [{"name": "classes"}],
        }
    ).encode()
    return header + tensor, len(header)


async def _served_images(url: str, jpeg: bytes, concurrency: int, seconds: float) -> float:
    body, header_length = _v2_binary_body(jpeg)
    headers = {
        "Content-Type": "application/octet-stream",
        "Inference-Header-Content-Length": str(header_length),
    }
    done = 0
    async with httpx.AsyncClient(timeout=60) as client:

        async def worker(stop_at: float) -> None:
            nonlocal done
            while time.perf_counter() < stop_at:
                r = await client.post(url, content=body, headers=headers)
                r.raise_for_status()
                done += 1

        await asyncio.gather(*(worker(time.perf_counter() + 3) for _ in range(concurrency)))
        done = 0  # the first seconds warm every step up
        started = time.perf_counter()
        await asyncio.gather(*(worker(started + seconds) for _ in range(concurrency)))
        return done / (time.perf_counter() - started)


def in_process_images(model: Path, jpeg: bytes, seconds: float) -> float:
    """The pipeline's three steps in one loop: decode + normalize, resnet50, softmax top 5."""
    import onnxruntime as ort

    namespace: dict[str, Any] = {}
    source = pipeline.PREPROCESS_MODEL.replace("import triton_python_backend_utils as pb_utils", "")
    exec(compile(source, "preprocess", "exec"), namespace)
    decode = namespace["decode"]
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])

    def once() -> None:
        image = decode(jpeg)[None]
        (logits,) = session.run(None, {"input": image})
        shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
        probabilities = shifted / shifted.sum(axis=1, keepdims=True)
        np.argsort(-probabilities, axis=1, kind="stable")[:, : pipeline.TOP_K]

    once()
    calls = 0
    started = time.perf_counter()
    while time.perf_counter() - started < seconds:
        once()
        calls += 1
    return calls / (time.perf_counter() - started)


def load_average() -> str:
    return "load average " + ", ".join(f"{v:.2f}" for v in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--interval-ms", type=int, default=3000)
    parser.add_argument("--resnet-seconds", type=float, default=30.0)
    parser.add_argument("--skip-resnet", action="store_true")
    args = parser.parse_args()
    root = Path(tempfile.gettempdir()) / "inferd-ensemble-bench"
    repo = build_repository(root)
    server = ServerProcess(repo, extra_args=["--allow-grpc=false"]).start(timeout_s=180)
    try:
        print(f"before: {load_average()}")
        print("| model | concurrency | req/s | p50 ms | p99 ms |")
        print("|---|---|---|---|---|")
        rates: dict[str, list[float]] = {"half_plus_two": [], "chain": []}
        for model in ("half_plus_two", "chain", "half_plus_two", "chain"):
            row = bench(server, model, 16, args.interval_ms)
            rates[model].append(row["throughput_infer_per_s"])
            print(
                f"| {model} | 16 | {row['throughput_infer_per_s']:.0f} | "
                f"{row['latency_p50_ms']:.2f} | {row['latency_p99_ms']:.2f} |"
            )
        single, chain = (max(rates[m]) for m in ("half_plus_two", "chain"))
        mean_single, mean_chain = (float(np.mean(rates[m])) for m in ("half_plus_two", "chain"))
        print(f"\nchain / half_plus_two at c=16, best of 2 each: {chain / single:.0%}")
        print(f"chain / half_plus_two at c=16, mean of 2 each: {mean_chain / mean_single:.0%}")
        if not args.skip_resnet:
            jpeg = _jpeg()
            url = f"{server.http_url}/v2/models/resnet/infer"
            served = asyncio.run(_served_images(url, jpeg, 4, args.resnet_seconds))
            print(f"resnet pipeline served, c=4: {served:.2f} images/s")
    finally:
        server.stop()
    if not args.skip_resnet:
        model = repo / "resnet50" / "1" / "model.onnx"
        local = in_process_images(model, jpeg, args.resnet_seconds)
        print(f"resnet pipeline steps in one process, in a loop: {local:.2f} images/s")
        print(f"served / in-process: {served / local:.0%}")
    print(f"after: {load_average()}")


if __name__ == "__main__":
    main()
