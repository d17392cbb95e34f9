"""Triton ensembles: the step graph read from ``ensemble_scheduling`` and the scheduler that
runs it as a DAG, each step a request to its composing model through the data plane.

A step starts once every tensor it reads exists; independent steps run concurrently on the
event loop. Tensors pass between steps as the same numpy arrays (no copies), and each step
goes through its composing model's own scheduler, so that model batches the steps of many
ensemble requests together.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass

from inferd.backends.work import Work
from inferd.config.model_config_pb2 import ModelConfig
from inferd.config.spec import datatype_of
from inferd.core.datatypes import DataType, of_array
from inferd.core.errors import ConfigError, InferdError, InternalError
from inferd.core.stats import ModelStats
from inferd.core.types import (
    LABEL_PARAMETER,
    InferRequest,
    ModelCaller,
    Parameters,
    RequestedOutput,
    Tensors,
    Timings,
)

ENSEMBLE_PLATFORM = "ensemble"
_NEEDED_CACHE_SIZE = 64  # sets of requested outputs whose steps are remembered


@dataclass(frozen=True, slots=True)
class Step:
    """One composing model call: which ensemble tensor feeds each of its inputs, and which
    ensemble tensor each of its outputs becomes."""

    index: int
    model_name: str
    model_version: str  # "" : the model's default version (Triton's -1)
    inputs: Mapping[str, str]  # model input -> ensemble tensor
    outputs: Mapping[str, str]  # model output -> ensemble tensor
    reads: tuple[str, ...] = ()  # the ensemble tensors it reads (the values of ``inputs``)

    @property
    def label(self) -> str:
        return f"step {self.index} (model '{self.model_name}')"


@dataclass(frozen=True, slots=True)
class EnsembleGraph:
    """The steps of an ensemble, checked: every tensor a step reads is an ensemble input or
    made by exactly one step, every ensemble output is made, and the steps form no cycle."""

    name: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    steps: tuple[Step, ...]  # in an order where each step follows the steps it reads from
    producer: Mapping[str, int]  # ensemble tensor -> index into ``steps`` that makes it
    datatypes: Mapping[str, DataType]  # ensemble output -> the datatype its config declares

    def models(self) -> list[str]:
        """The composing models, each once, in step order."""
        return list(dict.fromkeys(step.model_name for step in self.steps))

    def needed(self, outputs: tuple[str, ...]) -> list[Step]:
        """The steps needed to make ``outputs`` (in graph order)."""
        wanted: set[int] = set()
        frontier = [self.producer[name] for name in outputs if name in self.producer]
        while frontier:
            index = frontier.pop()
            if index in wanted:
                continue
            wanted.add(index)
            frontier.extend(
                self.producer[t] for t in self.steps[index].inputs.values() if t in self.producer
            )
        return [step for i, step in enumerate(self.steps) if i in wanted]


def build_graph(config: ModelConfig) -> EnsembleGraph:
    """Read and check ``ensemble_scheduling`` (ConfigError naming the step or the tensor)."""
    name = config.name
    if config.platform != ENSEMBLE_PLATFORM:
        raise ConfigError('ensemble_scheduling needs platform: "ensemble"')
    if not config.HasField("ensemble_scheduling") or not config.ensemble_scheduling.step:
        raise ConfigError("an ensemble needs ensemble_scheduling with at least one step")
    present = {
        "dynamic_batching": config.HasField("dynamic_batching"),
        "response_cache": config.response_cache.enable,
        "model_warmup": len(config.model_warmup) > 0,
        "instance_group": len(config.instance_group) > 0,
    }
    for field, there in present.items():
        if there:
            raise ConfigError(f"config field '{field}' does not apply to an ensemble")
    inputs = tuple(t.name for t in config.input)
    outputs = tuple(t.name for t in config.output)
    made: dict[str, str] = {t: "an ensemble input" for t in inputs}
    steps: list[Step] = []
    for index, raw in enumerate(config.ensemble_scheduling.step):
        where = f"step {index}" + (f" (model '{raw.model_name}')" if raw.model_name else "")
        if not raw.model_name:
            raise ConfigError(f"ensemble_scheduling {where}: model_name is missing")
        if raw.model_name == name:
            raise ConfigError(f"ensemble_scheduling {where}: an ensemble cannot call itself")
        if raw.model_namespace:
            raise ConfigError(f"ensemble_scheduling {where}: model_namespace is not supported")
        if not raw.input_map or not raw.output_map:
            raise ConfigError(f"ensemble_scheduling {where}: input_map and output_map are needed")
        version = "" if raw.model_version <= 0 else str(raw.model_version)
        for model_output, tensor in sorted(raw.output_map.items()):
            if tensor in made:
                raise ConfigError(
                    f"ensemble_scheduling {where}: output '{model_output}' maps to tensor "
                    f"'{tensor}', which is already {made[tensor]}"
                )
            made[tensor] = f"made by {where}"
        reads = dict(raw.input_map)
        steps.append(
            Step(
                index,
                raw.model_name,
                version,
                reads,
                dict(raw.output_map),
                tuple(reads.values()),
            )
        )
    producer_step = {t: s.index for s in steps for t in s.outputs.values()}
    for step in steps:
        for model_input, tensor in sorted(step.inputs.items()):
            if tensor not in made:
                raise ConfigError(
                    f"ensemble_scheduling {step.label}: input '{model_input}' reads tensor "
                    f"'{tensor}', which is neither an ensemble input nor made by a step"
                )
    for tensor in outputs:
        if tensor not in producer_step:
            raise ConfigError(
                f"ensemble output '{tensor}' is not made by any step"
                + (" (it is an ensemble input)" if tensor in inputs else "")
            )
    ordered = _order(steps, producer_step)
    producer = {t: i for i, s in enumerate(ordered) for t in s.outputs.values()}
    declared = {t.name: datatype_of(t.data_type, f"output '{t.name}'") for t in config.output}
    return EnsembleGraph(name, inputs, outputs, tuple(ordered), producer, declared)


def _order(steps: list[Step], producer: Mapping[str, int]) -> list[Step]:
    """The steps in dependency order (ConfigError naming a cycle)."""
    after = {s.index: {producer[t] for t in s.inputs.values() if t in producer} for s in steps}
    ordered: list[Step] = []
    done: set[int] = set()
    while len(done) < len(steps):
        ready = [s for s in steps if s.index not in done and after[s.index] <= done]
        if not ready:
            stuck = [s for s in steps if s.index not in done]
            raise ConfigError(
                "ensemble_scheduling steps form a cycle: "
                + ", ".join(
                    f"{s.label} reads {sorted(t for t in s.inputs.values() if t in producer)}"
                    for s in stuck
                )
            )
        ordered.extend(ready)
        done.update(s.index for s in ready)
    return ordered


class EnsembleScheduler:
    """Runs one ensemble request: steps as soon as their inputs exist, through ``call``."""

    def __init__(self, graph: EnsembleGraph, call: ModelCaller, stats: ModelStats) -> None:
        self.graph = graph
        self.call = call
        self.stats = stats
        self._needed: dict[tuple[str, ...], list[Step]] = {}  # requested outputs -> steps

    async def run(self, work: Work, timings: Timings) -> Tensors:
        started = timings.queue_start_ns = timings.compute_start_ns = time.perf_counter_ns()
        tensors: Tensors = dict(work.inputs)
        steps = self._needed.get(work.outputs)
        if steps is None:
            steps = self.graph.needed(work.outputs)
            if len(self._needed) < _NEEDED_CACHE_SIZE:
                self._needed[work.outputs] = steps
        # A version label picks the ensemble's version, not its composing models'.
        parameters = {k: v for k, v in work.parameters.items() if k != LABEL_PARAMETER}
        running: dict[asyncio.Task[Tensors], Step] = {}
        waiting = list(steps)
        try:
            while waiting or running:
                ready = [s for s in waiting if all(t in tensors for t in s.reads)]
                for step in ready:
                    waiting.remove(step)
                if len(ready) == 1 and not running:  # a chain: no task needed
                    tensors.update(await self._step(ready[0], tensors, work, parameters))
                    continue
                for step in ready:
                    task = asyncio.ensure_future(self._step(step, tensors, work, parameters))
                    running[task] = step
                if not running:  # an optional ensemble input left a step without its tensors
                    missing = sorted({t for s in waiting for t in s.reads if t not in tensors})
                    raise InferdError(
                        f"ensemble '{self.graph.name}' {waiting[0].label} cannot run: "
                        f"tensor(s) {missing} were not given"
                    )
                done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    running.pop(task)
                    tensors.update(task.result())
        finally:
            for task in running:
                task.cancel()
        ended = timings.compute_end_ns = time.perf_counter_ns()
        self.stats.record_execution(work.rows or 1, 1, 0, ended - started, 0)
        outputs = {name: tensors[name] for name in work.outputs}
        for name, array in outputs.items():
            declared = self.graph.datatypes[name]
            if array.dtype != declared.numpy and not (
                declared.is_bytes and array.dtype.kind in "OSU"
            ):
                step = self.graph.steps[self.graph.producer[name]]
                raise InternalError(
                    f"ensemble '{self.graph.name}' {step.label} made output '{name}' as "
                    f"{of_array(array).name}, but the ensemble declares {declared.name}"
                )
        return outputs

    async def _step(
        self, step: Step, tensors: Tensors, work: Work, parameters: Parameters
    ) -> Tensors:
        request = InferRequest(
            model_name=step.model_name,
            model_version=step.model_version,
            inputs={model_input: tensors[t] for model_input, t in step.inputs.items()},
            id=work.request_id,
            outputs=[RequestedOutput(name) for name in step.outputs],
            parameters=parameters,
        )
        try:
            response = await self.call(request)
        except InferdError as exc:
            raise type(exc)(f"ensemble '{self.graph.name}' {step.label}: {exc.message}") from None
        made: Tensors = {}
        for model_output, tensor in step.outputs.items():
            array = response.outputs.get(model_output)
            if array is None:
                raise InternalError(
                    f"ensemble '{self.graph.name}' {step.label} gave no output '{model_output}'"
                )
            made[tensor] = array
        return made

    async def close(self) -> None:
        return None
