"""Binding a Python function as a model (``inferd.Server.bind``): its model config, built from
the tensors, batch size, batching and instances given, and its load through the model manager
(the same load, scheduler and instances as a model from the repository)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from inferd.backends import function
from inferd.config.model_config_pb2 import ModelConfig
from inferd.config.text import parse_config_json
from inferd.core import datatypes
from inferd.core.errors import ConfigError, InvalidInput, ModelLoadError
from inferd.repository.manager import ModelManager

# The one file of a bound model's version folder (the function is in memory, not in a file).
_MARKER = "bound-function"


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """An input or output of a bound function: name, dtype (numpy, or "FP32"), shape past
    the batch dimension (-1: any size)."""

    name: str
    dtype: Any
    shape: tuple[int, ...]


def _spec(tensor: Any) -> TensorSpec:
    if isinstance(tensor, TensorSpec):
        return tensor
    if isinstance(tensor, tuple) and len(tensor) == 3:
        return TensorSpec(str(tensor[0]), tensor[1], tuple(int(d) for d in tensor[2]))
    if all(hasattr(tensor, a) for a in ("name", "dtype", "shape")):
        return TensorSpec(str(tensor.name), tensor.dtype, tuple(int(d) for d in tensor.shape))
    raise ConfigError(f"a tensor is (name, dtype, shape), not {tensor!r}")


def config_name(dtype: Any) -> str:
    """Triton's config data type name (TYPE_FP32) of a numpy dtype or a KServe name."""
    try:
        if isinstance(dtype, str) and dtype.upper() == dtype:
            name = dtype.removeprefix("TYPE_")
            return datatypes.from_name("BYTES" if name == "STRING" else name).config_name
        if dtype in (bytes, str, object):
            return datatypes.BYTES.config_name
        return datatypes.from_numpy(np.dtype(dtype)).config_name
    except (InvalidInput, TypeError) as exc:
        raise ConfigError(f"dtype {dtype!r} has no inference datatype ({exc})") from None


def _tensors(tensors: Sequence[Any], which: str, model: str) -> list[dict[str, Any]]:
    specs = [_spec(t) for t in tensors]
    if not specs:
        raise ConfigError(f"model '{model}': bind at least one {which}")
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise ConfigError(f"model '{model}': {which} names repeat ({', '.join(names)})")
    return [
        {"name": s.name, "data_type": config_name(s.dtype), "dims": list(s.shape) or [1]}
        for s in specs
    ]


def function_config(
    name: str,
    inputs: Sequence[Any],
    outputs: Sequence[Any],
    *,
    max_batch_size: int = 0,
    dynamic_batching: bool | Mapping[str, Any] = False,
    instances: int = 1,
    extra: Mapping[str, Any] | None = None,
) -> ModelConfig:
    """The model config of a bound function (``extra``: more of Triton's config fields)."""
    doc: dict[str, Any] = {
        "name": name,
        "backend": function.FunctionBackend.name,
        "max_batch_size": max_batch_size,
        "input": _tensors(inputs, "input", name),
        "output": _tensors(outputs, "output", name),
        "instance_group": [{"count": instances, "kind": "KIND_CPU"}],
    }
    if dynamic_batching:
        if max_batch_size <= 0:
            raise ConfigError(f"model '{name}': dynamic batching needs max_batch_size > 0")
        doc["dynamic_batching"] = (
            dict(dynamic_batching) if isinstance(dynamic_batching, Mapping) else {}
        )
    doc.update(extra or {})
    return parse_config_json(doc, f"model '{name}'")


async def load_function(
    manager: ModelManager,
    config: ModelConfig,
    functions: Sequence[Any],
    max_bytes: int,
    version: int = 1,
) -> str:
    """Bind the functions and load the model with their key (raises the load's error);
    returns the key (``function.unbind`` it once the model is gone)."""
    name = config.name
    key = function.bind(functions)
    config.parameters[function.KEY_PARAMETER].string_value = key
    try:
        outcome = await manager.load_files(
            name, config, {f"{int(version)}/{_MARKER}": b""}, max_bytes
        )
    except BaseException:
        function.unbind(key)
        raise
    if not outcome.ok:
        function.unbind(key)
        raise ModelLoadError(f"failed to load model '{name}': {outcome.reason}")
    return key


class BoundFunctions:
    """A server's bound functions: binds and loads them, and releases them when the server
    stops (a function bound again under a model's name replaces the one before)."""

    def __init__(self, manager: ModelManager, max_bytes: int) -> None:
        self.manager = manager
        self.max_bytes = max_bytes
        self._keys: dict[str, str] = {}  # model name -> its functions' key

    async def bind(
        self,
        name: str,
        infer_func: Any,
        inputs: Sequence[Any],
        outputs: Sequence[Any],
        *,
        max_batch_size: int = 0,
        dynamic_batching: bool | Mapping[str, Any] = False,
        config: Mapping[str, Any] | None = None,
        version: int = 1,
    ) -> None:
        functions = list(infer_func) if isinstance(infer_func, Sequence) else [infer_func]
        built = function_config(
            name,
            inputs,
            outputs,
            max_batch_size=max_batch_size,
            dynamic_batching=dynamic_batching,
            instances=len(functions),
            extra=config,
        )
        key = await load_function(self.manager, built, functions, self.max_bytes, version)
        replaced = self._keys.get(name)
        self._keys[name] = key
        if replaced is not None:
            function.unbind(replaced)

    def close(self) -> None:
        for key in self._keys.values():
            function.unbind(key)
        self._keys.clear()
