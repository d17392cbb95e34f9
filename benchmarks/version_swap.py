"""Version swaps under load: closed-loop clients infer, naming no version, while versions swap.

Version N of the model computes ``0.5 * x + N``, so every answer is checked against the version
that gave it. Two ways to swap:

- ``--via poll`` (default): a server in poll mode (1 s) serves a model whose version is replaced
  every --swap-every-s seconds (a new version folder is added, the previous one removed).
  Prints latency percentiles in windows with and without a swap in progress too.
- ``--via upload``: a server in explicit mode whose model's only version is replaced by an
  upload (``PUT /v2/repository/models/swap``: folder 2, then 3, ...) every --swap-every-s
  seconds, each upload started as soon as that time has passed since the last began.

Both print requests, failed requests (an error, or a wrong answer) with the first few, and the
versions seen; ``--workers`` is the server's ``--http-workers`` (default: auto, as ``inferd
serve`` runs). Also times the routing step in-process (Registry.get vs Registry.route with a
split). Usage:

    .venv/bin/python benchmarks/version_swap.py [--clients 4] [--swaps 5] [--swap-every-s 2]
    .venv/bin/python benchmarks/version_swap.py --via upload --clients 8 --swaps 60 \\
        --swap-every-s 0.3
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
import timeit
from collections.abc import Sequence
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from inferd.backends.work import BatchExecutor, Runtime
from inferd.config.spec import build_spec
from inferd.config.text import parse_config_text
from inferd.core.stats import ModelStats
from inferd.core.types import Tensors
from inferd.plane.model import ModelState, ModelVersion
from inferd.plane.registry import ModelRecord, Registry, VersionStatus
from inferd.plane.routing import RoutingPolicy
from inferd.scheduling.batcher import DirectScheduler
from inferd.scheduling.instances import ThreadInstances
from tests.e2e.lifecycle_support import (
    numbered_onnx,
    remove_version,
    right_for_version,
    version_archive,
    write_version,
    x_body,
)
from tests.support import ServerProcess

Entry = tuple[float, float, int, str]  # started, ended, status (0: a wrong answer), version


async def _client(url: str, stop: asyncio.Event, log: list[Entry], failures: list[str]) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        body = x_body([1.0])
        while not stop.is_set():
            started = time.perf_counter()
            r = await client.post("/v2/models/swap/infer", json=body)
            ended = time.perf_counter()
            status = r.status_code
            why = r.text if status != 200 else right_for_version(r)
            log.append((started, ended, 0 if why else status, r.json().get("model_version", "")))
            if why and len(failures) < 5:
                failures.append(f"{status} {why}")


async def _poll_swaps(root: Path, args: argparse.Namespace, log: list[Entry]) -> list[float]:
    """Add version N+1, wait for its first answer, remove version N; the seconds each took."""
    waits: list[float] = []
    for version in range(2, args.swaps + 2):
        written = time.perf_counter()
        write_version(root / "swap", version, numbered_onnx(version))
        while not any(v == str(version) for _, _, _, v in log[-args.clients :]):
            await asyncio.sleep(0.01)
        waits.append(time.perf_counter() - written)
        remove_version(root / "swap", version - 1)
        await asyncio.sleep(args.swap_every_s)
    return waits


async def _upload_swaps(url: str, args: argparse.Namespace) -> list[float]:
    """Upload versions 2, 3, ... one every --swap-every-s; the seconds each upload took."""
    took: list[float] = []
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        for version in range(2, args.swaps + 2):
            body = version_archive(version)
            started = time.perf_counter()
            r = await client.put("/v2/repository/models/swap", content=body)
            took.append(time.perf_counter() - started)
            if r.status_code != 200:
                print(f"upload of version {version}: {r.status_code} {r.text}")
            await asyncio.sleep(max(0.0, args.swap_every_s - took[-1]))
    return took


async def _run(server: ServerProcess, root: Path, args: argparse.Namespace) -> None:
    stop = asyncio.Event()
    log: list[Entry] = []
    failures: list[str] = []
    clients = [
        asyncio.create_task(_client(server.http_url, stop, log, failures))
        for _ in range(args.clients)
    ]
    await asyncio.sleep(args.swap_every_s)
    started = time.perf_counter()
    if args.via == "upload":
        took = await _upload_swaps(server.http_url, args)
    else:
        took = await _poll_swaps(root, args, log)
    ended = time.perf_counter()
    await asyncio.sleep(args.swap_every_s)
    stop.set()
    await asyncio.gather(*clients)

    failed = [entry for entry in log if entry[2] != 200]
    print(
        f"{args.via}, workers {args.workers}, clients {args.clients}, swaps {args.swaps} every "
        f"{args.swap_every_s} s: {len(log)} requests, {len(failed)} failed"
    )
    for line in failures:
        print(f"  e.g. {line[:200]}")
    print(f"versions seen: {sorted({v for *_, v in log if v}, key=int)}")
    duration = log[-1][1] - log[0][0]
    print(f"throughput: {len(log) / duration:.0f} req/s over {duration:.1f} s")

    if args.via == "upload":
        print(
            f"uploads: {len(took)} in {ended - started:.1f} s, each took median "
            f"{statistics.median(took):.2f} s, max {max(took):.2f} s"
        )
        return
    swaps = []  # (folder written, first answer of the new version), as logged
    for i, wait in enumerate(took):
        first = min((e[0] for e in log if e[3] == str(i + 2)), default=ended)
        swaps.append((first - wait, first))

    def in_swap(started: float) -> bool:
        return any(w - 0.05 <= started <= s + 1.0 for w, s in swaps)

    for label, chosen in (
        ("steady", [e for e in log if not in_swap(e[0])]),
        ("around a swap", [e for e in log if in_swap(e[0])]),
    ):
        ms = sorted((end - start) * 1e3 for start, end, _, _ in chosen)
        if len(ms) < 2:
            continue
        cuts = statistics.quantiles(ms, n=100)
        print(
            f"{label:>14}: {len(ms)} requests, p50 {cuts[49]:.2f} ms, p99 {cuts[98]:.2f} ms, "
            f"max {ms[-1]:.2f} ms"
        )
    print(f"folder written -> new version answering: median {statistics.median(took):.2f} s")


def _routing_cost() -> None:
    """Nanoseconds the routing step adds per request, in-process."""
    registry = _registry_with(versions=(1, 2))
    n = 200_000
    get_ns = timeit.timeit(lambda: registry.get("m"), number=n) / n * 1e9
    route_ns = timeit.timeit(lambda: registry.route("m", request_id="r"), number=n) / n * 1e9
    registry.routing("m").set(RoutingPolicy(split=(("1", 90), ("2", 10))))
    split_ns = timeit.timeit(lambda: registry.route("m", request_id="req-123"), number=n) / n * 1e9
    random_ns = timeit.timeit(lambda: registry.route("m"), number=n) / n * 1e9
    print(
        f"in-process: Registry.get {get_ns:.0f} ns; route without a policy {route_ns:.0f} ns; "
        f"with a 90/10 split: by request id {split_ns:.0f} ns, random {random_ns:.0f} ns"
    )


def _registry_with(versions: tuple[int, ...]) -> Registry:
    config = parse_config_text(
        'name: "m" max_batch_size: 8 input [{ name: "x" data_type: TYPE_FP32 dims: [1] }] '
        'output [{ name: "y" data_type: TYPE_FP32 dims: [1] }]'
    )

    class Echo(Runtime):
        inline = False

        def execute(self, inputs: Tensors, output_names: Sequence[str]) -> Tensors:
            return {"y": inputs["x"]}

        def close(self) -> None:
            pass

    loaded = {}
    for v in versions:
        stats = ModelStats()
        pool = ThreadInstances(f"m/{v}", [BatchExecutor(f"m/{v}", Echo())])
        scheduler = DirectScheduler(pool, stats)
        loaded[v] = ModelVersion("m", v, config, build_spec(config), scheduler, stats)
    registry = Registry()
    status = {v: VersionStatus(v, ModelState.READY) for v in versions}
    registry.put(ModelRecord("m", versions=loaded, status=status, state=ModelState.READY))
    return registry


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--swaps", type=int, default=5)
    parser.add_argument("--swap-every-s", type=float, default=2.0)
    parser.add_argument("--via", choices=("poll", "upload"), default="poll")
    parser.add_argument("--workers", default="auto", help="the server's --http-workers")
    args = parser.parse_args()
    _routing_cost()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "models"
        write_version(root / "swap", 1, numbered_onnx(1))
        if args.via == "upload":
            mode = ["--model-control-mode", "explicit", "--load-model", "swap"]
        else:
            mode = ["--model-control-mode", "poll", "--repository-poll-secs", "1"]
        server = ServerProcess(
            root, extra_args=["--allow-grpc=false", "--http-workers", args.workers, *mode]
        ).start()
        try:
            asyncio.run(_run(server, root, args))
        finally:
            server.stop()


if __name__ == "__main__":
    main()
