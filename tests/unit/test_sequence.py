"""The sequence batcher on echo models: sequences pinned to instances (direct), batched oldest
first, one request of a sequence at a time in order, slots held until a sequence ends."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from inferd.backends import echo
from inferd.core.errors import InvalidInput
from tests.echo_support import echo_version, request

INPUT = 'input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [2] }]\n'
# The request-level echo logs each request's id as it ran.
REQUEST_LEVEL = 'parameters { key: "request_level" value: { string_value: "true" } }\n'


def _config(batch: int, instances: int, strategy: str) -> str:
    return (
        f'backend: "echo"\nmax_batch_size: {batch}\n{INPUT}{REQUEST_LEVEL}'
        f"instance_group [{{ count: {instances} kind: KIND_CPU }}]\n"
        f"sequence_batching {{ {strategy} }}\n"
    )


async def _steps(model: object, ids: list[int], steps: int) -> None:
    for step in range(1, steps + 1):
        await asyncio.gather(
            *(
                model.infer(  # type: ignore[attr-defined]
                    request(
                        model,  # type: ignore[arg-type]
                        float(step),
                        id=f"{corr}-{step}",
                        sequence_id=corr,
                        sequence_start=step == 1,
                        sequence_end=step == steps,
                    )
                )
                for corr in ids
            )
        )


def test_direct_pins_each_sequence_to_one_instance_in_order(tmp_path: Path) -> None:
    model = echo_version(tmp_path, _config(2, 2, "direct { }"))
    asyncio.run(_steps(model, [11, 12, 13, 14], 3))
    where: dict[str, set[int]] = {}
    order: dict[str, list[int]] = {}
    for execution in echo.LOG[model.name]:
        for request_id in execution.request_ids:
            corr, step = request_id.split("-")
            where.setdefault(corr, set()).add(execution.instance)
            order.setdefault(corr, []).append(int(step))
    assert all(len(instances) == 1 for instances in where.values())
    assert sorted(set().union(*where.values())) == [0, 1]  # two sequences per instance
    assert all(steps == [1, 2, 3] for steps in order.values())
    two_rows = request(model, 1.0, 2.0, sequence_id=3, sequence_start=True)
    with pytest.raises(InvalidInput, match="batch-size 1"):
        asyncio.run(model.infer(two_rows))
    asyncio.run(model.close())


def test_oldest_batches_ready_sequences(tmp_path: Path) -> None:
    strategy = "oldest { preferred_batch_size: [ 4 ] max_queue_delay_microseconds: 5000000 }"
    model = echo_version(tmp_path, _config(4, 1, strategy))
    asyncio.run(_steps(model, [1, 2, 3, 4], 2))
    batches = [sorted(e.request_ids) for e in echo.LOG[model.name]]
    assert batches == [["1-1", "2-1", "3-1", "4-1"], ["1-2", "2-2", "3-2", "4-2"]]
    asyncio.run(model.close())


def test_a_new_sequence_waits_for_a_free_slot(tmp_path: Path) -> None:
    model = echo_version(tmp_path, _config(1, 1, "direct { }"))

    async def run() -> list[str]:
        await model.infer(request(model, 1.0, id="a1", sequence_id=1, sequence_start=True))
        waiting = asyncio.ensure_future(
            model.infer(request(model, 2.0, id="b1", sequence_id=2, sequence_start=True))
        )
        await asyncio.sleep(0.05)
        assert not waiting.done()  # the only slot is sequence 1's
        await model.infer(request(model, 1.0, id="a2", sequence_id=1, sequence_end=True))
        await waiting
        with pytest.raises(InvalidInput, match="must specify the START flag"):
            await model.infer(request(model, 1.0, sequence_id=1))
        return [e.request_ids[0] for e in echo.LOG[model.name]]

    assert asyncio.run(run()) == ["a1", "a2", "b1"]
    asyncio.run(model.close())
