"""Process instances with the echo backend: addressed, least busy first, cancelled work skipped,
tensors through shared memory, crashed workers failing only their own work and restarted."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from inferd.backends import get_backend
from inferd.backends.base import InstancePlacement
from inferd.backends.process import ProcessRecipe
from inferd.backends.work import CANCELLED, Executed, InstanceFailed, Work
from inferd.config.text import parse_config_text
from inferd.core.errors import ModelLoadError
from inferd.core.stats import ModelStats
from inferd.core.types import Timings
from inferd.scheduling.batcher import DynamicBatcher
from inferd.scheduling.policy import BatchingOptions
from inferd.scheduling.processes import ProcessInstances
from inferd.scheduling.recipe import backend_recipe
from inferd.scheduling.shm import Arenas
from tests.echo_support import ok


def _recipes(name: str, count: int, extra: str = "", dims: str = "[1]") -> list[ProcessRecipe]:
    config = parse_config_text(
        f'name: "{name}" backend: "echo" max_batch_size: 8\n'
        f'input [{{ name: "INPUT0" data_type: TYPE_FP32 dims: {dims} }}]\n'
        f'output [{{ name: "OUTPUT0" data_type: TYPE_FP32 dims: {dims} }}]\n' + extra
    )
    return [
        backend_recipe(
            get_backend("echo"), Path("."), config, InstancePlacement("CPU", 0, count, i), name
        )
        for i in range(count)
    ]


def _params(**values: object) -> str:
    return "".join(
        f'parameters {{ key: "{k}" value: {{ string_value: "{v}" }} }}\n' for k, v in values.items()
    )


def _work(value: float, id: str = "") -> Work:
    return Work({"INPUT0": np.array([[value]], np.float32)}, 1, ("OUTPUT0",), id)


def _log(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture
def closing() -> Iterator[list[ProcessInstances]]:
    """Pools to close at the end, even when a test fails."""
    pools: list[ProcessInstances] = []
    yield pools
    for pool in pools:
        asyncio.run(pool.close())


def test_work_addressed_to_an_instance_runs_in_its_process(
    tmp_path: Path, closing: list[ProcessInstances]
) -> None:
    log = tmp_path / "log"
    pool = ProcessInstances(
        "addressed", _recipes("addressed", 3, _params(log_file=log, request_level="true"))
    )
    closing.append(pool)

    async def run() -> None:
        for instance in (2, 0, 1, 2):
            executed = await pool.submit([_work(instance, f"r{instance}")], instance)
            assert ok(executed.results[0])["OUTPUT0"].tolist() == [[instance]]

    asyncio.run(run())
    entries = _log(log)
    assert [e["instance"] for e in entries] == [2, 0, 1, 2]
    assert [e["request_ids"] for e in entries] == [["r2"], ["r0"], ["r1"], ["r2"]]
    pids = pool.pids()
    assert [e["pid"] for e in entries] == [pids[2], pids[0], pids[1], pids[2]]
    assert len(set(pids)) == 3 and os.getpid() not in pids


def test_unaddressed_work_goes_to_the_least_busy_worker(
    tmp_path: Path, closing: list[ProcessInstances]
) -> None:
    log, gate = tmp_path / "log", tmp_path / "gate"
    pool = ProcessInstances("spread", _recipes("spread", 2, _params(log_file=log, gate_file=gate)))
    closing.append(pool)

    async def run() -> list[Executed]:
        futures = [pool.submit([_work(i, f"r{i}")]) for i in range(4)]
        await asyncio.sleep(0.05)
        gate.touch()
        return list(await asyncio.gather(*futures))

    results = asyncio.run(run())
    assert [ok(r.results[0])["OUTPUT0"].item() for r in results] == [0, 1, 2, 3]
    assert sorted(e["instance"] for e in _log(log)) == [0, 0, 1, 1]


def test_work_cancelled_while_queued_never_runs(
    tmp_path: Path, closing: list[ProcessInstances]
) -> None:
    log, gate = tmp_path / "log", tmp_path / "gate"
    pool = ProcessInstances(
        "cancel", _recipes("cancel", 1, _params(log_file=log, gate_file=gate, request_level="true"))
    )
    closing.append(pool)

    async def run() -> None:
        running = pool.submit([_work(1, "kept")])
        sent = pool.submit([_work(2, "sent")])  # already in the worker, behind the first
        queued = pool.submit([_work(3, "queued")])  # still in the server
        await asyncio.sleep(0.02)
        sent.cancel()
        queued.cancel()
        flagged = _work(4, "flagged")
        later = pool.submit([flagged, _work(5, "later")])
        flagged.cancelled = True  # its caller left (the batcher sets this)
        await asyncio.sleep(0.02)  # the cancel reaches the worker
        gate.touch()
        assert ok((await running).results[0])["OUTPUT0"].item() == 1
        executed = await later
        assert executed.results[0] is CANCELLED
        assert ok(executed.results[1])["OUTPUT0"].item() == 5

    asyncio.run(run())
    assert [e["request_ids"] for e in _log(log)] == [["kept"], ["later"]]


def test_a_large_tensor_crosses_through_shared_memory(closing: list[ProcessInstances]) -> None:
    pool = ProcessInstances("large", _recipes("large", 1, dims="[-1]"))
    closing.append(pool)
    rng = np.random.default_rng(0)
    big = rng.standard_normal((2, 2_000_000), dtype=np.float32)  # 16 MB

    async def run() -> None:
        for _ in range(3):
            executed = await pool.submit([Work({"INPUT0": big}, 2, ("OUTPUT0",))])
            out = ok(executed.results[0])["OUTPUT0"]
            assert out.shape == big.shape and np.array_equal(out, big)
            # Read in place: the array's memory is the worker's arena, not a copy.
            assert type(out.base).__name__ == "Block"
            del out, executed

    asyncio.run(run())


def test_a_large_batch_is_copied_into_shared_memory_off_the_event_loop(
    closing: list[ProcessInstances], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A large copy on the loop held every other request of the process; the batches still go
    # out in order, and a small one is copied on the loop (no thread hop per request).
    pool = ProcessInstances("copied", _recipes("copied", 1, dims="[-1]"))
    closing.append(pool)
    copied_on: list[tuple[int, bool]] = []
    real_put = Arenas.put

    def put(arenas: Arenas, array: np.ndarray) -> Any:
        copied_on.append((array.size, threading.current_thread() is threading.main_thread()))
        return real_put(arenas, array)

    monkeypatch.setattr(Arenas, "put", put)
    big = np.arange(2 * 1_500_000, dtype=np.float32).reshape(2, -1)  # 12 MB
    small = np.arange(2 * 10_000, dtype=np.float32).reshape(2, -1)  # 80 KB: an arena too

    async def run() -> list[float]:
        sent = [
            pool.submit([Work({"INPUT0": a}, 2, ("OUTPUT0",))]) for a in (big, small, big, small)
        ]
        executed = await asyncio.gather(*sent)
        return [float(ok(e.results[0])["OUTPUT0"][1, -1]) for e in executed]

    assert asyncio.run(run()) == [float(big[1, -1]), float(small[1, -1])] * 2
    assert copied_on == [(big.size, False), (small.size, True)] * 2


def test_bytes_tensors_keep_any_bytes(closing: list[ProcessInstances]) -> None:
    config = _params(request_level="true")
    name = "bytes"
    recipes = [
        backend_recipe(
            get_backend("echo"),
            Path("."),
            parse_config_text(
                f'name: "{name}" backend: "echo" max_batch_size: 0\n'
                'input [{ name: "INPUT0" data_type: TYPE_STRING dims: [3] }]\n'
                'output [{ name: "OUTPUT0" data_type: TYPE_STRING dims: [3] }]\n' + config
            ),
            InstancePlacement("CPU", 0, 1, 0),
            name,
        )
    ]
    pool = ProcessInstances(name, recipes)
    closing.append(pool)
    values = np.array([b"a\x00b", bytes(range(256)) * 100, b"\xff\xfe"], dtype=object)

    async def run() -> list[bytes]:
        executed = await pool.submit([Work({"INPUT0": values}, 0, ("OUTPUT0",))])
        out: list[bytes] = ok(executed.results[0])["OUTPUT0"].tolist()
        return out

    assert asyncio.run(run()) == values.tolist()


@pytest.mark.parametrize("how", ["segfault", "kill", "exit"])
def test_a_dead_worker_fails_only_its_work_and_is_restarted(
    how: str, tmp_path: Path, closing: list[ProcessInstances]
) -> None:
    log = tmp_path / "log"
    pool = ProcessInstances(
        "dies", _recipes("dies", 2, _params(log_file=log, die_every=2, die_by=how))
    )
    closing.append(pool)
    before = pool.pids()

    async def run() -> None:
        assert ok((await pool.submit([_work(1)], 0)).results[0])["OUTPUT0"].item() == 1
        with pytest.raises(InstanceFailed) as failed:
            await pool.submit([_work(2)], 0)
        assert "model 'dies'" in failed.value.message
        assert "instance 0" in failed.value.message
        expected = {"segfault": "SIGSEGV", "kill": "SIGKILL", "exit": "exited with code 7"}[how]
        assert expected in failed.value.message
        # The other instance never noticed; the dead one serves again once restarted.
        assert ok((await pool.submit([_work(3)], 1)).results[0])["OUTPUT0"].item() == 3
        assert ok((await pool.submit([_work(4)], 0)).results[0])["OUTPUT0"].item() == 4

    asyncio.run(run())
    after = pool.pids()
    assert pool.restarts == 1
    assert after[1] == before[1] and after[0] not in (None, before[0])


def test_an_executor_that_breaks_is_rebuilt_in_a_fresh_process(
    closing: list[ProcessInstances],
) -> None:
    pool = ProcessInstances("crashy", _recipes("crashy", 1, _params(crash_every=2)))
    closing.append(pool)

    async def run() -> None:
        assert ok((await pool.submit([_work(1)], 0)).results[0])["OUTPUT0"].item() == 1
        with pytest.raises(InstanceFailed, match="crashed \\(execution 2\\)"):
            await pool.submit([_work(2)], 0)
        assert ok((await pool.submit([_work(3)], 0)).results[0])["OUTPUT0"].item() == 3

    asyncio.run(run())
    assert pool.restarts == 1


def test_a_worker_killed_while_idle_is_replaced_before_the_next_request(
    closing: list[ProcessInstances],
) -> None:
    pool = ProcessInstances("idle", _recipes("idle", 1))
    closing.append(pool)

    async def run() -> None:
        assert ok((await pool.submit([_work(1)])).results[0])["OUTPUT0"].item() == 1
        pid = pool.pids()[0]
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while pool.pids()[0] in (None, pid) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert ok((await pool.submit([_work(2)])).results[0])["OUTPUT0"].item() == 2

    asyncio.run(run())
    assert pool.restarts == 1


def test_a_worker_that_cannot_start_is_a_load_error() -> None:
    with pytest.raises(ModelLoadError, match="parameter delay_ms must be an integer"):
        ProcessInstances("bad", _recipes("bad", 2, _params(delay_ms="soon")))


def test_warmup_runs_in_the_worker(closing: list[ProcessInstances]) -> None:
    pool = ProcessInstances("warm", _recipes("warm", 2))
    closing.append(pool)
    executed = pool.run_blocking(1, [_work(7)])
    assert ok(executed.results[0])["OUTPUT0"].item() == 7


def test_close_waits_for_work_in_flight(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    pool = ProcessInstances("drain", _recipes("drain", 1, _params(gate_file=gate)))

    async def run() -> None:
        futures = [pool.submit([_work(i)]) for i in range(3)]
        closing = asyncio.ensure_future(pool.close())
        await asyncio.sleep(0.05)
        assert not closing.done()
        gate.touch()
        await closing
        assert [ok(f.result().results[0])["OUTPUT0"].item() for f in futures] == [0, 1, 2]

    asyncio.run(run())
    assert pool.pids() == [None]


def test_close_during_a_restart_serves_what_was_queued(tmp_path: Path) -> None:
    pool = ProcessInstances("reborn", _recipes("reborn", 1, _params(die_every=2, die_by="kill")))

    async def run() -> None:
        assert ok((await pool.submit([_work(1)])).results[0])["OUTPUT0"].item() == 1
        dying = pool.submit([_work(2)])
        queued = [pool.submit([_work(v)]) for v in (3, 4)]  # behind the one that kills it
        with pytest.raises(InstanceFailed, match="SIGKILL"):
            await dying
        await pool.close()  # while the worker restarts: the queue is served first
        # Job 3 was already in the worker (it holds two jobs) and failed with it; job 4 waited
        # in the server and ran on the new worker.
        assert isinstance(queued[0].exception(), InstanceFailed)
        assert ok(queued[1].result().results[0])["OUTPUT0"].item() == 4

    asyncio.run(run())
    assert pool.pids() == [None]


def test_jobs_waiting_for_a_busy_worker_are_handed_over_together(
    tmp_path: Path, closing: list[ProcessInstances]
) -> None:
    """Two jobs go to an idle worker at once; those submitted while it holds them wait here and
    go, several in one message, as soon as it holds only the one it runs: eight jobs in four
    messages, each answered with its own input."""
    log, gate = tmp_path / "log", tmp_path / "gate"
    pool = ProcessInstances(
        "handover",
        _recipes("handover", 1, _params(log_file=log, gate_file=gate, request_level="true")),
    )
    closing.append(pool)

    async def run() -> list[Executed]:
        futures = [pool.submit([_work(i, f"r{i}")]) for i in range(8)]
        await asyncio.sleep(0.02)
        gate.touch()
        return list(await asyncio.gather(*futures))

    results = asyncio.run(run())
    assert [ok(r.results[0])["OUTPUT0"].item() for r in results] == list(range(8))
    entries = _log(log)
    assert [e["request_ids"] for e in entries] == [[f"r{i}"] for i in range(8)]
    # r0 and r1 one message each; r2-r4 in one when r0 is done; r5-r7 in one when r3 is done
    handovers = [e["handovers"] for e in entries]
    assert handovers == sorted(handovers) and handovers[-1] == 4


def test_a_full_batch_reaches_a_busy_worker_ahead_of_the_one_it_runs(
    tmp_path: Path, closing: list[ProcessInstances]
) -> None:
    """TorchServe's batching (batchSize 8, maxBatchDelay 10 ms, one worker) at a steady 16
    requests: while the worker runs one batch of 8, the next 8 form a batch that is handed to
    the worker at once, so it starts without a round trip through the server; each runs full."""
    log, gate = tmp_path / "log", tmp_path / "gate"
    extra = "dynamic_batching { max_queue_delay_microseconds: 10000 }\n"
    recipes = _recipes(
        "ahead", 1, extra + _params(log_file=log, gate_file=gate, request_level="true")
    )
    pool = ProcessInstances("ahead", recipes)
    closing.append(pool)
    options = BatchingOptions.from_config(
        parse_config_text(f'name: "ahead" backend: "echo" max_batch_size: 8\n{extra}')
    )
    stats = ModelStats()
    batcher = DynamicBatcher("ahead", pool, options, stats)
    worker = pool._workers[0]

    async def run() -> tuple[int, list[Any]]:
        answers = [
            asyncio.ensure_future(batcher.run(_work(i, f"r{i}"), Timings())) for i in range(16)
        ]
        deadline = time.monotonic() + 60
        while len(worker.sent) < 2 and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        held = len(worker.sent)  # both batches are in the worker while the first is gated
        gate.touch()
        return held, list(await asyncio.gather(*answers))

    held, answers = asyncio.run(run())
    assert held == 2
    assert [a["OUTPUT0"].item() for a in answers] == list(range(16))
    assert [e["request_ids"] for e in _log(log)] == [
        [f"r{i}" for i in range(8)],
        [f"r{i}" for i in range(8, 16)],
    ]
    assert stats.execution_count == 2 and stats.inference_count == 16
