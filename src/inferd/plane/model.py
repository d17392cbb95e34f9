"""A loaded model version: its config, spec, signatures, scheduler, statistics and cache.

Internal to the plane: the registry holds versions and the data plane runs them; protocol
adapters see only the data plane's views.
"""

from __future__ import annotations

import asyncio
import enum
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field

from inferd.backends.work import BatchExecutor, Result, Scheduler, Work, as_error
from inferd.config.model_config_pb2 import ModelConfig
from inferd.config.spec import ModelSpec, SignatureSpec
from inferd.core.errors import InferdError, InvalidInput
from inferd.core.stats import ModelStats
from inferd.core.types import InferRequest, InferResponse, Tensors, Timings
from inferd.plane import validate
from inferd.plane.classification import class_counts, classify
from inferd.scheduling.batcher import DirectScheduler
from inferd.scheduling.cache import ResponseCache
from inferd.scheduling.instances import ThreadInstances
from inferd.scheduling.policy import check_request_parameters


class ModelState(enum.Enum):
    """Triton's model states (TF Serving's names are mapped at its edge)."""

    LOADING = "LOADING"
    READY = "READY"
    UNLOADING = "UNLOADING"
    UNAVAILABLE = "UNAVAILABLE"


@dataclass(eq=False)
class ModelVersion:
    name: str
    version: int
    config: ModelConfig
    spec: ModelSpec
    scheduler: Scheduler
    stats: ModelStats = field(default_factory=ModelStats)
    cache: ResponseCache | None = None  # set when the config enables response_cache
    instance_count: int = 1
    load_seconds: float = 0.0
    loaded_unix_s: float = field(default_factory=time.time)  # when it was built
    state: ModelState = ModelState.READY
    # Every signature of the model file, by name, when its backend lists them (TensorFlow).
    signatures: Mapping[str, SignatureSpec] = field(default_factory=dict)
    # The class labels of outputs with a ``label_filename`` (Triton's classification extension).
    labels: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # The folder the version's files were loaded from, and their size ("": none, an ensemble).
    folder: str = ""
    folder_bytes: int = 0

    def signature_spec(self, signature: str) -> ModelSpec:
        found = self.signatures.get(signature)
        if found is None:
            raise InvalidInput(f"model '{self.name}' has no signature '{signature}'")
        return found.spec

    # Whether a request may get 0..N responses (``model_transaction_policy``), read once.
    decoupled: bool = field(init=False)
    version_text: str = field(init=False)  # ``version`` as responses carry it
    # The instances of a version that ``infer_inline`` may run: one scheduled directly (one
    # request, one execution) on threads of batch runtimes, not decoupled. None: every request
    # goes through the scheduler.
    inline_pool: ThreadInstances | None = field(init=False)

    def __post_init__(self) -> None:
        self.decoupled = self.config.model_transaction_policy.decoupled
        self.version_text = str(self.version)
        scheduler = self.scheduler
        pool = getattr(scheduler, "pool", None)
        self.inline_pool = (
            pool
            if type(scheduler) is DirectScheduler
            and type(pool) is ThreadInstances
            and pool.row_batches
            and not self.decoupled
            else None
        )

    async def infer(
        self, request: InferRequest, signature: str = "", scheduler: Scheduler | None = None
    ) -> InferResponse:
        """Run a request on the model's own inputs and outputs, or on one of its signatures
        (``scheduler``: one in place of the version's own, as ``inferd.app.direct`` runs it)."""
        if self.decoupled:
            raise InvalidInput(
                f"model '{self.name}' is decoupled (0..N responses per request): use gRPC "
                "ModelStreamInfer or POST /v2/models/{m}/generate_stream (in process: "
                "inferd.Server.infer_stream)"
            )
        started = time.perf_counter_ns()
        timings = Timings()
        self.stats.pending += 1
        try:
            spec = self.spec if not signature else self.signature_spec(signature)
            inputs, rows, names, counts = _checked(spec, request)
            key = None
            outputs = None
            if self.cache is not None:
                key = self.cache_key(inputs, names, signature)
                outputs = self.cache.get(key)
                (self.stats.cache_miss if outputs is None else self.stats.cache_hit).add(
                    time.perf_counter_ns() - started
                )
            if outputs is None:
                work = Work(inputs, rows, names, request.id, request.parameters)
                work.handover = request.handover
                if signature:
                    work.signature = signature
                outputs = await (scheduler or self.scheduler).run(work, timings)
                if spec.reshaped_outputs:
                    outputs = validate.shape_outputs(spec, outputs, rows)
                if key is not None and self.cache is not None:
                    self.cache.put(key, outputs)
            if counts:
                outputs = classify(dict(outputs), counts, self.labels, spec.max_batch_size > 0)
        except BaseException:
            self.stats.fail.add(time.perf_counter_ns() - started)
            raise
        finally:
            self.stats.pending -= 1
        self.stats.log_success(time.perf_counter_ns() - started)
        return InferResponse(self.name, self.version_text, outputs, request.id, {}, timings)

    def infer_inline(self, request: InferRequest, pool: ThreadInstances) -> InferResponse | None:
        """``infer`` on the event loop, now, with no coroutine, Work or future, when ``pool``
        (``inline_pool``) runs a request inline now (``take_inline``); None: it does not, and
        nothing was done. The same validation, response cache, checks of the ``priority``
        and ``timeout`` parameters, statistics, timings and errors as ``infer`` through
        ``DirectScheduler``: keep the two in step."""
        executor = pool.take_inline()
        if not isinstance(executor, BatchExecutor):  # as inline_pool's are, when not None
            if executor is not None:
                pool.give_inline(-1)
            return None
        started = time.perf_counter_ns()
        elapsed = -1
        stats = self.stats
        stats.pending += 1
        try:
            spec = self.spec
            inputs, rows, names, counts = _checked(spec, request)
            key = outputs = None
            cache = self.cache
            if cache is not None:
                key = self.cache_key(inputs, names)
                outputs = cache.get(key)
                (stats.cache_miss if outputs is None else stats.cache_hit).add(
                    time.perf_counter_ns() - started
                )
            if outputs is None:
                if request.parameters:  # mostly none at all
                    check_request_parameters(request.parameters)
                begun = time.perf_counter_ns()
                try:
                    outputs = executor.execute_one(inputs, names, rows)
                except Exception as exc:
                    raise as_error(pool.name, exc) from None
                ended = time.perf_counter_ns()
                elapsed = ended - begun
                timings = Timings(begun, begun, ended)
                if spec.reshaped_outputs:
                    outputs = validate.shape_outputs(spec, outputs, rows)
                if key is not None:
                    cache.put(key, outputs)  # type: ignore[union-attr]  # set with key
            else:
                timings = Timings()
            if counts:
                outputs = classify(dict(outputs), counts, self.labels, spec.max_batch_size > 0)
        except BaseException:
            stats.fail.add(time.perf_counter_ns() - started)
            raise
        finally:
            stats.pending -= 1
            pool.give_inline(elapsed)
        if elapsed < 0:  # answered from the cache
            stats.log_success(time.perf_counter_ns() - started)
        else:
            stats.log_answer(rows, elapsed, ended, time.perf_counter_ns() - started)
        return InferResponse(self.name, self.version_text, outputs, request.id, {}, timings)

    def cache_key(self, inputs: Tensors, names: Sequence[str], signature: str = "") -> bytes:
        """The response cache's key of a request's validated inputs and outputs."""
        cached_as = self.name if not signature else f"{self.name}\0{signature}"
        return ResponseCache.key(cached_as, self.version, inputs, names)

    async def infer_stream(self, request: InferRequest) -> AsyncIterator[InferResponse]:
        """A decoupled model's responses to one request, as the model sends them; the last one
        has the parameter ``triton_final_response`` true (a model may end with no response)."""
        started = time.perf_counter_ns()
        self.stats.pending += 1
        sent: asyncio.Queue[tuple[Result, bool]] = asyncio.Queue()
        try:
            inputs, rows = validate.check_inputs(self.spec, request.inputs)
            names = validate.check_outputs(self.spec, request.output_names())
            work = Work(inputs, rows, names, request.id, request.parameters)
            work.handover = request.handover
            work.responses = lambda result, final: sent.put_nowait((result, final))
            task = asyncio.ensure_future(self.scheduler.run(work, Timings()))
            try:
                while not (task.done() and sent.empty()):
                    getter = asyncio.ensure_future(sent.get())
                    await asyncio.wait({getter, task}, return_when=asyncio.FIRST_COMPLETED)
                    if not getter.done():
                        getter.cancel()
                        continue
                    result, final = getter.result()
                    if isinstance(result, InferdError):
                        raise result
                    yield self._response(request, result, final, rows)
                last = task.result()  # the model's error, raised; or a model that is not
                if last:  # decoupled answers once
                    yield self._response(request, last, True, rows)
            finally:
                task.cancel()
        except BaseException:
            self.stats.fail.add(time.perf_counter_ns() - started)
            raise
        finally:
            self.stats.pending -= 1
        self.stats.log_success(time.perf_counter_ns() - started)

    def _response(
        self, request: InferRequest, outputs: Tensors, final: bool, rows: int
    ) -> InferResponse:
        return InferResponse(
            model_name=self.name,
            model_version=self.version_text,
            outputs=validate.shape_outputs(self.spec, outputs, rows) if outputs else {},
            id=request.id,
            parameters={"triton_final_response": final},
        )

    async def close(self) -> None:
        """Retire this version: queued work finishes, then the instances close."""
        self.state = ModelState.UNLOADING
        await self.scheduler.close()
        self.state = ModelState.UNAVAILABLE


def _checked(
    spec: ModelSpec, request: InferRequest
) -> tuple[Tensors, int, tuple[str, ...], dict[str, int] | None]:
    """A request's inputs as the model takes them, its batch size, the outputs to compute and
    the ``classification`` counts asked for (None: none), or InvalidInput naming the problem."""
    inputs, rows = validate.check_inputs(spec, request.inputs)
    requested = request.outputs
    if requested is None:  # every output, unclassified: the usual request
        return inputs, rows, spec.output_names, None
    names = validate.check_outputs(spec, [o.name for o in requested])
    return inputs, rows, names, class_counts(requested) if requested else None
