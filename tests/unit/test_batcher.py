"""The dynamic batcher over echo models: what forms a batch, queue policies, ordering, and what
each request keeps (id, parameters) through the batch."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from inferd.backends import echo
from inferd.core.errors import DeadlineExceeded, Unavailable
from inferd.core.types import InferResponse
from inferd.plane.model import ModelVersion
from tests.echo_support import echo_version, request


def _batched(extra: str, max_batch_size: int = 8) -> str:
    return (
        f'backend: "echo"\nmax_batch_size: {max_batch_size}\n'
        'input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [2] }]\n' + extra
    )


def _gated(gate: str) -> str:
    echo.GATES.pop(gate, None)
    echo.gate(gate)
    return f'parameters {{ key: "gate" value: {{ string_value: "{gate}" }} }}\n'


async def _infer(model: ModelVersion, *values: float, **kw: object) -> InferResponse:
    return await model.infer(request(model, *values, **kw))  # type: ignore[arg-type]


def test_requests_waiting_behind_a_busy_instance_form_one_batch(tmp_path: Path) -> None:
    model = echo_version(tmp_path, _batched("dynamic_batching {}\n" + _gated("b1")))

    async def run() -> list[list[float]]:
        first = asyncio.ensure_future(_infer(model, 0))
        await asyncio.sleep(0.01)
        rest = [asyncio.ensure_future(_infer(model, v)) for v in (1, 2, 3, 4)]
        await asyncio.sleep(0.01)
        echo.gate("b1").set()
        answers = await asyncio.gather(first, *rest)
        await model.close()
        return [a.outputs["OUTPUT0"][:, 0].tolist() for a in answers]

    assert asyncio.run(run()) == [[0], [1], [2], [3], [4]]
    assert [e.rows for e in echo.LOG[model.name]] == [1, 4]
    stats = model.stats
    assert stats.execution_count == 2 and stats.inference_count == 5
    assert sorted(stats.batches) == [1, 4]


def test_the_queue_delay_lets_a_batch_fill(tmp_path: Path) -> None:
    # Three arrivals 5 ms apart, well within the delay (1 s) even on a busy host.
    model = echo_version(
        tmp_path, _batched("dynamic_batching { max_queue_delay_microseconds: 1000000 }\n")
    )

    async def run() -> None:
        answers = []
        for v in (1, 2, 3):
            answers.append(asyncio.ensure_future(_infer(model, v)))
            await asyncio.sleep(0.005)
        await asyncio.gather(*answers)
        await model.close()

    asyncio.run(run())
    assert [e.rows for e in echo.LOG[model.name]] == [3]


def test_a_preferred_size_goes_out_without_waiting(tmp_path: Path) -> None:
    config = (
        "dynamic_batching { preferred_batch_size: [4] max_queue_delay_microseconds: 5000000 }\n"
    )
    model = echo_version(tmp_path, _batched(config))

    async def run() -> None:
        await asyncio.wait_for(_infer(model, 1, 2, 3, 4), timeout=2)  # not after 5 s
        await model.close()

    asyncio.run(run())
    assert [e.rows for e in echo.LOG[model.name]] == [4]


def test_an_arrival_that_reaches_the_smallest_preferred_size_ships_before_the_delay(
    tmp_path: Path,
) -> None:
    config = (
        "dynamic_batching { preferred_batch_size: [2, 4] max_queue_delay_microseconds: 5000000 }\n"
    )
    model = echo_version(tmp_path, _batched(config))

    async def run() -> None:
        first = asyncio.ensure_future(_infer(model, 1))
        await asyncio.sleep(0.02)  # alone: waits, with the delay's timer set
        assert not first.done()
        await asyncio.wait_for(asyncio.gather(first, _infer(model, 2)), timeout=2)
        third = asyncio.ensure_future(_infer(model, 3))
        await asyncio.sleep(0.02)
        await asyncio.wait_for(asyncio.gather(third, _infer(model, 4, 5, 6)), timeout=2)
        await model.close()

    asyncio.run(run())
    assert [e.rows for e in echo.LOG[model.name]] == [2, 4]


def test_each_request_keeps_its_id_and_parameters_in_a_batch(tmp_path: Path) -> None:
    config = "dynamic_batching {}\n" + _gated("b2")
    config += 'parameters { key: "request_level" value: { string_value: "true" } }\n'
    model = echo_version(tmp_path, _batched(config))

    async def run() -> None:
        first = asyncio.ensure_future(_infer(model, 0, id="r0"))
        await asyncio.sleep(0.01)
        others = [asyncio.ensure_future(_infer(model, v, id=f"r{v}", tag=f"t{v}")) for v in (1, 2)]
        await asyncio.sleep(0.01)
        echo.gate("b2").set()
        await asyncio.gather(first, *others)
        await model.close()

    asyncio.run(run())
    second = echo.LOG[model.name][1]
    assert second.request_ids == ("r1", "r2")
    assert second.parameters == ({"tag": "t1"}, {"tag": "t2"})


def test_a_full_queue_refuses(tmp_path: Path) -> None:
    config = "dynamic_batching { default_queue_policy { max_queue_size: 1 } }\n" + _gated("b3")
    model = echo_version(tmp_path, _batched(config, max_batch_size=1))

    async def run() -> None:
        # One runs, one waits in the busy instance's own queue (a batch that cannot grow, with
        # no timeout to watch), one in the model's queue: then the queue is full.
        running = asyncio.ensure_future(_infer(model, 0))
        await asyncio.sleep(0.01)
        waiting = [asyncio.ensure_future(_infer(model, v)) for v in (1, 2)]
        await asyncio.sleep(0)
        with pytest.raises(Unavailable, match="max_queue_size 1"):
            await _infer(model, 3)
        echo.gate("b3").set()
        assert (await running).outputs["OUTPUT0"][:, 0].tolist() == [0]
        assert [(await w).outputs["OUTPUT0"][:, 0].tolist() for w in waiting] == [[1], [2]]
        await model.close()

    asyncio.run(run())


def test_a_request_times_out_in_the_queue(tmp_path: Path) -> None:
    # Apart from the full queue above: a 20 ms timeout may pass before the next request, on a
    # busy host, and leave the queue empty.
    config = (
        "dynamic_batching { default_queue_policy { default_timeout_microseconds: 20000 } }\n"
        + _gated("b3t")
    )
    model = echo_version(tmp_path, _batched(config, max_batch_size=1))

    async def run() -> None:
        running = asyncio.ensure_future(_infer(model, 0))
        await asyncio.sleep(0.01)
        with pytest.raises(DeadlineExceeded, match="timed out after 20000 us in the queue"):
            await _infer(model, 1)
        echo.gate("b3t").set()
        assert (await running).outputs["OUTPUT0"][:, 0].tolist() == [0]
        await model.close()

    asyncio.run(run())


def test_higher_priority_requests_go_first(tmp_path: Path) -> None:
    config = "dynamic_batching { priority_levels: 2 default_priority_level: 2 }\n" + _gated("b4")
    config += 'parameters { key: "request_level" value: { string_value: "true" } }\n'
    model = echo_version(tmp_path, _batched(config, max_batch_size=1))

    async def run() -> None:
        first = asyncio.ensure_future(_infer(model, 0, id="first"))
        await asyncio.sleep(0.01)
        low = asyncio.ensure_future(_infer(model, 1, id="low"))
        await asyncio.sleep(0.005)
        high = asyncio.ensure_future(_infer(model, 2, id="high", priority=1))
        await asyncio.sleep(0.005)
        echo.gate("b4").set()
        await asyncio.gather(first, low, high)
        await model.close()

    asyncio.run(run())
    order = [e.request_ids for e in echo.LOG[model.name]]
    assert order == [("first",), ("high",), ("low",)]


def test_preserve_ordering_answers_in_arrival_order(tmp_path: Path) -> None:
    config = "dynamic_batching { preserve_ordering: true }\ninstance_group { count: 2 }\n" + _gated(
        "b5"
    )
    model = echo_version(tmp_path, _batched(config, max_batch_size=1))
    done: list[int] = []

    async def one(v: int) -> None:
        await _infer(model, v)
        done.append(v)

    async def run() -> None:
        tasks = [asyncio.ensure_future(one(v)) for v in range(6)]
        await asyncio.sleep(0.02)
        echo.gate("b5").set()
        await asyncio.gather(*tasks)
        await model.close()

    asyncio.run(run())
    assert done == [0, 1, 2, 3, 4, 5]


def test_a_model_error_fails_only_its_batch(tmp_path: Path) -> None:
    config = 'dynamic_batching {}\nparameters { key: "error_every" value: { string_value: "2" } }\n'
    model = echo_version(tmp_path, _batched(config))

    async def run() -> list[str]:
        outcomes = []
        for v in range(4):
            try:
                await _infer(model, v)
                outcomes.append("ok")
            except Exception as exc:
                outcomes.append(type(exc).__name__)
        await model.close()
        return outcomes

    assert asyncio.run(run()) == ["ok", "InternalError", "ok", "InternalError"]
    assert model.stats.fail.count == 2 and model.stats.success.count == 2


def test_a_request_whose_caller_left_after_dispatch_is_not_executed(tmp_path: Path) -> None:
    # max_batch_size 1: each request is a batch that cannot grow, so the second waits in the
    # busy instance's queue (pipeline depth 2) when its caller goes away.
    model = echo_version(tmp_path, _batched("dynamic_batching {}\n" + _gated("b9"), 1))

    async def run() -> float:
        first = asyncio.ensure_future(_infer(model, 1))
        await asyncio.sleep(0.01)
        left = asyncio.ensure_future(_infer(model, 2))
        await asyncio.sleep(0.01)
        left.cancel()
        with pytest.raises(asyncio.CancelledError):
            await left
        echo.gate("b9").set()
        answer = await first
        await model.close()
        return float(answer.outputs["OUTPUT0"][0, 0])

    assert asyncio.run(run()) == 1.0
    assert [e.rows for e in echo.LOG[model.name]] == [1]  # the second never ran


def test_a_request_cancelled_in_the_queue_leaves_it_and_its_batch(tmp_path: Path) -> None:
    model = echo_version(tmp_path, _batched("dynamic_batching {}\n" + _gated("b10")))

    async def run() -> list[float]:
        first = asyncio.ensure_future(_infer(model, 0))
        await asyncio.sleep(0.01)
        queued = [asyncio.ensure_future(_infer(model, v)) for v in (1, 2, 3)]
        await asyncio.sleep(0.01)
        queued[1].cancel()
        echo.gate("b10").set()
        answers = await asyncio.gather(first, queued[0], queued[2])
        batcher: Any = model.scheduler
        assert [len(q) for q in batcher._queues] == [0] and batcher._queued_rows == 0
        await model.close()
        return [float(a.outputs["OUTPUT0"][0, 0]) for a in answers]

    assert asyncio.run(run()) == [0.0, 1.0, 3.0]
    assert [e.rows for e in echo.LOG[model.name]] == [1, 2]


def test_a_sub_millisecond_queue_delay_arms_one_timer_per_wait(tmp_path: Path) -> None:
    # uvloop counts timer delays in whole milliseconds and rounds a shorter one down to none: a
    # batch waiting out its last fraction of a millisecond must not re-arm a timer that fires
    # at once, every loop iteration, until the delay has passed (thousands per request).
    import uvloop

    class Counting(uvloop.Loop):
        timers = 0

        def call_later(  # type: ignore[override]
            self, delay: float, callback: Any, *args: Any, context: Any = None
        ) -> asyncio.TimerHandle:
            Counting.timers += 1
            return super().call_later(delay, callback, *args, context=context)

    model = echo_version(
        tmp_path, _batched("dynamic_batching { max_queue_delay_microseconds: 400 }\n")
    )

    async def run() -> list[float]:
        answers = [await _infer(model, float(i)) for i in range(20)]
        await model.close()
        return [a.outputs["OUTPUT0"][0, 0] for a in answers]

    loop = Counting()
    try:
        assert loop.run_until_complete(run()) == [float(i) for i in range(20)]
    finally:
        loop.close()
    assert Counting.timers <= 2 * 20
