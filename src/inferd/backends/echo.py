"""The echo backend: output *k* is input *k*, the test double of the whole execution seam.

Like httpx's ``MockTransport``, it is a real backend (``backend: "echo"``), so the schedulers,
instances, routing and protocols are tested through the same seam a framework uses, without a
model file, a framework or sleeps. Config parameters:

- ``delay_ms``: each execution takes this long (a slow model);
- ``gate``: executions wait until ``GATES[name]`` is set (a test holds a model busy exactly as
  long as it wants);
- ``error_every``: every Nth execution fails its requests (a model error);
- ``crash_every``: every Nth execution breaks its instance (``InstanceFailed``: restarted);
- ``request_level``: ``"true"`` serves through ``EchoExecutor``, which sees every request as it
  came (id, parameters, sequence controls) instead of one concatenated batch;
- ``depends_on``: ``"a,b"`` declares models this one needs loaded first, as an ensemble would.

With ``process_instances`` the model runs in worker processes, where a test can reach neither
``GATES`` nor ``LOG``; these parameters work across processes instead:

- ``gate_file``: executions wait until this file exists;
- ``log_file``: each execution appends a JSON line (instance, pid, request ids, rows, and in a
  worker process the messages that brought it jobs so far);
- ``die_every`` / ``die_by``: every Nth execution of a worker ends its process abruptly, by
  ``exit`` (``os._exit``), ``segfault``, ``kill`` (SIGKILL, as the OOM killer does) or ``abort``
  (refused outside a worker process).

Every execution is appended to ``LOG[model name]``: the instance, the request ids and rows.
Configs list the inputs; outputs default to the inputs renamed ``INPUT`` -> ``OUTPUT``.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from inferd.backends import process
from inferd.backends.base import Backend, InstancePlacement
from inferd.backends.completion import bool_parameter, check_parameters, int_parameter
from inferd.backends.work import Executed, InstanceFailed, Runtime, Work, check_rows
from inferd.config.model_config_pb2 import ModelConfig
from inferd.core.errors import ConfigError, InternalError
from inferd.core.types import Tensors

_KNOWN = {
    "delay_ms",
    "gate",
    "error_every",
    "crash_every",
    "request_level",
    "depends_on",
    "gate_file",
    "log_file",
    "die_every",
    "die_by",
}
GATE_TIMEOUT_S = 120.0  # only bounds a test gone wrong: a loaded host can take long to count
GATE_POLL_S = 0.001
_DEATHS = {"exit", "segfault", "kill", "abort"}


@dataclass(frozen=True, slots=True)
class Execution:
    """One execution, as the echo backend logs it."""

    instance: int
    request_ids: tuple[str, ...]
    rows: int
    parameters: tuple[dict[str, object], ...] = ()


@dataclass(slots=True)
class _Counter:
    value: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def next(self) -> int:
        with self.lock:
            self.value += 1
            return self.value


GATES: dict[str, threading.Event] = {}
LOG: dict[str, list[Execution]] = {}
_COUNTS: dict[str, _Counter] = {}


def gate(name: str) -> threading.Event:
    """The gate of that name (created closed)."""
    return GATES.setdefault(name, threading.Event())


def reset(model: str) -> None:
    """Forget a model's log and execution count."""
    LOG.pop(model, None)
    _COUNTS.pop(model, None)


@dataclass(frozen=True, slots=True)
class _Behaviour:
    model: str
    instance: int
    delay_s: float
    gate: str
    error_every: int
    crash_every: int
    gate_file: str = ""
    log_file: str = ""
    die_every: int = 0
    die_by: str = "exit"

    @classmethod
    def of(cls, config: ModelConfig, instance: int) -> _Behaviour:
        params = {k: v.string_value for k, v in config.parameters.items()}
        check_parameters(params, _KNOWN, "echo", config.name)
        behaviour = cls(
            config.name,
            instance,
            int_parameter(params, "delay_ms", 0) / 1000,
            params.get("gate", ""),
            int_parameter(params, "error_every", 0),
            int_parameter(params, "crash_every", 0),
            params.get("gate_file", ""),
            params.get("log_file", ""),
            int_parameter(params, "die_every", 0),
            params.get("die_by", "exit"),
        )
        if behaviour.die_by not in _DEATHS:
            raise ConfigError(f"echo die_by must be one of {', '.join(sorted(_DEATHS))}")
        if behaviour.die_every and process.current() is None:
            raise ConfigError("echo die_every needs process_instances: it ends the process")
        return behaviour

    def run(self, batch: Sequence[Work], rows: int) -> None:
        """Wait, log, and fail as configured (raises)."""
        if self.gate and not gate(self.gate).wait(GATE_TIMEOUT_S):
            raise InternalError(f"echo gate '{self.gate}' stayed closed")
        if self.gate_file:
            self._wait_for_file()
        if self.delay_s:
            time.sleep(self.delay_s)
        number = _COUNTS.setdefault(self.model, _Counter()).next()
        LOG.setdefault(self.model, []).append(
            Execution(
                self.instance,
                tuple(w.request_id for w in batch),
                rows,
                tuple(dict(w.parameters) for w in batch),
            )
        )
        if self.log_file:
            line = {
                "instance": self.instance,
                "pid": os.getpid(),
                "request_ids": [w.request_id for w in batch],
                "rows": rows,
                "handovers": host.handovers if (host := process.current()) is not None else 0,
            }
            with open(self.log_file, "a") as log:
                log.write(json.dumps(line) + "\n")
        if self.die_every and number % self.die_every == 0:
            _die(self.die_by)
        if self.crash_every and number % self.crash_every == 0:
            raise InstanceFailed(f"echo instance {self.instance} crashed (execution {number})")
        if self.error_every and number % self.error_every == 0:
            raise InternalError(f"echo failed on purpose (execution {number})")

    def _wait_for_file(self) -> None:
        deadline = time.monotonic() + GATE_TIMEOUT_S
        while not os.path.exists(self.gate_file):
            if time.monotonic() > deadline:
                raise InternalError(f"echo gate file '{self.gate_file}' never appeared")
            time.sleep(GATE_POLL_S)


def _die(how: str) -> None:
    """End this (worker) process the way a broken model would."""
    if how == "segfault":
        os.kill(os.getpid(), signal.SIGSEGV)
    elif how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif how == "abort":
        os.abort()
    os._exit(7)


def _pairs(config: ModelConfig) -> list[tuple[str, str]]:
    return [(o.name, i.name) for o, i in zip(config.output, config.input, strict=False)]


class EchoRuntime(Runtime):
    """The batch form: one concatenated batch in, the same arrays out."""

    inline = True

    def __init__(self, config: ModelConfig, instance: int) -> None:
        self._behaviour = _Behaviour.of(config, instance)
        self._pairs = _pairs(config)
        self._batched = config.max_batch_size > 0

    def execute(self, inputs: Tensors, output_names: Sequence[str]) -> Tensors:
        first = next(iter(inputs.values()))
        rows = len(first) if self._batched and first.ndim else 0
        self._behaviour.run([Work(inputs, rows, tuple(output_names))], rows)
        out = {o: inputs[i] for o, i in self._pairs if i in inputs}
        return {name: out[name] for name in output_names}

    def close(self) -> None:
        pass


class EchoExecutor:
    """The request-level form: each request answered on its own, its id and parameters seen."""

    inline = False

    def __init__(self, config: ModelConfig, instance: int) -> None:
        self._behaviour = _Behaviour.of(config, instance)
        self._pairs = _pairs(config)
        self.closed = False

    def execute(self, batch: Sequence[Work]) -> Executed:
        started = time.perf_counter_ns()
        self._behaviour.run(batch, sum(w.rows for w in batch))
        results: list[Tensors | InternalError] = []
        for work in batch:
            out = {o: work.inputs[i] for o, i in self._pairs if i in work.inputs}
            answer = {name: out[name] for name in work.outputs}
            if work.rows:
                check_rows(self._behaviour.model, answer, work.rows)
            results.append(answer)
        return Executed(list(results), 0, time.perf_counter_ns() - started, 0)

    def close(self) -> None:
        self.closed = True


class EchoBackend(Backend):
    name = "echo"
    platforms: tuple[str, ...] = ()
    default_filename = ""

    def dependencies(self, config: ModelConfig) -> list[str]:
        """The models named by the ``depends_on`` parameter."""
        text = (
            config.parameters["depends_on"].string_value
            if "depends_on" in config.parameters
            else ""
        )
        return [name.strip() for name in text.split(",") if name.strip()]

    def complete_config(
        self, version_dir: Path, config: ModelConfig, default_max_batch_size: int
    ) -> None:
        if not config.input:
            raise ConfigError("an echo model lists its inputs in config.pbtxt")
        if not config.output:
            for tensor in config.input:
                output = config.output.add()
                output.name = tensor.name.replace("INPUT", "OUTPUT")
                output.data_type = tensor.data_type
                output.dims.extend(tensor.dims)
        if not config.backend:
            config.backend = self.name

    def load(
        self, version_dir: Path, config: ModelConfig, placement: InstancePlacement
    ) -> EchoRuntime:
        return EchoRuntime(config, placement.index)

    def load_executor(
        self, version_dir: Path, config: ModelConfig, placement: InstancePlacement
    ) -> EchoExecutor | None:
        """A request-level executor when the config asks for one (else None: ``load``)."""
        params = {k: v.string_value for k, v in config.parameters.items()}
        if not bool_parameter(params, "request_level"):
            return None
        return EchoExecutor(config, placement.index)
