"""inferd.protocols.transport.h2grpc.eager: a call's coroutine runs at once; a Task carries on
only the ones that wait, with the same results, cancellation and context as a Task from the
start."""

from __future__ import annotations

import asyncio
import contextvars

import pytest

from inferd.protocols.transport.h2grpc import eager

_VAR: contextvars.ContextVar[str] = contextvars.ContextVar("eager_test", default="unset")


def test_a_call_that_does_not_wait_finishes_without_a_task() -> None:
    ran: list[str] = []

    async def call() -> None:
        _VAR.set("inside")
        ran.append(_VAR.get())

    async def main() -> None:
        assert eager.start(asyncio.get_running_loop(), call(), "/s/M") is None
        assert ran == ["inside"]
        assert _VAR.get() == "unset"  # the call ran in its own copy of the context

    asyncio.run(main())


def test_a_call_that_waits_is_carried_on_by_a_task() -> None:
    steps: list[str] = []

    async def call(gate: asyncio.Future[str]) -> None:
        _VAR.set("inside")
        steps.append("started")
        steps.append(await gate)
        await asyncio.sleep(0)
        steps.append(_VAR.get())

    async def main() -> None:
        loop = asyncio.get_running_loop()
        gate: asyncio.Future[str] = loop.create_future()
        task = eager.start(loop, call(gate), "/s/M")
        assert task is not None and task.get_name() == "/s/M"
        assert steps == ["started"]  # ran up to its first wait before start returned
        gate.set_result("opened")
        await task
        assert steps == ["started", "opened", "inside"]
        assert _VAR.get() == "unset"

    asyncio.run(main())


@pytest.mark.parametrize("before_first_step", [True, False])
def test_cancelling_a_waiting_call_cancels_what_it_waits_on(before_first_step: bool) -> None:
    seen: list[str] = []

    async def call(gate: asyncio.Future[None]) -> None:
        try:
            await gate
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise
        finally:
            seen.append("cleaned up")

    async def main() -> None:
        loop = asyncio.get_running_loop()
        gate: asyncio.Future[None] = loop.create_future()
        task = eager.start(loop, call(gate), "/s/M")
        assert task is not None
        if not before_first_step:
            await asyncio.sleep(0)  # the task has taken over the wait
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert task.cancelled()
        assert gate.cancelled()
        assert seen == ["cancelled", "cleaned up"]

    asyncio.run(main())


def test_an_error_after_the_first_wait_ends_the_task_with_it() -> None:
    async def call(gate: asyncio.Future[None]) -> None:
        await gate
        raise ValueError("boom")

    async def main() -> None:
        loop = asyncio.get_running_loop()
        gate: asyncio.Future[None] = loop.create_future()
        task = eager.start(loop, call(gate), "/s/M")
        assert task is not None
        gate.set_result(None)
        with pytest.raises(ValueError, match="boom"):
            await task

    asyncio.run(main())
