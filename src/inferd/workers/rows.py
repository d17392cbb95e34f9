"""Requests that travel as one: the rows of compatible requests to a batching model.

Requests a frontend worker forwards to the same dynamically batched version within one
event-loop iteration, with the same requested outputs, input datatypes and row shapes, and no
scheduling parameter of their own (priority, timeout, sequence), would sit side by side in the
host's batcher anyway: they go as one request of all their rows (at most the model's
``max_batch_size``), which the host queues and counts as that many requests
(``Work.requests``), and each gets its own rows of the answer back. Which requests are
compatible, and how their rows are joined and split, is the batcher's own rule
(``inferd.backends.work``: ``batch_key``, ``join``, ``split``). The host then handles one
entry where it would have handled several, and the batching is the same.

Only versions whose instances run a batch runtime get this (``ThreadInstances.row_batches``): a
request-level executor (a Python model) sees every request as it came.
"""

from __future__ import annotations

from typing import Any

from inferd.backends.work import Work, batch_key
from inferd.plane.model import ModelVersion
from inferd.scheduling.batcher import DynamicBatcher
from inferd.scheduling.instances import ThreadInstances

# Request parameters the host's batcher acts on: a request carrying one travels alone.
SCHEDULING = ("priority", "timeout", "sequence_id", "sequence_start", "sequence_end")


def joinable_rows(version: ModelVersion) -> int:
    """The most rows requests to ``version`` may travel with as one (0: never; the host's
    decision, sent with the version)."""
    scheduler = version.scheduler
    if (
        isinstance(scheduler, DynamicBatcher)
        and isinstance(scheduler.pool, ThreadInstances)
        and scheduler.pool.row_batches
        and version.cache is None
        and not version.decoupled
    ):
        return version.spec.max_batch_size
    return 0


def key(work: Work) -> tuple[Any, ...] | None:
    """Works with equal keys may travel as one (the batcher's own ``batch_key``: they would
    share a batch there); None: this one travels alone."""
    if work.rows <= 0 or work.signature or work.responses is not None:
        return None
    parameters = work.parameters
    if parameters and any(name in parameters for name in SCHEDULING):
        return None
    return batch_key(work)
