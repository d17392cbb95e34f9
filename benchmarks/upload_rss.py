"""Server memory under concurrent model uploads: RSS growth against the bytes in flight.

Starts ``inferd serve`` (explicit mode, loopback), sends ``--uploads`` concurrent uploads of a
model archive padded with ``--mib`` MiB of random bytes, samples the server's RSS every 20 ms,
and prints the peak growth over the idle RSS and its ratio to the bytes sent at once.

    .venv/bin/python benchmarks/upload_rss.py [--uploads 3] [--mib 300]
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import tarfile
import tempfile
import threading
import time
from pathlib import Path

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.e2e.lifecycle_support import HALF_PLUS_TWO
from tests.support import ServerProcess


def archive(padding_mib: int) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in (
            ("1/model.onnx", HALF_PLUS_TWO),
            ("1/padding.bin", os.urandom(padding_mib << 20)),
        ):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--uploads", type=int, default=3)
    parser.add_argument("--mib", type=int, default=300)
    args = parser.parse_args()
    body = archive(args.mib)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "models"
        root.mkdir()
        server = ServerProcess(
            root,
            extra_args=[
                "--model-control-mode",
                "explicit",
                "--max-concurrent-uploads",
                str(args.uploads),
                "--max-upload-bytes",
                str(len(body) * 2),
            ],
        ).start()
        try:
            assert server.proc is not None
            process = psutil.Process(server.proc.pid)
            idle = process.memory_info().rss
            peak = idle
            done = threading.Event()

            def sample() -> None:
                nonlocal peak
                while not done.is_set():
                    peak = max(peak, process.memory_info().rss)
                    time.sleep(0.02)

            statuses: list[int] = []

            def upload(i: int) -> None:
                r = httpx.put(
                    f"{server.http_url}/v2/repository/models/m{i}",
                    content=body,
                    headers={"content-type": "application/x-tar"},
                    timeout=600,
                )
                statuses.append(r.status_code)

            sampler = threading.Thread(target=sample)
            sampler.start()
            started = time.perf_counter()
            threads = [threading.Thread(target=upload, args=(i,)) for i in range(args.uploads)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            took = time.perf_counter() - started
            done.set()
            sampler.join()
            in_flight = len(body) * args.uploads
            growth = peak - idle
            print(
                f"{args.uploads} concurrent uploads of {len(body) / 2**20:.0f} MiB "
                f"({in_flight / 2**20:.0f} MiB in flight), statuses {sorted(statuses)}: "
                f"RSS {idle / 2**20:.0f} -> peak {peak / 2**20:.0f} MiB, growth "
                f"{growth / 2**20:.0f} MiB = {growth / in_flight:.2f}x the bytes in flight; "
                f"{took:.1f} s"
            )
        finally:
            server.stop()


if __name__ == "__main__":
    main()
