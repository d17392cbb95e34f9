"""resnet50 over HTTP with binary tensors at concurrency 1, against onnxruntime in-process.

Both sides run the same input in alternating rounds, so machine drift hits both alike; the
figure that matters is the ratio of medians. Usage:

    .venv/bin/python benchmarks/resnet50_latency.py [--rounds 5] [--per-round 10]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import tritonclient.http as httpclient

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from inferd.demo.models import write_demo_repository
from tests.support import ServerProcess


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--per-round", type=int, default=10)
    args = parser.parse_args()

    root = Path(tempfile.gettempdir()) / "inferd-bench-models"
    write_demo_repository(root, models=["resnet50"])
    image = np.random.default_rng(0).standard_normal((1, 3, 224, 224), dtype=np.float32)

    session = ort.InferenceSession(
        str(root / "resnet50" / "1" / "model.onnx"), providers=["CPUExecutionProvider"]
    )
    server = ServerProcess(root, extra_args=["--allow-grpc=false"]).start()
    try:
        client = httpclient.InferenceServerClient(server.http_address)
        request = httpclient.InferInput("input", [1, 3, 224, 224], "FP32")
        request.set_data_from_numpy(image, binary_data=True)
        wanted = [httpclient.InferRequestedOutput("output", binary_data=True)]
        reference = session.run(["output"], {"input": image})[0]
        served = client.infer("resnet50", [request], outputs=wanted).as_numpy("output")
        np.testing.assert_allclose(served, reference, rtol=1e-4, atol=1e-4)

        inproc: list[float] = []
        http: list[float] = []
        for _ in range(args.rounds):
            for _ in range(args.per_round):
                started = time.perf_counter()
                session.run(["output"], {"input": image})
                inproc.append(time.perf_counter() - started)
            for _ in range(args.per_round):
                started = time.perf_counter()
                client.infer("resnet50", [request], outputs=wanted)
                http.append(time.perf_counter() - started)
    finally:
        server.stop()

    def row(name: str, values: list[float]) -> str:
        p50 = statistics.median(values) * 1e3
        p90 = float(np.percentile(values, 90)) * 1e3
        return f"| {name} | {len(values)} | {p50:.1f} | {p90:.1f} |"

    print("| resnet50, batch 1 | calls | p50 ms | p90 ms |")
    print("|---|---|---|---|")
    print(row("onnxruntime in-process (default options)", inproc))
    print(row("inferd HTTP binary, concurrency 1", http))
    ratio = statistics.median(http) / statistics.median(inproc)
    print(f"\nratio of medians inferd / in-process: {ratio:.3f}")


if __name__ == "__main__":
    main()
