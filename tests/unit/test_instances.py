"""Thread instances: addressable, least busy first, restarted after a crash, inline when fast."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

from inferd.backends import echo
from inferd.backends.echo import EchoExecutor, EchoRuntime
from inferd.backends.work import BatchExecutor, Executor, InstanceFailed, Work
from inferd.config.text import parse_config_text
from inferd.core.errors import InferdError
from inferd.scheduling import instances
from inferd.scheduling.instances import ThreadInstances
from tests.echo_support import ok


def _config(name: str, extra: str = "") -> str:
    return (
        f'name: "{name}" backend: "echo" max_batch_size: 8\n'
        'input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [1] }]\n'
        'output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [1] }]\n' + extra
    )


def _pool(name: str, count: int, extra: str = "") -> ThreadInstances:
    config = parse_config_text(_config(name, extra))
    echo.reset(name)

    def build(i: int) -> Executor:
        return BatchExecutor(name, EchoRuntime(config, i))

    return ThreadInstances(name, [build(i) for i in range(count)], build)


def _work(value: float, id: str = "") -> Work:
    return Work({"INPUT0": np.array([[value]], np.float32)}, 1, ("OUTPUT0",), id)


def _gate(name: str) -> threading.Event:
    echo.GATES.pop(name, None)
    return echo.gate(name)


def test_work_addressed_to_an_instance_runs_there() -> None:
    async def run() -> None:
        pool = _pool("addressed", 3)
        for instance in (2, 0, 1, 2):
            executed = await pool.submit([_work(instance, f"r{instance}")], instance)
            assert ok(executed.results[0])["OUTPUT0"].tolist() == [[instance]]
        await pool.close()

    asyncio.run(run())
    assert [e.instance for e in echo.LOG["addressed"]] == [2, 0, 1, 2]


def test_unaddressed_work_goes_to_the_least_busy_instance() -> None:
    gate = _gate("busy")

    async def run() -> None:
        pool = _pool("spread", 2, 'parameters { key: "gate" value: { string_value: "busy" } }')
        futures = [pool.submit([_work(i)]) for i in range(4)]
        await asyncio.sleep(0.05)
        gate.set()
        results = await asyncio.gather(*futures)
        assert [ok(r.results[0])["OUTPUT0"].item() for r in results] == [0, 1, 2, 3]
        await pool.close()

    asyncio.run(run())
    assert sorted(e.instance for e in echo.LOG["spread"]) == [0, 0, 1, 1]


def test_a_crashed_instance_fails_its_batch_and_is_rebuilt() -> None:
    async def run() -> None:
        pool = _pool("crashy", 1, 'parameters { key: "crash_every" value: { string_value: "2" } }')
        first = await pool.submit([_work(1)], 0)
        assert ok(first.results[0])["OUTPUT0"].item() == 1
        try:
            await pool.submit([_work(2)], 0)
        except InstanceFailed as exc:
            assert "crashed (execution 2)" in exc.message
        else:
            raise AssertionError("the crash was not reported")
        assert pool.restarts == 1
        third = await pool.submit([_work(3)], 0)
        assert ok(third.results[0])["OUTPUT0"].item() == 3
        await pool.close()

    asyncio.run(run())


def test_work_cancelled_while_queued_never_runs() -> None:
    gate = _gate("held")

    async def run() -> None:
        pool = _pool("cancel", 1, 'parameters { key: "gate" value: { string_value: "held" } }')
        running = pool.submit([_work(1, "kept")])
        queued = pool.submit([_work(2, "dropped")])
        await asyncio.sleep(0.02)
        queued.cancel()
        gate.set()
        assert ok((await running).results[0])["OUTPUT0"].item() == 1
        await pool.close()

    asyncio.run(run())
    assert len(echo.LOG["cancel"]) == 1  # the dropped one never executed


def test_a_fast_model_moves_inline_and_a_slow_one_stays_on_its_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A threshold between the two models' costs with room for a slow host (and coverage
    # tracing): the echo call takes tens of microseconds, the slow one over 1 ms.
    monkeypatch.setattr(instances, "INLINE_BELOW_S", 500e-6)
    monkeypatch.setattr(instances, "INLINE_BELOW_NS", 500_000)

    async def run(name: str, extra: str) -> bool:
        pool = _pool(name, 1, extra)
        inline = False
        for i in range(60):
            future = pool.submit([_work(i)])
            inline = future.done()  # answered before the loop ran again: inline
            await future
        await pool.close()
        return inline

    assert asyncio.run(run("fast", "")) is True
    slow = 'parameters { key: "delay_ms" value: { string_value: "1" } }'
    assert asyncio.run(run("slow", slow)) is False
    threads = {t.name for t in threading.enumerate()}
    assert not any(n.startswith("inferd-fast") for n in threads)  # closed


def test_try_inline_answers_at_once_only_when_the_pool_would_run_inline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # No slow model here: a threshold no echo call reaches, however loaded the host.
    monkeypatch.setattr(instances, "INLINE_BELOW_S", 1.0)
    monkeypatch.setattr(instances, "INLINE_BELOW_NS", 10**9)

    async def run() -> None:
        pool = _pool("try", 1)
        assert pool.try_inline(_work(1.0)) is None  # nothing measured yet: the thread first
        for i in range(20):
            executed = pool.try_inline(_work(i))
            if executed is None:
                await pool.submit([_work(i)])
        executed = pool.try_inline(_work(7.0, "now"))
        assert executed is not None and ok(executed.results[0])["OUTPUT0"].tolist() == [[7.0]]
        # A batch addressed to an instance always goes to its thread; until its answer is
        # delivered on the loop the pool is busy, and nothing runs inline.
        held = pool.submit([_work(2.0)], 0)
        assert pool.try_inline(_work(3.0)) is None
        assert ok((await held).results[0])["OUTPUT0"].tolist() == [[2.0]]
        again = pool.try_inline(_work(4.0))  # idle again: inline again
        assert again is not None and ok(again.results[0])["OUTPUT0"].tolist() == [[4.0]]
        await pool.close()
        assert pool.try_inline(_work(5.0)) is None  # closed: ``submit`` says why

    asyncio.run(run())


def test_a_request_level_executor_sees_each_request() -> None:
    config = parse_config_text(_config("levels", ""))
    echo.reset("levels")

    async def run() -> None:
        executor = EchoExecutor(config, 0)
        pool = ThreadInstances("levels", [executor])
        batch = [_work(1, "a"), _work(2, "b")]
        batch[1].parameters["k"] = "v"
        executed = await pool.submit(batch)
        assert [r["OUTPUT0"].item() for r in executed.results if not isinstance(r, InferdError)]
        await pool.close()
        assert executor.closed

    asyncio.run(run())
    (execution,) = echo.LOG["levels"]
    assert execution.request_ids == ("a", "b") and execution.rows == 2
    assert execution.parameters == ({}, {"k": "v"})


def test_a_claim_holds_an_idle_instance_off_the_loop_and_closing_waits_for_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # No slow model here: a threshold no echo call reaches, however loaded the host.
    monkeypatch.setattr(instances, "INLINE_BELOW_S", 1.0)
    monkeypatch.setattr(instances, "INLINE_BELOW_NS", 10**9)

    async def run() -> None:
        pool = _pool("claimed", 2)
        for i in range(20):  # measured fast: it would run inline now
            await pool.submit([_work(i)])
        assert (pool.claim(), pool.claim(), pool.claim()) == (0, 1, None)  # both held
        executed = pool.execute_claimed(1, [_work(6.0, "here")])
        assert ok(executed.results[0])["OUTPUT0"].tolist() == [[6.0]]
        # Instance 0 is claimed: the loop does not run it inline but queues for its worker,
        # which waits for the claim.
        queued = pool.submit([_work(8.0, "queued")], None)
        assert not queued.done()
        pool.release(0)
        assert ok((await queued).results[0])["OUTPUT0"].tolist() == [[8.0]]
        closing = asyncio.ensure_future(pool.close())
        await asyncio.sleep(0.05)
        assert not closing.done()  # instance 1 is still claimed
        assert pool.claim() is None  # closing: nothing more is claimed
        pool.release(1)
        await closing

    asyncio.run(run())
    assert [e.instance for e in echo.LOG["claimed"][-2:]] == [1, 0]


def test_a_claimed_instance_that_crashes_fails_its_request_and_is_rebuilt() -> None:
    async def run() -> None:
        pool = _pool(
            "crash-claimed", 1, 'parameters { key: "crash_every" value: { string_value: "2" } }'
        )
        for value, fails in ((1.0, False), (2.0, True), (3.0, False)):
            instance = pool.claim()
            assert instance == 0
            try:
                if fails:
                    with pytest.raises(InstanceFailed, match=r"crashed \(execution 2\)"):
                        pool.execute_claimed(instance, [_work(value)])
                else:
                    executed = pool.execute_claimed(instance, [_work(value)])
                    assert ok(executed.results[0])["OUTPUT0"].item() == value
            finally:
                pool.release(instance)
        assert pool.restarts == 1
        await pool.close()

    asyncio.run(run())
