"""gRPC figures: half_plus_two under load, and resnet50 against onnxruntime in-process.

1. half_plus_two, one row per request, closed loop at --concurrency (default 16): req/s,
   p50/p90/p99, and the CPU cores used by the server and by the client. The client is a
   grpc.aio channel sending pre-serialized ModelInferRequest bytes (raw_input_contents) and
   taking the response bytes as they come, so it costs as little as a gRPC client can;
   --processes spreads it over several processes. With --mlserver, MLServer's gRPC
   (../shared/peers/mlserver, started here, PARALLEL_WORKERS=0) is loaded by the same client in
   the same run, passes alternating, and the ratio of median req/s is printed.
2. resnet50, batch 1, concurrency 1, through tritonclient.grpc with raw contents, against
   onnxruntime in-process on the same input (with its default options, and with the options
   inferd's backend uses), in alternating rounds; the ratios of medians.

    .venv/bin/python benchmarks/grpc_bench.py [--seconds 10] [--passes 2] [--mlserver]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import grpc
import numpy as np
import onnxruntime as ort
import tritonclient.grpc as triton_grpc
from tritonclient.grpc import service_pb2 as pb

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from inferd.demo.models import write_demo_repository  # noqa: E402
from tests.support import ServerProcess  # noqa: E402

INFER = "/inference.GRPCInferenceService/ModelInfer"
PEERS_DIR = Path(os.environ.get("PEERS_DIR", ROOT.parent / "shared" / "peers"))
MLSERVER_DIR = PEERS_DIR / "mlserver"
MLSERVER_ADDRESS = "127.0.0.1:18081"
MLSERVER_PIDFILE = Path("/tmp/peers-logs/mlserver.pid")


@dataclass
class LoadResult:
    latencies_s: list[float]
    window_s: float
    client_cpu_s: float


def half_plus_two_request() -> bytes:
    request = pb.ModelInferRequest(model_name="half_plus_two")
    request.inputs.add(name="x", datatype="FP32", shape=[1, 1])
    request.raw_input_contents.append(np.array([1.0], np.float32).tobytes())
    return request.SerializeToString()


def check_answer(data: bytes) -> None:
    response = pb.ModelInferResponse.FromString(data)
    if response.raw_output_contents:
        y = np.frombuffer(response.raw_output_contents[0], np.float32)
    else:  # typed contents (MLServer answers that way)
        y = np.asarray(response.outputs[0].contents.fp32_contents, np.float32)
    assert y.tolist() == [2.5], y


async def _load(
    address: str, payload: bytes, concurrency: int, warmup_s: float, seconds: float
) -> LoadResult:
    async with grpc.aio.insecure_channel(address) as channel:
        call = channel.unary_unary(INFER)  # bytes in, bytes out: no client-side protobuf work
        check_answer(await call(payload))
        latencies: list[float] = []
        start = time.perf_counter()
        measure_from, stop_at = start + warmup_s, start + warmup_s + seconds
        cpu_at_measure: list[float] = []

        async def worker() -> None:
            while (sent := time.perf_counter()) < stop_at:
                await call(payload)
                if sent >= measure_from:
                    latencies.append(time.perf_counter() - sent)
                elif not cpu_at_measure and time.perf_counter() >= measure_from:
                    cpu_at_measure.append(time.process_time())

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        window = time.perf_counter() - measure_from
        cpu = time.process_time() - (cpu_at_measure[0] if cpu_at_measure else 0.0)
    return LoadResult(latencies, window, cpu)


def _load_process(args: tuple[str, bytes, int, float, float]) -> LoadResult:
    return asyncio.run(_load(*args))


def _tree_cpu_s(pid: int) -> float:
    """CPU seconds of a process and its descendants (children reaped or not)."""
    pids, total = [pid], 0.0
    tick = os.sysconf("SC_CLK_TCK")
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    while pids:
        current = pids.pop()
        pids += children.get(current, [])
        try:
            fields = Path(f"/proc/{current}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += sum(int(f) for f in fields[11:15]) / tick  # utime stime cutime cstime
    return total


def load(label: str, address: str, server_pid: int, args: argparse.Namespace) -> float:
    payload = half_plus_two_request()
    share = [args.concurrency // args.processes] * args.processes
    share[0] += args.concurrency - sum(share)
    jobs = [(address, payload, n, args.warmup, args.seconds) for n in share]
    with multiprocessing.get_context("spawn").Pool(args.processes) as pool:
        pending = pool.map_async(_load_process, jobs)
        time.sleep(args.warmup + 1.0)  # spawn + warm-up: start counting inside the window
        server_cpu = _tree_cpu_s(server_pid)
        results = pending.get()
    server_cpu = _tree_cpu_s(server_pid) - server_cpu
    latencies = sorted(x for r in results for x in r.latencies_s)
    window = max(r.window_s for r in results)
    rps = len(latencies) / window
    p50, p90, p99 = (float(np.percentile(latencies, q)) * 1e3 for q in (50, 90, 99))
    client_cores = sum(r.client_cpu_s for r in results) / window
    print(
        f"| {label} | {args.concurrency} | {rps:,.0f} | {p50:.2f} | {p90:.2f} | {p99:.2f} "
        f"| {server_cpu / (window - 1.0):.2f} | {client_cores:.2f} |",
        flush=True,
    )
    return rps


def start_mlserver() -> tuple[int, bool]:
    """MLServer's pid, and whether this run started it (and so must stop it)."""
    already = MLSERVER_PIDFILE.exists() and _alive(int(MLSERVER_PIDFILE.read_text()))
    if not already:
        env = {**os.environ, "PARALLEL_WORKERS": os.environ.get("PARALLEL_WORKERS", "0")}
        subprocess.run([str(MLSERVER_DIR / "start.sh")], check=True, env=env)
    deadline = time.monotonic() + 90
    with triton_grpc.InferenceServerClient(MLSERVER_ADDRESS) as client:
        while time.monotonic() < deadline:
            try:
                if client.is_model_ready("half_plus_two"):
                    return int(MLSERVER_PIDFILE.read_text()), not already
            except Exception:
                pass
            time.sleep(0.5)
    raise RuntimeError("MLServer did not get ready in 90 s (see /tmp/peers-logs/mlserver.log)")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True


def _matched_session(path: Path) -> ort.InferenceSession:
    """onnxruntime with the options inferd's backend uses (all cores, 1 inter-op, no spinning)."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = len(os.sched_getaffinity(0))
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.add_session_config_entry("session.inter_op.allow_spinning", "0")
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def resnet50(server: ServerProcess, model_dir: Path, args: argparse.Namespace) -> None:
    image = np.random.default_rng(0).standard_normal((1, 3, 224, 224), dtype=np.float32)
    path = model_dir / "model.onnx"
    sessions = {
        "onnxruntime in-process (default options)": ort.InferenceSession(
            str(path), providers=["CPUExecutionProvider"]
        ),
        "onnxruntime in-process (inferd's options)": _matched_session(path),
    }
    reference = next(iter(sessions.values())).run(["output"], {"input": image})[0]
    timings: dict[str, list[float]] = {name: [] for name in sessions}
    remote_name = "inferd gRPC raw contents (tritonclient.grpc), concurrency 1"
    timings[remote_name] = []
    with triton_grpc.InferenceServerClient(server.grpc_address) as client:
        request = triton_grpc.InferInput("input", [1, 3, 224, 224], "FP32")
        request.set_data_from_numpy(image)
        wanted = [triton_grpc.InferRequestedOutput("output")]
        served = client.infer("resnet50", [request], outputs=wanted).as_numpy("output")
        np.testing.assert_allclose(served, reference, rtol=1e-4, atol=1e-4)
        for _ in range(args.resnet_rounds):  # alternating rounds: drift hits every side alike
            for name, session in sessions.items():
                for _ in range(args.resnet_per_round):
                    started = time.perf_counter()
                    session.run(["output"], {"input": image})
                    timings[name].append(time.perf_counter() - started)
            for _ in range(args.resnet_per_round):
                started = time.perf_counter()
                client.infer("resnet50", [request], outputs=wanted)
                timings[remote_name].append(time.perf_counter() - started)

    print("\n| resnet50, batch 1 | calls | p50 ms | p90 ms |")
    print("|---|---|---|---|")
    for name, values in timings.items():
        p50, p90 = (float(np.percentile(values, q)) * 1e3 for q in (50, 90))
        print(f"| {name} | {len(values)} | {p50:.1f} | {p90:.1f} |")
    remote = statistics.median(timings[remote_name])
    for name in sessions:
        ratio = remote / statistics.median(timings[name])
        print(f"ratio of medians inferd gRPC / {name.removeprefix('onnxruntime ')}: {ratio:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=10.0, help="measured seconds per pass")
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--processes", type=int, default=1, help="client processes")
    parser.add_argument("--passes", type=int, default=2)
    parser.add_argument("--mlserver", action="store_true", help="also load MLServer's gRPC")
    parser.add_argument("--resnet-rounds", type=int, default=5)
    parser.add_argument("--resnet-per-round", type=int, default=10)
    args = parser.parse_args()

    root = Path(tempfile.gettempdir()) / "inferd-grpc-bench-models"
    write_demo_repository(root, models=["half_plus_two", "resnet50"])
    server = ServerProcess(root).start()
    stop_mlserver = False
    try:
        mlserver_pid, stop_mlserver = start_mlserver() if args.mlserver else (0, False)
        print(f"cores: {os.cpu_count()}, client processes: {args.processes}\n")
        print(
            "| half_plus_two over gRPC | concurrency | req/s | p50 ms | p90 ms | p99 ms "
            "| server cores | client cores |"
        )
        print("|---|---|---|---|---|---|---|---|")
        ours: list[float] = []
        theirs: list[float] = []
        for _ in range(args.passes):
            ours.append(
                load("inferd", server.grpc_address, server.proc.pid if server.proc else 0, args)
            )
            if args.mlserver:
                theirs.append(load("MLServer 1.7.1", MLSERVER_ADDRESS, mlserver_pid, args))
        if theirs:
            ratio = statistics.median(ours) / statistics.median(theirs)
            print(f"\nratio of median req/s inferd / MLServer: {ratio:.2f}")
        resnet50(server, root / "resnet50" / "1", args)
    finally:
        server.stop()
        if stop_mlserver:
            subprocess.run([str(MLSERVER_DIR / "stop.sh")], check=False)


if __name__ == "__main__":
    main()
