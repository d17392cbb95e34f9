"""PyTorch backend: TorchScript (``model.pt``, ``torch.jit.save``) and ``torch.export``
programs (``model.pt2``, ``torch.export.save``), on the CPU or a CUDA device.

Tensor names: a config input whose name is an argument of ``forward`` is passed as that
argument; otherwise Triton's ``NAME__<index>`` convention gives its position, and else the
config's order does. Outputs: a dict is read by name, a tuple or list by ``__<index>`` or the
config's order, a single tensor is the one output. A TorchScript file carries no reliable
tensor metadata, so its config must list every input and output; an exported program's
inputs and outputs (``OUTPUT__0``...) are read from the program itself.

Threads: ``torch.set_num_threads`` gets the machine's cores shared among instances (parameter
``intra_op_thread_count`` overrides it); torch releases the GIL inside its ops, so instances
run on worker threads.
"""

from __future__ import annotations

import logging
import re
import threading
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from inferd.backends.base import Backend, InstancePlacement
from inferd.backends.completion import (
    TensorIO,
    check_parameters,
    complete,
    int_parameter,
    missing_extra,
    model_file,
    require_listed,
    string_parameters,
)
from inferd.backends.work import Runtime
from inferd.config.model_config_pb2 import ModelConfig
from inferd.config.spec import datatype_of
from inferd.core import datatypes
from inferd.core.errors import ConfigError, InternalError, ModelLoadError
from inferd.core.types import Tensors

log = logging.getLogger("inferd.backends.torch")

PLATFORM = "pytorch_libtorch"
_KNOWN_PARAMETERS = {"intra_op_thread_count"}
_INDEXED = re.compile(r"^.+__(\d+)$")
_FILENAMES = ("model.pt", "model.pt2")
_thread_lock = threading.Lock()
_interop_set = False

# Arrays decoded from a request are often read-only views of the body; the model never writes
# its inputs (inference mode), so torch's warning about sharing them would only be noise.
warnings.filterwarnings("ignore", message="The given NumPy array is not writable")


def _torch() -> Any:
    try:
        import torch
    except ImportError as exc:
        raise missing_extra("PyTorch", "torch", exc) from None
    return torch


def _path(version_dir: Path, config: ModelConfig) -> Path:
    return model_file(version_dir, config, _FILENAMES)


def _is_exported(path: Path) -> bool:
    return path.suffix == ".pt2"


def _exported_io(path: Path) -> tuple[list[TensorIO], list[TensorIO]]:
    """Inputs (forward's argument names) and outputs (OUTPUT__i) of a torch.export program."""
    torch = _torch()
    try:
        program = torch.export.load(str(path))
    except Exception as exc:
        raise ModelLoadError(f"torch.export cannot load {path.name}: {exc}") from None
    signature = program.graph_signature
    values = {node.name: node.meta.get("val") for node in program.graph.nodes}
    inputs = [_io(name, values.get(name), torch) for name in signature.user_inputs]
    outputs = [
        _io(f"OUTPUT__{i}", values.get(name), torch)
        for i, name in enumerate(signature.user_outputs)
    ]
    return inputs, outputs


def _io(name: str, value: Any, torch: Any) -> TensorIO:
    if value is None or not hasattr(value, "dtype"):
        raise ConfigError(f"exported program tensor '{name}' has no tensor metadata; list it")
    shape = tuple(d if isinstance(d, int) else -1 for d in value.shape)
    return TensorIO(name, _datatype(value.dtype, torch, name), shape)


def _datatype(dtype: Any, torch: Any, name: str) -> datatypes.DataType:
    if dtype == torch.bfloat16:
        return datatypes.BY_NAME["BF16"]
    try:
        numpy_dtype = torch.empty((), dtype=dtype).numpy().dtype
        return datatypes.from_numpy(numpy_dtype)
    except Exception:
        raise ConfigError(f"tensor '{name}' has dtype {dtype}, which inferd cannot serve") from None


class TorchBackend(Backend):
    name = "pytorch"
    platforms: tuple[str, ...] = (PLATFORM,)
    default_filename = "model.pt"

    def gpu_available(self) -> bool:
        try:
            import torch
        except ImportError:
            return False
        return bool(torch.cuda.is_available())

    def complete_config(
        self, version_dir: Path, config: ModelConfig, default_max_batch_size: int
    ) -> None:
        path = _path(version_dir, config)
        if _is_exported(path):
            inputs, outputs = _exported_io(path)
            complete(
                config,
                inputs,
                outputs,
                default_max_batch_size,
                platform=PLATFORM,
                backend=self.name,
            )
            return
        require_listed(
            config,
            f"TorchScript {path.name} carries no reliable input/output names or types "
            "(or save the model with torch.export as model.pt2, whose tensors are read)",
        )
        if not config.platform:
            config.platform = PLATFORM
        if not config.backend:
            config.backend = self.name

    def load(
        self, version_dir: Path, config: ModelConfig, placement: InstancePlacement
    ) -> TorchRuntime:
        torch = _torch()
        params = string_parameters(config)
        check_parameters(params, _KNOWN_PARAMETERS, "pytorch", config.name)
        for name, data_type in _declared(config):
            if datatype_of(data_type, f"tensor '{name}'").is_bytes:
                raise ConfigError(f"tensor '{name}': PyTorch has no BYTES (string) tensors")
        _set_threads(torch, int_parameter(params, "intra_op_thread_count", placement.cpu_threads()))
        device = f"cuda:{placement.device_id}" if placement.kind == "GPU" else "cpu"
        path = _path(version_dir, config)
        if not path.is_file():
            raise ModelLoadError(f"no model file {path.name} in version folder {version_dir.name}")
        try:
            if _is_exported(path):
                program = torch.export.load(str(path))
                module = program.module()
                arg_names = list(program.graph_signature.user_inputs)
            else:
                module = torch.jit.load(str(path), map_location=device)
                module.eval()
                arg_names = [a.name for a in module.forward.schema.arguments[1:]]
        except Exception as exc:
            raise ModelLoadError(f"PyTorch cannot load {path.name}: {exc}") from None
        if _is_exported(path) and device != "cpu":
            module = module.to(device)
        # An exported program's module takes its inputs by position only.
        keywords = not _is_exported(path)
        return TorchRuntime(torch, module, config, arg_names, device, keywords)


def _declared(config: ModelConfig) -> list[tuple[str, int]]:
    inputs = [(t.name, int(t.data_type)) for t in config.input]
    return inputs + [(t.name, int(t.data_type)) for t in config.output]


def _set_threads(torch: Any, threads: int) -> None:
    global _interop_set
    with _thread_lock:
        if threads > 0:
            torch.set_num_threads(threads)
        if not _interop_set:
            _interop_set = True
            try:
                torch.set_num_interop_threads(1)
            except RuntimeError:  # already fixed once parallel work has started
                log.debug("torch inter-op threads already set")


def _positions(names: Sequence[str], arg_names: Sequence[str], keywords: bool) -> list[int | str]:
    """Where each config input goes: a keyword (forward's argument) or a position."""
    found: list[int | str] = []
    for order, name in enumerate(names):
        if name in arg_names:
            found.append(name if keywords else list(arg_names).index(name))
        elif (match := _INDEXED.match(name)) is not None:
            found.append(int(match.group(1)))
        else:
            found.append(order)
    return found


class TorchRuntime(Runtime):
    """One loaded module; forward runs in inference mode on whole batches."""

    inline = True

    def __init__(
        self,
        torch: Any,
        module: Any,
        config: ModelConfig,
        arg_names: Sequence[str],
        device: str,
        keywords: bool = True,
    ) -> None:
        self._torch = torch
        self._module = module
        self._device = device
        self._inputs = [t.name for t in config.input]
        self._places = _positions(self._inputs, arg_names, keywords)
        self._outputs = [t.name for t in config.output]
        self._output_index = {
            name: int(m.group(1)) if (m := _INDEXED.match(name)) else i
            for i, name in enumerate(self._outputs)
        }

    def _tensor(self, array: np.ndarray) -> Any:
        torch = self._torch
        if array.dtype.name == "bfloat16":
            tensor = torch.from_numpy(np.ascontiguousarray(array).view(np.int16)).view(
                torch.bfloat16
            )
        else:
            tensor = torch.from_numpy(np.ascontiguousarray(array))
        return tensor if self._device == "cpu" else tensor.to(self._device)

    def _array(self, tensor: Any) -> np.ndarray:
        torch = self._torch
        tensor = tensor.detach()
        if self._device != "cpu":
            tensor = tensor.cpu()
        if tensor.dtype == torch.bfloat16:
            bits: np.ndarray = tensor.view(torch.int16).numpy()
            return bits.view(datatypes.BY_NAME["BF16"].numpy)
        array: np.ndarray = tensor.numpy()
        return array

    def execute(self, inputs: Tensors, output_names: Sequence[str]) -> Tensors:
        args: dict[int, Any] = {}
        kwargs: dict[str, Any] = {}
        for name, place in zip(self._inputs, self._places, strict=True):
            if name not in inputs:
                continue
            if isinstance(place, str):
                kwargs[place] = self._tensor(inputs[name])
            else:
                args[place] = self._tensor(inputs[name])
        positional = [args[i] for i in sorted(args)]
        try:
            with self._torch.inference_mode():
                result = self._module(*positional, **kwargs)
        except Exception as exc:
            raise InternalError(f"PyTorch forward failed: {exc}") from None
        return {name: self._array(self._pick(result, name)) for name in output_names}

    def _pick(self, result: Any, name: str) -> Any:
        if isinstance(result, dict):
            if name not in result:
                raise InternalError(
                    f"the model returned no output '{name}'; it returned {', '.join(result)}"
                )
            return result[name]
        if isinstance(result, list | tuple):
            index = self._output_index[name]
            if index >= len(result):
                raise InternalError(
                    f"output '{name}' is result {index}, but the model returned {len(result)}"
                )
            return result[index]
        if len(self._outputs) != 1:
            raise InternalError(
                f"the model returned one tensor but the config lists {len(self._outputs)} outputs"
            )
        return result

    def close(self) -> None:
        self._module = None
