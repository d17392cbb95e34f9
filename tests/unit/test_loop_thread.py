"""Blocking calls into a loop on another thread: values and errors come back, a call that
waits is carried on by the loop, and a loop that is gone answers Unavailable."""

from __future__ import annotations

import asyncio
import threading

import pytest

from inferd.app.loop_thread import LoopThread, call_in_loop
from inferd.core.errors import NotFound, Unavailable


async def _where(wait_s: float = 0.0) -> str:
    if wait_s:
        await asyncio.sleep(wait_s)
    return threading.current_thread().name


async def _fails() -> None:
    raise NotFound("no such thing")


def test_calls_run_on_the_loop_thread_and_answer() -> None:
    thread = LoopThread(name="the-loop")
    try:
        assert thread.call(_where()) == "the-loop"  # finished in its first step
        assert thread.call(_where(0.01)) == "the-loop"  # waited: a Task carried it on
        with pytest.raises(NotFound, match="no such thing"):
            thread.call(_fails())
        answers: list[str] = []
        callers = [
            threading.Thread(target=lambda: answers.append(thread.call(_where(0.001))))
            for _ in range(8)
        ]
        for caller in callers:
            caller.start()
        for caller in callers:
            caller.join()
        assert answers == ["the-loop"] * 8
    finally:
        thread.close()
    thread.close()  # again: nothing to do
    with pytest.raises(Unavailable, match="stopped"):
        call_in_loop(thread.loop, _where())


def test_a_call_cut_short_by_the_loop_stopping_is_unavailable() -> None:
    thread = LoopThread()
    stopper = threading.Timer(0.05, thread.close)
    stopper.start()
    with pytest.raises(Unavailable):
        thread.call(asyncio.sleep(30))
    stopper.join()
