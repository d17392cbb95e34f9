"""The request-level execution seam between schedulers and instances.

A scheduler hands an instance a list of ``Work`` (one per request: inputs, requested outputs,
id, parameters, sequence controls) and gets back one ``Tensors`` or error per request, with the
time spent assembling, executing and splitting. ``Executor`` is what runs inside an instance
(a worker thread or a model process). Framework runtimes keep their small batch interface
(``Runtime.execute(inputs, names) -> outputs``) behind ``BatchExecutor``, which concatenates
the requests' inputs along axis 0 and splits the outputs back, inside the worker, never on the
event loop. A request-level executor (Python models) sees every request as it came.
"""

from __future__ import annotations

import contextlib
import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from inferd.core.errors import InferdError, InternalError, InvalidInput, Unavailable
from inferd.core.types import Handover, Parameters, Tensors, Timings

log = logging.getLogger("inferd.scheduling")

# Sequence control flags of a request (the sequence batcher sets them).
SEQUENCE_START = 1
SEQUENCE_END = 2


@dataclass(slots=True, eq=False)
class Work:
    """One request as an instance executes it; its inputs are validated and model-shaped."""

    inputs: Tensors
    rows: int  # rows in the batch dimension; 0 when the model does not batch
    outputs: tuple[str, ...]  # the outputs to compute, in order
    request_id: str = ""
    parameters: Parameters = field(default_factory=dict)
    correlation_id: int | str | None = None  # the sequence a request belongs to, if any
    flags: int = 0  # SEQUENCE_START | SEQUENCE_END
    # Set on the event loop when the caller gave up (client gone, timed out) after the work
    # was handed to an instance: the instance skips it and answers CANCELLED.
    cancelled: bool = False
    # Which signature of the model file runs ("": the model's own inputs and outputs); only
    # models whose backend lists signatures get one (``Runtime.execute_signature``).
    signature: str = ""
    # Decoupled models: called on the event loop with each response as the model sends it
    # (``final`` on the last); the request's own result is then empty. Never crosses to a worker.
    responses: Callable[[Result, bool], None] | None = None
    # The requests this work stands for: several when a frontend worker sent the rows of
    # compatible requests as one (``inferd.workers``); statistics count each.
    requests: int = 1
    # The request gives its inputs up once they are in a worker process's shared memory
    # (``give_up_inputs``). Never crosses to a worker.
    handover: Handover | None = None


def give_up_inputs(work: Work) -> None:
    """Empty the bytearrays among ``work``'s BYTES inputs (their copies are in shared memory
    now): their memory goes back at once, whoever else still refers to them."""
    handover = work.handover
    if handover is None:
        return
    for array in work.inputs.values():
        if array.dtype.kind == "O":
            for item in array.flat:
                if isinstance(item, bytearray):
                    with contextlib.suppress(BufferError):  # a view of it is alive: kept
                        item.clear()
    handover.taken = True


Result = Tensors | InferdError
# The result of a Work whose caller gave up before it ran: it was not executed.
CANCELLED = Unavailable("the request was cancelled before it ran")


@dataclass(slots=True)
class Executed:
    """One execution's answers (one per Work, in order) and where its time went, in ns."""

    results: list[Result]
    input_ns: int = 0  # assembling the batch
    infer_ns: int = 0  # the model itself
    output_ns: int = 0  # splitting the outputs back per request


def live(batch: Sequence[Work]) -> list[Work] | None:
    """The works of a batch still wanted (None: all of them, the usual case)."""
    for work in batch:
        if work.cancelled:
            return [w for w in batch if not w.cancelled]
    return None


def run_live(executor: Executor, batch: Sequence[Work]) -> Executed | None:
    """Execute what is still wanted of a batch; cancelled works answer CANCELLED. None when
    nothing was left to run."""
    wanted = live(batch)
    if wanted is None:
        return executor.execute(batch)
    if not wanted:
        return None
    executed = executor.execute(wanted)
    answers = iter(executed.results)
    executed.results = [CANCELLED if w.cancelled else next(answers) for w in batch]
    return executed


class InstanceFailed(InternalError):
    """The instance can no longer execute (its runtime or worker broke): it is restarted, and
    the requests it held fail with this error."""


class Executor(Protocol):
    """What one execution instance runs: a list of requests in, one result per request out."""

    # May run on the event loop itself when it is fast (the pool measures it first).
    inline: bool

    def execute(self, batch: Sequence[Work]) -> Executed:
        """Run the requests (one batch); blocking, one call at a time per instance."""
        ...

    def close(self) -> None: ...


class Runtime(ABC):
    """One loaded execution instance of a model version, as a backend's ``load`` returns it:
    whole batches of numpy arrays in, the requested outputs out (``BatchExecutor`` puts it
    behind the request-level seam: concatenating requests, checking rows, splitting)."""

    # Whether a call may run on the event loop itself when it is fast (the instances measure
    # it on the worker threads first): true only for runtimes with no thread affinity that
    # release no lock the loop could need.
    inline: bool = False

    @abstractmethod
    def execute(self, inputs: Tensors, output_names: Sequence[str]) -> Tensors:
        """Run one whole batch (each input's first dimension is the batch when the model
        batches); called by one thread at a time per instance. Return at least the outputs
        named, each with as many rows as the inputs."""

    def execute_signature(
        self, signature: str, inputs: Tensors, output_names: Sequence[str]
    ) -> Tensors:
        """Run another signature of the model file (a TF SavedModel's SignatureDefs); called
        only for the names the backend's ``signatures`` listed."""
        raise InvalidInput(f"this model has no signature '{signature}'")

    def close(self) -> None:
        """Free what the instance holds (the model is unloaded or the instance rebuilt);
        the default holds nothing to free."""
        return None


class Scheduler(Protocol):
    """What runs a model version's requests: a batcher over instances, or a backend's own
    (``Backend.load_scheduler``: an ensemble calling its composing models)."""

    async def run(self, work: Work, timings: Timings) -> Tensors:
        """Execute one validated request; its outputs, or its error raised."""
        ...

    async def close(self) -> None: ...


# ---------------------------------------------------------------- batch compatibility
# The one rule of which requests may share a batch and how their rows travel together: the
# dynamic batcher groups queued requests by ``batch_key``; a batch runtime's executor joins
# and splits them (``BatchExecutor``); the serving processes send compatible requests to the
# model host as one (``inferd.workers.rows``).


def batch_key(work: Work) -> tuple[Any, ...]:
    """Requests with equal keys can share a batch: same signature, outputs, input names,
    dtypes and row shapes. Each request keeps its own id and parameters inside the batch."""
    inputs = work.inputs
    if len(inputs) == 1:  # the usual request: no generator to run
        for name, array in inputs.items():
            return (work.signature, work.outputs, name, array.dtype, array.shape[1:])
    key: list[Any] = [work.signature, work.outputs]
    for name, array in inputs.items():
        key += (name, array.dtype, array.shape[1:])
    return tuple(key)


def join(works: Sequence[Work]) -> Tensors:
    """The inputs of compatible works (equal ``batch_key``), their rows one after the other."""
    first = works[0].inputs
    return {name: np.concatenate([w.inputs[name] for w in works], axis=0) for name in first}


def split(outputs: Tensors, rows: Sequence[int]) -> list[Tensors]:
    """Each work's rows of a joined answer, in order (views, no copies)."""
    parts: list[Tensors] = []
    offset = 0
    for count in rows:
        end = offset + count
        parts.append({name: array[offset:end] for name, array in outputs.items()})
        offset = end
    return parts


def check_rows(model: str, outputs: Tensors, rows: int) -> None:
    """Every output of a batching model has ``rows`` rows (the one place this is checked)."""
    for name, array in outputs.items():
        if array.ndim == 0 or array.shape[0] != rows:
            got = array.shape[0] if array.ndim else "a scalar"
            raise InternalError(
                f"model '{model}' returned output '{name}' with batch size {got} "
                f"for a batch of {rows} rows"
            )


def as_error(model: str, exc: BaseException) -> InferdError:
    """An executor's failure as the error its requests get (a backend bug is logged once)."""
    if isinstance(exc, InferdError):
        return exc
    log.error("model '%s' failed while executing", model, exc_info=exc)
    return InternalError(f"model '{model}' failed: {exc}")


class BatchExecutor:
    """A batch Runtime behind the request-level seam: concatenate, execute, check, split.

    A batch the runtime refuses as bad input (``InvalidInput``: say, a string ONNX Runtime
    cannot carry) runs again request by request, so that only the request at fault fails.
    """

    __slots__ = ("inline", "model", "runtime")

    def __init__(self, model: str, runtime: Runtime) -> None:
        self.model = model
        self.runtime = runtime
        self.inline = runtime.inline

    def _signature(self, work: Work, inputs: Tensors) -> Tensors:
        return self.runtime.execute_signature(work.signature, inputs, work.outputs)

    def execute(self, batch: Sequence[Work]) -> Executed:
        first = batch[0]
        if len(batch) == 1:
            try:
                started = time.perf_counter_ns()
                if first.signature:
                    outputs = self._signature(first, first.inputs)
                    if first.rows:
                        check_rows(self.model, outputs, first.rows)
                else:
                    outputs = self.execute_one(first.inputs, first.outputs, first.rows)
                infer_ns = time.perf_counter_ns() - started
            except InstanceFailed:
                raise
            except Exception as exc:
                return Executed([as_error(self.model, exc)])
            return Executed([outputs], 0, infer_ns, 0)
        started = time.perf_counter_ns()
        rows = 0
        for work in batch:
            rows += work.rows
        inputs = join(batch)
        assembled = time.perf_counter_ns()
        try:
            outputs = (
                self._signature(first, inputs)
                if first.signature
                else self.runtime.execute(inputs, first.outputs)
            )
            executed = time.perf_counter_ns()
            check_rows(self.model, outputs, rows)
        except InstanceFailed:
            raise
        except InvalidInput:
            return self._one_by_one(batch)
        except Exception as exc:
            return Executed([as_error(self.model, exc)] * len(batch), assembled - started)
        parts: list[Result] = list(split(outputs, [work.rows for work in batch]))
        return Executed(
            parts, assembled - started, executed - assembled, time.perf_counter_ns() - executed
        )

    def execute_one(self, inputs: Tensors, outputs: Sequence[str], rows: int) -> Tensors:
        """One request's inputs run alone (``rows`` rows; 0: a model that does not batch):
        what the runtime returns or raises, and InternalError when an output's rows are not
        the request's."""
        found = self.runtime.execute(inputs, outputs)
        if rows:
            for array in found.values():
                if not array.shape or array.shape[0] != rows:
                    check_rows(self.model, found, rows)  # raises, naming it
        return found

    def _one_by_one(self, batch: Sequence[Work]) -> Executed:
        started = time.perf_counter_ns()
        results = [self.execute([work]).results[0] for work in batch]
        return Executed(results, 0, time.perf_counter_ns() - started, 0)

    def close(self) -> None:
        self.runtime.close()
