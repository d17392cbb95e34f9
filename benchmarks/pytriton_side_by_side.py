"""inferd.pytriton against PyTriton itself, on the same bound function, side by side.

The function: ``@batch`` add/sub of two FP32 [16] inputs, max_batch_size 64, PyTriton's default
dynamic batcher. The same server script runs twice: importing ``pytriton`` (PyTriton 0.7.0 and
the tritonserver 2.51 its wheel ships, run with Debian's ``/usr/bin/python3`` first on PATH, as
its Python stub needs) and importing ``inferd.pytriton``. Each is loaded over HTTP (KServe v2
binary tensors, keep-alive connections) and gRPC (pre-serialized ModelInferRequest bytes on one
grpc.aio channel), one client and sixteen (closed loop, one load process): requests per second,
and the server's CPU per request over its whole process tree (tritonserver, its Python stubs
and PyTriton's proxy for PyTriton).

    .venv/bin/python benchmarks/pytriton_side_by_side.py --pytriton-python /path/venv/bin/python
        [--seconds 8] [--warmup 2]

``--pytriton-python``: an interpreter of a venv made by ``/usr/bin/python3`` with the
nvidia-pytriton wheel installed (its bin folder goes first on PATH).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import grpc
import numpy as np
from tritonclient.grpc import service_pb2 as pb

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

from grpc_bench import _tree_cpu_s  # noqa: E402

from tests.support import free_port  # noqa: E402

MODEL = "AddSub"
INFER = "/inference.GRPCInferenceService/ModelInfer"

SERVER = """
import sys

import numpy as np

from {package}.decorators import batch
from {package}.model_config import ModelConfig, Tensor
from {package}.triton import Triton, TritonConfig


@batch
def add_sub(a, b):
    return {{"add": a + b, "sub": a - b}}


config = TritonConfig(http_address="127.0.0.1", http_port={http}, grpc_address="127.0.0.1",
                      grpc_port={grpc}, metrics_port={metrics})
with Triton(config=config) as triton:
    triton.bind(
        model_name="AddSub",
        infer_func=add_sub,
        inputs=[Tensor(name="a", dtype=np.float32, shape=(16,)),
                Tensor(name="b", dtype=np.float32, shape=(16,))],
        outputs=[Tensor(name="add", dtype=np.float32, shape=(16,)),
                 Tensor(name="sub", dtype=np.float32, shape=(16,))],
        config=ModelConfig(max_batch_size=64),
    )
    triton.serve()
"""


def http_request(port: int) -> bytes:
    raw = np.arange(16, dtype=np.float32).reshape(1, 16).tobytes()
    header = json.dumps(
        {
            "inputs": [
                {"name": n, "datatype": "FP32", "shape": [1, 16],
                 "parameters": {"binary_data_size": len(raw)}}
                for n in ("a", "b")
            ],
            "outputs": [{"name": n, "parameters": {"binary_data": True}} for n in ("add", "sub")],
        }
    ).encode()  # fmt: skip
    body = header + raw + raw
    head = (
        f"POST /v2/models/{MODEL}/infer HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Inference-Header-Content-Length: {len(header)}\r\n"
        f"Content-Type: application/octet-stream\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


def grpc_request() -> bytes:
    request = pb.ModelInferRequest(model_name=MODEL)
    for name in ("a", "b"):
        request.inputs.add(name=name, datatype="FP32", shape=[1, 16])
        request.raw_input_contents.append(np.arange(16, dtype=np.float32).tobytes())
    data: bytes = request.SerializeToString()
    return data


async def _http_worker(port: int, request: bytes, until: float, counts: list[int]) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    while time.perf_counter() < until:
        writer.write(request)
        head = await reader.readuntil(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(head.decode(errors="replace"))
        found = re.search(rb"\r\ncontent-length:\s*(\d+)", head, re.I)
        assert found, head
        await reader.readexactly(int(found.group(1)))
        counts[0] += 1
    writer.close()


async def _grpc_load(
    port: int, conns: int, until: float, counts: list[int], payload: bytes
) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.unary_unary(INFER)

        async def worker() -> None:
            while time.perf_counter() < until:
                answer = pb.ModelInferResponse.FromString(await call(payload))
                assert answer.raw_output_contents
                counts[0] += 1

        await asyncio.gather(*(worker() for _ in range(conns)))


def _load(args: tuple[str, int, int, float, float, bytes | None]) -> tuple[int, float]:
    """Runs in a process of its own: requests done in the window, and the window's length.
    The request: a whole HTTP request or a serialized ModelInferRequest (None: AddSub's)."""
    protocol, port, conns, warmup_s, seconds, request = args

    async def run() -> tuple[int, float]:
        start = time.perf_counter()
        until = start + warmup_s + seconds
        counts = [0]
        if protocol == "http":
            body = request or http_request(port)
            jobs = [_http_worker(port, body, until, counts) for _ in range(conns)]
        else:
            jobs = [_grpc_load(port, conns, until, counts, request or grpc_request())]
        task = asyncio.ensure_future(asyncio.gather(*jobs))
        await asyncio.sleep(warmup_s)
        before, began = counts[0], time.perf_counter()
        await task
        return counts[0] - before, time.perf_counter() - began

    return asyncio.run(run())


def measure(
    protocol: str,
    port: int,
    server_pid: int,
    conns: int,
    args: argparse.Namespace,
    request: bytes | None = None,
) -> tuple[float, float]:
    """Requests per second, and the server tree's CPU µs per request."""
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        load = (protocol, port, conns, args.warmup, args.seconds, request)
        pending = pool.apply_async(_load, (load,))
        time.sleep(args.warmup + 0.5)
        cpu_before, at = _tree_cpu_s(server_pid), time.perf_counter()
        done, window = pending.get()
        cpu = _tree_cpu_s(server_pid) - cpu_before
        cpu_window = time.perf_counter() - at
    rps = done / window
    # The CPU was read over a slightly shorter span than the count: scale it to the window.
    cpu_us = cpu / max(cpu_window, 1e-9) * window / max(done, 1) * 1e6
    return rps, cpu_us


def _ready(http_port: int) -> bool:
    url = f"http://127.0.0.1:{http_port}/v2/models/{MODEL}/ready"
    try:
        with urllib.request.urlopen(url, timeout=2) as reply:
            return bool(reply.status == 200)
    except OSError:
        return False


def start(package: str, python: str, folder: Path) -> tuple[subprocess.Popen[bytes], int, int]:
    http, grpc_port, metrics = free_port(), free_port(), free_port()
    script = folder / f"server_{package.replace('.', '_')}.py"
    script.write_text(SERVER.format(package=package, http=http, grpc=grpc_port, metrics=metrics))
    env = dict(os.environ)
    if package == "pytriton":
        bin_dir = str(Path(python).parent)
        env["PATH"] = f"{bin_dir}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
        env.pop("PYTHONPATH", None)
        env.pop("PYTHONHOME", None)
    else:
        env["PYTHONPATH"] = str(ROOT / "src")
    log = (folder / f"{package}.log").open("wb")
    process = subprocess.Popen(
        [python, str(script)], env=env, stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + 300
    while not _ready(http):
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{package} did not start; see {folder / (package + '.log')}")
        time.sleep(0.2)
    return process, http, grpc_port


def stop(process: subprocess.Popen[bytes]) -> None:
    os.killpg(process.pid, signal.SIGINT)
    try:
        process.wait(60)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pytriton-python", required=True)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    args = parser.parse_args()
    results: dict[tuple[str, str, int], tuple[float, float]] = {}
    with tempfile.TemporaryDirectory(prefix="pytriton-bench-") as tmp:
        for package, python in (
            ("pytriton", args.pytriton_python),
            ("inferd.pytriton", sys.executable),
        ):
            process, http, grpc_port = start(package, python, Path(tmp))
            try:
                for protocol, port in (("http", http), ("grpc", grpc_port)):
                    for conns in (1, 16):
                        results[(package, protocol, conns)] = measure(
                            protocol, port, process.pid, conns, args
                        )
            finally:
                stop(process)
    print("| protocol | clients | PyTriton req/s | inferd req/s | ratio "
          "| PyTriton CPU µs/req | inferd CPU µs/req | ratio |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for protocol in ("http", "grpc"):
        for conns in (1, 16):
            p_rps, p_cpu = results[("pytriton", protocol, conns)]
            i_rps, i_cpu = results[("inferd.pytriton", protocol, conns)]
            print(
                f"| {protocol} | {conns} | {p_rps:,.0f} | {i_rps:,.0f} | {i_rps / p_rps:.2f}x "
                f"| {p_cpu:,.0f} | {i_cpu:,.0f} | {i_cpu / p_cpu:.2f}x |"
            )


if __name__ == "__main__":
    main()
