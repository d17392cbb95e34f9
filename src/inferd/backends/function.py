"""The function backend: a Python function bound in this process (``inferd.Server.bind``) served
as a model, with no model file.

A bound function takes a list of requests (each a mapping of input name to numpy array, with
the request's ``parameters``) and returns one mapping of output name to array per request, so
the dynamic batcher hands it every request of a batch as it came. A decoupled model's function
(``model_transaction_policy { decoupled: true }``) is a generator instead: each list it yields
(one dict per request, or None for a request with nothing to send this time) is a response to
each request, sent at once; its end is every request's final flag. Instances are threads of
this process; instance *i* runs the *i*-th function bound (one function serves them all when
only one was given). Only code already running in the server's process binds a function: a
config naming ``backend: "function"`` with no function bound under its name does not load.
"""

from __future__ import annotations

import inspect
import secrets
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from inferd.backends.base import Backend, InstancePlacement
from inferd.backends.completion import require_listed
from inferd.backends.python.triton import output_types, wanted_outputs
from inferd.backends.work import Executed, Result, Work, as_error, check_rows
from inferd.config.model_config_pb2 import ModelConfig
from inferd.config.text import config_to_dict
from inferd.core.errors import ConfigError, InferdError, InternalError
from inferd.core.types import Parameters, Tensors

# One response per request (a list), or, decoupled, a generator of such lists.
InferFunction = Callable[[list["FunctionRequest"]], Iterable[Any]]

# The parameter of a bound model's config that names its functions here: a random key that
# ``bind`` returns, so a config from anywhere else (a load over the network) names none.
KEY_PARAMETER = "bound_function_key"

_bound: dict[str, list[InferFunction]] = {}
_lock = threading.Lock()


def bind(functions: Sequence[InferFunction]) -> str:
    """Hold ``functions`` (one per instance, or one for all); returns their key."""
    if not functions or not all(callable(f) for f in functions):
        raise ConfigError("bind a function, or a list of functions")
    key = secrets.token_hex(16)
    with _lock:
        _bound[key] = list(functions)
    return key


def unbind(key: str) -> None:
    with _lock:
        _bound.pop(key, None)


def bound(config: ModelConfig) -> list[InferFunction]:
    """The functions a model's config names (its ``bound_function_key`` parameter)."""
    key = (
        config.parameters[KEY_PARAMETER].string_value if KEY_PARAMETER in config.parameters else ""
    )
    with _lock:
        functions = _bound.get(key)
    if functions is None:
        raise ConfigError(
            f"model '{config.name}' names the function backend, but no function of this "
            "process is bound to it (inferd.Server.bind binds one)"
        )
    return functions


@dataclass(slots=True)
class FunctionRequest(MutableMapping[str, np.ndarray]):
    """One request as a bound function sees it: its inputs by name (the function may add or
    replace some), and its parameters."""

    data: Tensors
    parameters: Parameters = field(default_factory=dict)
    requested_output_names: list[str] | None = None
    request_id: str = ""

    def __getitem__(self, name: str) -> np.ndarray:
        return self.data[name]

    def __setitem__(self, name: str, value: np.ndarray) -> None:
        self.data[name] = value

    def __delitem__(self, name: str) -> None:
        del self.data[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.data)

    def __len__(self) -> int:
        return len(self.data)


class FunctionExecutor:
    """One instance: the requests of a batch in, through the function, one result each out."""

    inline = False

    def __init__(self, label: str, function: InferFunction, config: ModelConfig) -> None:
        self.label = label
        self.function = function
        self._types = output_types(config_to_dict(config))
        self._decoupled = config.model_transaction_policy.decoupled

    def execute(self, batch: Sequence[Work]) -> Executed:
        requests = [
            FunctionRequest(dict(w.inputs), dict(w.parameters), list(w.outputs), w.request_id)
            for w in batch
        ]
        started = time.perf_counter_ns()
        if self._decoupled:
            return self._stream(batch, requests, started)
        try:
            returned = self.function(requests)
            if inspect.isgenerator(returned):
                raise InternalError(
                    f"model '{self.label}': the function is a generator, which only a "
                    "decoupled model may be"
                )
            answers = list(returned)
        except Exception as exc:
            error = as_error(self.label, exc)
            return Executed([error] * len(batch), 0, time.perf_counter_ns() - started)
        infer_ns = time.perf_counter_ns() - started
        if len(answers) != len(batch):
            error = InternalError(
                f"model '{self.label}' returned {len(answers)} responses for {len(batch)} requests"
            )
            return Executed([error] * len(batch), 0, infer_ns)
        results = [self._result(work, answer) for work, answer in zip(batch, answers, strict=True)]
        return Executed(results, 0, infer_ns, 0)

    def _stream(
        self, batch: Sequence[Work], requests: list[FunctionRequest], started: int
    ) -> Executed:
        """A decoupled call: each yielded list answers the requests at once; the requests'
        own results are then empty (their responses have gone)."""
        try:
            for yielded in self.function(requests):
                answers: list[Any] = list(yielded)
                if len(answers) != len(batch):
                    raise InternalError(
                        f"model '{self.label}' yielded {len(answers)} responses for "
                        f"{len(batch)} requests"
                    )
                for work, answer in zip(batch, answers, strict=True):
                    if answer is not None and work.responses is not None:
                        work.responses(self._result(work, answer), False)
        except Exception as exc:
            error = as_error(self.label, exc)
            return Executed([error] * len(batch), 0, time.perf_counter_ns() - started)
        for work in batch:
            if work.responses is not None:
                work.responses({}, True)
        return Executed([{} for _ in batch], 0, time.perf_counter_ns() - started)

    def _result(self, work: Work, answer: Mapping[str, Any]) -> Result:
        try:
            if not isinstance(answer, Mapping):
                raise InternalError(
                    f"model '{self.label}' returned {type(answer).__name__} for a request, "
                    "not a dict of arrays"
                )
            outputs = wanted_outputs(self.label, work.outputs, answer, self._types)
            if work.rows:
                check_rows(self.label, outputs, work.rows)
            return outputs
        except InferdError as exc:
            return exc

    def close(self) -> None:
        pass


class FunctionBackend(Backend):
    name = "function"
    platforms: tuple[str, ...] = ()
    default_filename = ""

    def complete_config(
        self, version_dir: Path, config: ModelConfig, default_max_batch_size: int
    ) -> None:
        bound(config)
        require_listed(config, f"function model '{config.name}'")
        if not config.backend:
            config.backend = self.name

    def load_executor(
        self, version_dir: Path, config: ModelConfig, placement: InstancePlacement
    ) -> FunctionExecutor:
        functions = bound(config)
        function = functions[placement.index % len(functions)]
        return FunctionExecutor(f"{config.name}/{version_dir.name}", function, config)

    def load(self, version_dir: Path, config: ModelConfig, placement: InstancePlacement) -> Any:
        raise ConfigError(f"function model '{config.name}' runs through its executor")
