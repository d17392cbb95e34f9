"""Version swaps under load: closed-loop clients on half_plus_two while poll mode swaps versions.

A server in poll mode (1 s) serves a model whose version is replaced every --swap-every-s
seconds (a new version folder is added, the previous one removed). Prints requests, errors,
the versions seen, and latency percentiles in windows with and without a swap in progress.
Also times the routing step in-process (Registry.get vs Registry.route with a split).
Usage:

    .venv/bin/python benchmarks/version_swap.py [--clients 4] [--swaps 5] [--swap-every-s 2]
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
from inferd.config.spec import build_spec
from inferd.config.text import parse_config_text
from inferd.core.model import ModelState, ModelVersion
from inferd.core.registry import ModelRecord, Registry, VersionStatus
from inferd.core.routing import RoutingPolicy
from inferd.core.stats import ModelStats
from inferd.core.types import Tensors
from inferd.scheduling.batcher import DirectScheduler
from inferd.scheduling.instances import InstancePool
from tests.e2e.lifecycle_support import remove_version, write_version, x_body
from tests.support import ServerProcess


async def _client(url: str, stop: asyncio.Event, log: list[tuple[float, float, int, str]]) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        body = x_body([1.0])
        while not stop.is_set():
            started = time.perf_counter()
            r = await client.post("/v2/models/swap/infer", json=body)
            ended = time.perf_counter()
            log.append((started, ended, r.status_code, str(r.json().get("model_version", ""))))


async def _run(server: ServerProcess, root: Path, args: argparse.Namespace) -> None:
    stop = asyncio.Event()
    log: list[tuple[float, float, int, str]] = []
    clients = [
        asyncio.create_task(_client(server.http_url, stop, log)) for _ in range(args.clients)
    ]
    swaps: list[tuple[float, float]] = []  # (folder written, first answer of the new version)
    await asyncio.sleep(args.swap_every_s)
    for version in range(2, args.swaps + 2):
        written = time.perf_counter()
        write_version(root / "swap", version)
        while not any(v == str(version) for _, _, _, v in log[-args.clients :]):
            await asyncio.sleep(0.01)
        switched = time.perf_counter()
        swaps.append((written, switched))
        remove_version(root / "swap", version - 1)
        await asyncio.sleep(args.swap_every_s)
    stop.set()
    await asyncio.gather(*clients)

    errors = [entry for entry in log if entry[2] != 200]
    print(f"clients {args.clients}, swaps {args.swaps}: {len(log)} requests, {len(errors)} errors")
    print(f"versions seen: {sorted({v for *_, v in log}, key=int)}")
    duration = log[-1][1] - log[0][0]
    print(f"throughput: {len(log) / duration:.0f} req/s over {duration:.1f} s")

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
    poll_wait = [s - w for w, s in swaps]
    print(f"folder written -> new version answering: median {statistics.median(poll_wait):.2f} s")


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

    class Echo:
        def execute(self, inputs: Tensors, output_names: Sequence[str]) -> Tensors:
            return {"y": inputs["x"]}

        def close(self) -> None:
            pass

    loaded = {}
    for v in versions:
        stats = ModelStats()
        scheduler = DirectScheduler(InstancePool(f"m/{v}", [Echo()]), stats)
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
    args = parser.parse_args()
    _routing_cost()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "models"
        write_version(root / "swap", 1)
        server = ServerProcess(
            root,
            extra_args=[
                "--allow-grpc=false",
                "--model-control-mode",
                "poll",
                "--repository-poll-secs",
                "1",
            ],
        ).start()
        try:
            asyncio.run(_run(server, root, args))
        finally:
            server.stop()


if __name__ == "__main__":
    main()
