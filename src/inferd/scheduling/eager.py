"""Running a coroutine's first step at once, where a task would wait a loop iteration for it.

A model in a worker process calling another model (``processes``) mostly calls one that runs
inline and answers without ever suspending: a task per call would only add a loop iteration
and its bookkeeping to each call. ``run_eagerly`` runs the coroutine now and hands it to a
task only if it suspends (Python 3.12's eager tasks, for 3.11).
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Coroutine
from typing import Any


def run_eagerly(coro: Coroutine[Any, Any, None]) -> asyncio.Task[None] | None:
    """Run ``coro`` until it finishes (None) or suspends: then a task, on the running loop and
    in the same context, finishes it. An exception escaping ``coro`` is raised here or from
    the task, as from a task's own first step."""
    context = contextvars.copy_context()
    try:
        step = context.run(coro.send, None)
    except StopIteration:
        return None
    return asyncio.get_running_loop().create_task(_finish(coro, step), context=context)


async def _finish(coro: Coroutine[Any, Any, None], step: Any) -> None:
    """Drive ``coro`` on from a suspension at ``step`` (the future it awaits, or None for a
    bare yield), as a task would: resumed once the future is done, a cancellation thrown in."""
    while True:
        cancelled: BaseException | None = None
        try:
            if step is None:
                await asyncio.sleep(0)
            else:
                step._asyncio_future_blocking = False  # taken over, as a task takes it
                await step
        except asyncio.CancelledError as exc:
            if not (step is not None and step.cancelled()):  # this task was cancelled
                cancelled = exc
        except BaseException:  # the step's own error: coro reads it on resuming
            pass
        try:
            step = coro.send(None) if cancelled is None else coro.throw(cancelled)
        except StopIteration:
            return
