"""Lazy serving with ``--http-workers 2``: one memory budget for the server, the model host's.

First requests at either worker cause one load; eviction spares models with forwarded requests
in flight and pinned models; the index, the metrics and the dashboard show the host's residency
whichever worker answers; and the server's process tree stays within the budget and a bounded
overhead while models are loaded and evicted under it.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest

from inferd.repository.memory import tree_rss_bytes
from inferd.workers.peers import Peers, WorkerRole
from tests.e2e.many_models_support import (
    BROKEN,
    body,
    metric,
    residency,
    table_row,
    write_echo,
    write_table,
)
from tests.support import ServerProcess, wait_for

GATED = ("held1", "held2", "held3")  # executions wait for the file gates/<name>


@pytest.fixture(scope="module")
def workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """Two serving processes, one budget of 2 models: the host's."""
    top = tmp_path_factory.mktemp("lazy_workers")
    root, gates = top / "models", top / "gates"
    gates.mkdir()
    for name in ("a", "b", "c"):
        write_echo(root, name)
    for name in GATED:
        gate = f'parameters [{{ key: "gate_file" value: {{ string_value: "{gates / name}" }} }}]'
        write_echo(root, name, gate)
    write_echo(root, "broken", BROKEN)
    server = ServerProcess(root, extra_args=["--http-workers", "2", "--max-loaded-models", "2"])
    server.start()
    yield server
    for name in GATED:  # free whatever a failed test left waiting
        (gates / name).touch()
    server.stop()


def _open(server: ServerProcess, name: str) -> None:
    (server.repository.parent / "gates" / name).touch()


def _fresh(url: str, model: str, value: float = 1.0) -> httpx.Response:
    """A request on a connection of its own: the kernel picks the worker per connection."""
    with httpx.Client(timeout=60) as client:
        return client.post(f"{url}/v2/models/{model}/infer", json=body(value))


def _ask(server: ServerProcess, index: int, message: dict[str, Any]) -> Any:
    """One worker's own answer, over the workers' socket (not the server's totals)."""
    found = re.search(r"run folder (\S+)\)", server.log())
    assert found, server.log()
    return asyncio.run(Peers(WorkerRole(index, 2, Path(found.group(1)))).ask(index, message, 10))


def _misses(server: ServerProcess) -> list[int]:
    """The misses each worker counted for the requests it received."""
    return [int(_ask(server, i, {"op": "demand_counts"})[1]) for i in (0, 1)]


def _loaded(views: dict[str, dict[str, Any]]) -> set[str]:
    return {name for name, view in views.items() if view["state"] == "loaded"}


def test_first_requests_at_both_workers_cause_one_load(workers: ServerProcess) -> None:
    url = workers.http_url
    with ThreadPoolExecutor(64) as pool:
        # The budget is held by two models with a request in flight each: every first request
        # for 'a', whichever worker received it, waits for room, then for the one load.
        held = [pool.submit(_fresh, url, name) for name in ("held1", "held2")]
        wait_for(
            lambda: [residency(workers)[n]["in_flight"] for n in ("held1", "held2")] == [1, 1],
            "two busy models to fill the budget",
        )
        loads, misses = metric(workers, "inferd_residency_loads_total"), _misses(workers)
        firsts = [pool.submit(_fresh, url, "a", float(i)) for i in range(48)]
        wait_for(
            lambda: all(now > then for now, then in zip(_misses(workers), misses, strict=True)),
            "first requests for 'a' waiting at both workers",
        )
        views = residency(workers)
        assert views["a"]["state"] == "loading" and _loaded(views) == {"held1", "held2"}
        _open(workers, "held2")
        answers = [f.result() for f in firsts]
        assert [r.status_code for r in answers] == [200] * 48
        assert sorted(r.json()["outputs"][0]["data"][0] for r in answers) == list(range(48))
        assert metric(workers, "inferd_residency_loads_total") == loads + 1
        # 'held2' was evicted once idle; 'held1', busy all along, stayed.
        views = residency(workers)
        assert _loaded(views) == {"held1", "a"} and views["held2"]["state"] == "evicted"
        _open(workers, "held1")
        assert [f.result().status_code for f in held] == [200, 200]


def test_eviction_spares_a_model_with_forwarded_requests_in_flight(
    workers: ServerProcess,
) -> None:
    url = workers.http_url
    with ThreadPoolExecutor(16) as pool:
        held = [pool.submit(_fresh, url, "held3", float(i)) for i in range(16)]
        # Counted by the host, those the frontend forwarded too (odds of none: 2**-16).
        wait_for(lambda: residency(workers)["held3"]["in_flight"] == 16, "16 requests running")
        evictions = metric(workers, "inferd_residency_evictions_total")
        for name in ("b", "c", "a", "b"):
            assert _fresh(url, name).status_code == 200
            views = residency(workers)
            assert _loaded(views) == {"held3", name}  # never more than the budget
        # c, a and b each evict the one before; b evicts a fourth only if an earlier test left
        # another model loaded beside held3.
        assert metric(workers, "inferd_residency_evictions_total") >= evictions + 3
        _open(workers, "held3")
        answers = [f.result() for f in held]
    assert sorted(r.json()["outputs"][0]["data"][0] for r in answers) == list(range(16))
    own = _ask(workers, 1, {"op": "statistics", "name": "held3", "version": ""})
    assert own[0]["inference_stats"]["success"]["count"] > 0  # some went through the frontend


def test_a_model_evicted_under_a_frontend_loads_again(workers: ServerProcess) -> None:
    url = workers.http_url
    for name in ("a", "c"):  # loaded: 'a', then 'c' (the budget's two; 'a' is the older)
        assert _fresh(url, name).status_code == 200
    loads = metric(workers, "inferd_residency_loads_total")
    with ThreadPoolExecutor(8) as pool:
        for round_ in range(8):
            # One request loads the next model, evicting the least recently used of the other
            # two (a budget of 2); the evicted one is asked for at once. When the host received
            # that one request, a frontend hears of the eviction only with the host's next
            # table: it routes to the model, the host says it is gone, and it is loaded again.
            first, evicted = ("b", "c", "a")[round_ % 3], ("a", "b", "c")[round_ % 3]
            assert _fresh(url, first).status_code == 200
            answers = list(pool.map(partial(_fresh, url, evicted), [float(i) for i in range(8)]))
            assert [r.status_code for r in answers] == [200] * 8, [r.text for r in answers]
            assert [r.json()["outputs"][0]["data"][0] for r in answers] == list(range(8))
    views = residency(workers)
    assert len(_loaded(views)) == 2 and metric(workers, "inferd_residency_models") == 2
    assert metric(workers, "inferd_residency_loads_total") >= loads + 16


def test_a_failing_model_answers_503_with_its_reason_at_either_worker(
    workers: ServerProcess,
) -> None:
    def refused(worker: int) -> float:
        text = str(_ask(workers, worker, {"op": "metrics"}))
        refusals = r'^inferd_endpoint_requests_total\{[^}]*status="503"[^}]*\} (\S+)$'
        return sum(float(value) for value in re.findall(refusals, text, re.M))

    before = [refused(0), refused(1)]
    for _ in range(16):
        answer = _fresh(workers.http_url, "broken")
        assert answer.status_code == 503
        assert "could not be loaded on demand" in answer.json()["error"]
        assert "die_by" in answer.json()["error"]
    assert all(refused(i) > before[i] for i in (0, 1))  # odds of one worker only: 2**-15
    assert residency(workers)["broken"]["state"] == "failed"
    ready = {
        httpx.get(f"{workers.http_url}/v2/models/broken/ready", timeout=60).status_code
        for _ in range(8)
    }
    assert 200 not in ready  # its failure is known at every worker


def test_the_index_and_metrics_show_one_budget(workers: ServerProcess) -> None:
    assert _fresh(workers.http_url, "a").status_code == 200  # at least one model resident
    loads = metric(workers, "inferd_residency_loads_total")
    for _ in range(8):  # metadata from the config, at either worker, loads nothing
        meta = httpx.get(f"{workers.http_url}/v2/models/c", timeout=60).json()
        assert meta["inputs"] == [{"name": "INPUT0", "datatype": "FP32", "shape": [-1, 2]}]
    assert metric(workers, "inferd_residency_loads_total") == loads
    assert metric(workers, "inferd_workers") == 2
    assert metric(workers, "inferd_residency_max_models") == 2  # not one per worker
    resident = metric(workers, "inferd_residency_models")
    assert 1 <= resident <= 2
    views = [residency(workers) for _ in range(8)]  # whichever worker answers
    indexes = [_loaded(found) for found in views]
    assert all(found == indexes[0] for found in indexes) and len(indexes[0]) == resident
    held = sum(views[0][name]["memory_bytes"] for name in indexes[0])  # each measured at its load
    assert held > 0 and metric(workers, "inferd_residency_bytes") == held
    dashboard = httpx.get(f"{workers.http_url}/v2/dashboard/models", timeout=60).json()
    totals = dashboard["server"]["residency"]
    assert (totals["max_models"], totals["models"]) == (2, resident)
    # Hits and misses are the server's: every worker's requests.
    hits = metric(workers, "inferd_residency_hits_total")
    assert (totals["hits"], totals["misses"]) == (
        hits,
        metric(workers, "inferd_residency_misses_total"),
    )


# ---------------------------------------------------------------------- a budget in bytes

BUDGET_MIB = 64
OVERHEAD_MIB = 48  # what the tree may grow beyond the budget: runtimes' arenas, warm frontends
TABLES = [f"t{i}" for i in range(8)]  # 16 MiB each: twice the budget together


def test_the_server_tree_stays_within_the_budget_and_the_pinned_model_stays(
    tmp_path: Path,
) -> None:
    root = tmp_path / "models"
    write_table(root, "pinned", 8, 100.0)
    for i, name in enumerate(TABLES):
        write_table(root, name, 16, float(i))
    args = ["--http-workers", "2", "--model-memory-budget", f"{BUDGET_MIB}Mi"]
    server = ServerProcess(root, extra_args=[*args, "--pin-model", "pinned"]).start()
    try:
        assert server.proc is not None
        assert residency(server)["pinned"]["state"] == "loaded"  # loaded at start
        idle = tree_rss_bytes(server.proc.pid)
        grown: list[int] = []
        for name in TABLES + TABLES:  # each loaded twice, evicted in between
            for model, value in ((name, float(TABLES.index(name))), ("pinned", 100.0)):
                answer = table_row(server.http_url, model)
                assert answer.status_code == 200, answer.text
                assert answer.json()["outputs"][0]["data"][0] == value
            views = residency(server)
            assert views["pinned"]["state"] == "loaded" and views["pinned"]["pinned"]
            assert metric(server, "inferd_residency_bytes") <= BUDGET_MIB << 20
            grown.append(tree_rss_bytes(server.proc.pid) - idle)
        assert max(grown) <= (BUDGET_MIB + OVERHEAD_MIB) << 20, [g >> 20 for g in grown]
        views = residency(server)
        assert views["pinned"]["loads"] <= 1 and views["pinned"]["evicted_at"] is None
        assert metric(server, "inferd_residency_evictions_total") >= len(TABLES)
        assert metric(server, "inferd_residency_loads_total") >= 2 * len(TABLES)
        assert {v["state"] for n, v in views.items() if n != "pinned"} <= {"loaded", "evicted"}
    finally:
        server.stop()
