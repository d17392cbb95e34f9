"""``inferd.Server.infer`` without the hop to the server's loop: a request to a model that
neither batches nor needs the loop runs on the caller's own thread.

Such a model is a version scheduled directly (``DirectScheduler``: one request, one execution)
on instances that are threads (``ThreadInstances``), not decoupled, not mirrored to a shadow,
on a server that does not load models on demand (lazy serving loads on the loop). The call
claims an idle instance (``ThreadInstances.claim``) and runs the version's own ``infer`` with
the scheduler's ``run_now`` on that instance, here: the same validation, response cache,
checks of the ``priority`` and ``timeout`` parameters, statistics and errors as on the loop,
and no thread wake-up at all. Every other request goes to the loop as before (a batching
model, whose callers share batches there; an ensemble, a sequence, the rate limiter, a Python
model in worker processes; an instance that is busy or has work queued).

The version's live figures are otherwise written on the loop only. Here they are written with
the figures' own log appends (one C call each) and with read-modify-writes of one counter each
(``stats.pending``, ``Duration.add``), which CPython's GIL does not split: the interpreter
switches threads only at calls and backward jumps, never between reading an int attribute and
storing its sum. The response cache takes a lock. The version cannot retire under the call:
closing its instances waits for the claim (``ThreadInstances``), as it waits for queued work.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

from inferd.backends.work import Executed, Work
from inferd.core.errors import InferdError, InternalError, NotFound, Unavailable
from inferd.core.types import LABEL_PARAMETER, InferRequest, InferResponse, Tensors, Timings
from inferd.plane.model import ModelState
from inferd.scheduling.batcher import DirectScheduler
from inferd.scheduling.instances import ThreadInstances

if TYPE_CHECKING:
    from inferd.plane.dataplane import DataPlane

T = TypeVar("T")


def infer_now(plane: DataPlane, request: InferRequest) -> InferResponse | None:
    """Run ``request`` on this thread when its model takes the direct path; None when it does
    not (or not now): the caller hands it to the loop, which answers it as always."""
    if plane.on_demand is not None:
        return None
    label = request.parameters.get(LABEL_PARAMETER, "")
    if not isinstance(label, str):
        return None
    registry = plane.registry
    try:
        model = registry.route(request.model_name, request.model_version, label, request.id)
    except (InferdError, RuntimeError):  # the loop's error to raise; or a table it was changing
        return None
    scheduler = model.scheduler
    if type(scheduler) is not DirectScheduler or model.decoupled:
        return None
    pool = scheduler.pool
    if type(pool) is not ThreadInstances or registry.shadowing(model.name) is not None:
        return None
    instance = pool.claim()
    if instance is None:
        return None
    try:
        return _finish(model.infer(request, "", _Claimed(scheduler, pool, instance)))
    except (Unavailable, NotFound):
        if model.state is ModelState.READY:
            raise
        return None  # retired between routing and running: the loop routes it again
    finally:
        pool.release(instance)


class _Claimed:
    """The version's scheduler, executing on the instance this thread claimed."""

    __slots__ = ("execute", "scheduler")

    def __init__(self, scheduler: DirectScheduler, pool: ThreadInstances, instance: int) -> None:
        self.scheduler = scheduler
        self.execute: Callable[[list[Work]], Executed] = lambda batch: pool.execute_claimed(
            instance, batch
        )

    async def run(self, work: Work, timings: Timings) -> Tensors:
        return self.scheduler.run_now(work, timings, self.execute)

    async def close(self) -> None:
        return None


def _finish(coro: Coroutine[Any, Any, T]) -> T:
    """The outcome of a coroutine that never waits, run to its end on this thread."""
    try:
        coro.send(None)
    except StopIteration as done:
        result: T = done.value
        return result
    coro.close()
    raise InternalError("an in-process call waited for the server's event loop")
