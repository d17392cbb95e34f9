"""ClientWatch: work whose client hangs up after the watch starts answers ClientGone; work that
ends first never asks for the client; other cancellations stay cancellations; the sweep stops
when nothing runs."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest

from inferd.core.errors import ClientGone
from inferd.protocols.transport.watch import ClientWatch


@dataclass
class Request:
    method: str = "POST"
    path: str = "/v2/models/m/infer"
    task: asyncio.Task[Any] | None = None
    asked: int = 0  # how often the watch asked whether the client is there
    gone: asyncio.Future[None] | None = None
    disconnected: Callable[[], Awaitable[None]] | None = None  # granian's client_disconnect

    def __post_init__(self) -> None:
        def disconnected() -> asyncio.Future[None]:
            self.asked += 1
            self.gone = asyncio.get_running_loop().create_future()
            return self.gone

        self.disconnected = disconnected


def test_hang_up_after_the_watch_started_cancels_the_work() -> None:
    async def run() -> None:
        watch = ClientWatch(after_s=0.02)
        loop = asyncio.get_running_loop()
        request = Request()
        executed = loop.create_future()  # the model's answer: never comes

        async def serve() -> str:
            request.task = asyncio.current_task()
            return await watch.guard(request, executed)

        task = asyncio.ensure_future(serve())
        await asyncio.sleep(0.06)  # past after_s and a sweep
        assert request.asked == 1 and request.gone is not None
        request.gone.set_result(None)  # the client hangs up
        with pytest.raises(ClientGone, match="client disconnected during POST /v2/models/m/infer"):
            await task
        assert task.cancelling() == 0  # the watch's cancel was taken back
        assert executed.cancelled()  # what the work waited on was cancelled with it
        assert watch._watched == {} and watch._gone == set() and watch._running == {}

    asyncio.run(run())


def test_work_that_ends_first_never_asks_and_a_later_hang_up_cancels_nothing() -> None:
    async def run() -> None:
        watch = ClientWatch(after_s=0.02)
        loop = asyncio.get_running_loop()
        quick, slow = Request(), Request()

        async def serve(request: Request, answer_after_s: float) -> str:
            request.task = asyncio.current_task()
            done: asyncio.Future[str] = loop.create_future()
            loop.call_later(answer_after_s, done.set_result, f"after {answer_after_s}")
            return await watch.guard(request, done)

        assert await serve(quick, 0.001) == "after 0.001"
        assert await serve(slow, 0.08) == "after 0.08"
        assert quick.asked == 0  # answered before any watch began
        assert slow.asked == 1 and slow.gone is not None and slow.gone.cancelled()
        await asyncio.sleep(0.05)
        assert watch._sweeping is None  # idle: no timer left armed

    asyncio.run(run())


def test_other_cancellations_stay_cancellations_and_no_task_means_no_watch() -> None:
    async def run() -> None:
        watch = ClientWatch(after_s=0.01)
        loop = asyncio.get_running_loop()
        request = Request()

        async def serve() -> None:
            request.task = asyncio.current_task()
            await watch.guard(request, loop.create_future())

        task = asyncio.ensure_future(serve())
        await asyncio.sleep(0.04)
        task.cancel()  # the server shutting down, say: not the client
        with pytest.raises(asyncio.CancelledError):
            await task
        assert watch._watched == {} and watch._running == {}
        untracked = Request()  # no task: the work is returned as it is
        work = loop.create_future()
        assert watch.guard(untracked, work) is work
        work.cancel()

    asyncio.run(run())
