"""inferd's native form of a Python model: a class with ``load()`` and ``infer(inputs)``.

``infer`` gets whole batches (a dict of arrays, batch dimension first when the model batches)
and returns a dict of arrays, so the dynamic batcher works with it: ``BatchExecutor`` joins
the requests and splits the outputs, in the worker. The config may be left out: typed
``infer`` signatures complete it, with TypedDicts whose fields are annotated arrays::

    class Inputs(TypedDict):
        TEXT: Annotated[np.ndarray, "BYTES", [1]]

    class Model:
        max_batch_size = 16
        def infer(self, inputs: Inputs) -> Outputs: ...

The annotation gives the datatype (``"FP32"``, ``"TYPE_FP32"`` or a numpy type) and the dims
past the batch dimension.
"""

from __future__ import annotations

import inspect
import logging
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from inferd.backends.python import pb_utils
from inferd.backends.python.modelfile import where
from inferd.backends.python.triton import conform, output_types
from inferd.backends.work import Runtime
from inferd.core.errors import InternalError, ModelLoadError
from inferd.core.types import Tensors

log = logging.getLogger("inferd.scheduling")  # where a batch executor's failures are logged
_TYPE_NAMES = {value: name for name, value, _ in pb_utils._TYPES} | {14: "TYPE_BF16"}


class NativeRuntime(Runtime):
    """One instance of a native model: a batch Runtime (``BatchExecutor`` wraps it)."""

    inline = False

    def __init__(self, model_class: type[Any], path: Path, config: dict[str, Any], label: str):
        self.label = label
        self.path = path
        self._types = output_types(config)
        try:
            self.model = model_class()
            load = getattr(self.model, "load", None)
            if load is not None:
                load()
        except Exception as exc:
            raise ModelLoadError(f"model '{label}': load() raised {where(exc, path)}") from None

    def execute(self, inputs: Tensors, output_names: Sequence[str]) -> Tensors:
        try:
            returned = self.model.infer(inputs)
        except Exception as exc:
            log.error("model '%s' failed while executing", self.label, exc_info=exc)
            raise InternalError(f"model '{self.label}' failed: {where(exc, self.path)}") from None
        if not isinstance(returned, Mapping):
            raise InternalError(
                f"model '{self.label}': infer() returned {type(returned).__name__}, "
                "not a dict of arrays"
            )
        outputs: Tensors = {}
        for name in output_names:
            if name not in returned:
                raise InternalError(
                    f"model '{self.label}' returned no output '{name}' (it returned "
                    f"{', '.join(repr(n) for n in returned) or 'none'})"
                )
            outputs[name] = conform(self.label, name, returned[name], self._types.get(name))
        return outputs

    def close(self) -> None:
        unload = getattr(self.model, "unload", None)
        if unload is not None:
            unload()


def _datatype(value: Any, where: str) -> str:
    """A config data type name from an annotation's datatype."""
    if isinstance(value, str):
        name = value if value.startswith("TYPE_") else f"TYPE_{value}"
        if name == "TYPE_BYTES":
            name = "TYPE_STRING"
        if name in _TYPE_NAMES.values():
            return name
        raise ModelLoadError(f"{where}: unknown datatype '{value}'")
    try:
        enum = pb_utils.numpy_to_triton_type(value)
    except TypeError:
        enum = None
    if enum is None:
        raise ModelLoadError(f"{where}: {value!r} is not a datatype")
    return _TYPE_NAMES[enum]


def hinted_tensors(hint: Any, where: str) -> list[dict[str, Any]]:
    """The tensors a TypedDict of ``Annotated[np.ndarray, datatype, dims]`` declares."""
    if not typing.is_typeddict(hint):
        return []
    tensors = []
    for name, annotation in typing.get_type_hints(hint, include_extras=True).items():
        at = f"{where} field '{name}'"
        if typing.get_origin(annotation) is not typing.Annotated:
            raise ModelLoadError(f"{at}: annotate it as Annotated[np.ndarray, datatype, dims]")
        datatype = dims = None
        for meta in typing.get_args(annotation)[1:]:
            if isinstance(meta, list | tuple):
                dims = [int(d) for d in meta]
            elif datatype is None:
                datatype = _datatype(meta, at)
        if datatype is None or dims is None:
            raise ModelLoadError(f"{at}: its annotation needs a datatype and dims")
        tensors.append({"name": name, "data_type": datatype, "dims": dims})
    return tensors


def complete_native(
    model_class: type[Any], config: dict[str, Any], default_max_batch_size: int
) -> dict[str, Any]:
    """Fill the config's inputs, outputs and max_batch_size from ``infer``'s type hints."""
    infer = model_class.infer
    try:
        hints = typing.get_type_hints(infer, include_extras=True)
    except Exception as exc:
        raise ModelLoadError(f"the type hints of {model_class.__name__}.infer: {exc}") from None
    parameters = list(inspect.signature(infer).parameters)[1:2]  # after self
    argument = hints.get(parameters[0]) if parameters else None
    declared = {
        "input": hinted_tensors(argument, f"{model_class.__name__}.infer's inputs"),
        "output": hinted_tensors(hints.get("return"), f"{model_class.__name__}.infer's outputs"),
    }
    config = dict(config)
    listed = bool(config.get("input")) or bool(config.get("output"))
    if not listed and not int(config.get("max_batch_size") or 0):
        config["max_batch_size"] = int(
            getattr(model_class, "max_batch_size", default_max_batch_size)
        )
    for kind, tensors in declared.items():
        have = {t.get("name"): t for t in config.get(kind) or []}
        merged = list(config.get(kind) or [])
        for tensor in tensors:
            if tensor["name"] not in have:
                merged.append(tensor)
            else:
                for key in ("data_type", "dims"):
                    if have[tensor["name"]].get(key) in (None, [], "TYPE_INVALID"):
                        have[tensor["name"]][key] = tensor[key]
        config[kind] = merged
    return config
