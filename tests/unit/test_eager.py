"""run_eagerly: a coroutine's first step at once, a task only when it suspends."""

from __future__ import annotations

import asyncio
import contextvars

import pytest

from inferd.scheduling.eager import run_eagerly

VAR: contextvars.ContextVar[str] = contextvars.ContextVar("test_eager", default="outside")


def test_a_coroutine_that_never_suspends_runs_now_without_a_task() -> None:
    seen: list[str] = []

    async def quick() -> None:
        seen.append("ran")

    async def main() -> None:
        assert run_eagerly(quick()) is None
        assert seen == ["ran"]  # before any loop iteration

    asyncio.run(main())


def test_a_suspended_coroutine_is_finished_by_a_task_in_its_own_context() -> None:
    seen: list[object] = []

    async def waits(future: asyncio.Future[int]) -> None:
        VAR.set("inside")
        seen.append(await future)
        await asyncio.sleep(0)  # a bare yield too
        seen.append(VAR.get())

    async def main() -> None:
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        task = run_eagerly(waits(future))
        assert task is not None and not task.done()
        assert VAR.get() == "outside"  # the coroutine's context is its own
        future.set_result(7)
        await task
        assert seen == [7, "inside"]

    asyncio.run(main())


def test_the_awaited_error_reaches_the_coroutine() -> None:
    async def fails(future: asyncio.Future[int]) -> None:
        try:
            await future
        except ValueError as exc:
            raise RuntimeError(f"seen: {exc}") from None

    async def main() -> None:
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        task = run_eagerly(fails(future))
        assert task is not None
        future.set_exception(ValueError("bad"))
        with pytest.raises(RuntimeError, match="seen: bad"):
            await task

    asyncio.run(main())


def test_cancelling_the_task_cancels_the_coroutine() -> None:
    seen: list[str] = []

    async def waits(event: asyncio.Event) -> None:
        try:
            await event.wait()
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise

    async def main() -> None:
        task = run_eagerly(waits(asyncio.Event()))
        assert task is not None
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert seen == ["cancelled"]

    asyncio.run(main())


def test_an_error_in_the_first_step_is_raised_at_once() -> None:
    async def broken() -> None:
        raise KeyError("first")

    async def main() -> None:
        with pytest.raises(KeyError, match="first"):
            run_eagerly(broken())

    asyncio.run(main())
