"""OpenVINO backend: IR (``model.xml`` + ``model.bin``), or ONNX read by OpenVINO when the
config names ``backend: "openvino"``; on the CPU device.

Config parameters (``parameters { key: ... value: { string_value: ... } }``), passed to
OpenVINO's compile step: ``PERFORMANCE_HINT`` (``LATENCY``, the default, or ``THROUGHPUT``,
or ``CUMULATIVE_THROUGHPUT``), ``INFERENCE_NUM_THREADS`` (default: the machine's cores shared
among instances), ``NUM_STREAMS`` (default: what the hint picks), ``INFERENCE_PRECISION_HINT``
(default ``f32``: the model's answers to the last digit; ``bf16`` is faster where the CPU has
bf16 instructions, at about two decimal digits, and OpenVINO would pick it on its own there).
OpenVINO releases the GIL while it infers.
"""

from __future__ import annotations

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
    string_parameters,
)
from inferd.backends.work import Runtime
from inferd.config.model_config_pb2 import ModelConfig
from inferd.core import datatypes
from inferd.core.errors import ConfigError, InternalError, InvalidInput, ModelLoadError
from inferd.core.types import Tensors

PLATFORM = "openvino"
_HINTS = ("LATENCY", "THROUGHPUT", "CUMULATIVE_THROUGHPUT")
_KNOWN_PARAMETERS = {
    "PERFORMANCE_HINT",
    "INFERENCE_NUM_THREADS",
    "NUM_STREAMS",
    "INFERENCE_PRECISION_HINT",
}
_FILENAMES = ("model.xml", "model.onnx")


def _openvino() -> Any:
    try:
        import openvino
    except ImportError as exc:
        raise missing_extra("OpenVINO", "openvino", exc) from None
    return openvino


def _path(version_dir: Path, config: ModelConfig) -> Path:
    return model_file(version_dir, config, _FILENAMES)


def _read(core: Any, path: Path) -> Any:
    if not path.is_file():
        raise ModelLoadError(f"no model file {path.name} in its version folder")
    try:
        return core.read_model(str(path))
    except Exception as exc:
        raise ModelLoadError(f"OpenVINO cannot read {path.name}: {exc}") from None


def _port_io(port: Any) -> TensorIO:
    name = port.get_any_name()
    element = port.get_element_type()
    if element.is_dynamic():
        raise ConfigError(f"tensor '{name}' has a dynamic element type; declare its data_type")
    dtype = np.dtype(element.to_dtype())
    datatype = datatypes.BYTES if dtype.kind in ("S", "U", "O") else datatypes.from_numpy(dtype)
    partial = port.get_partial_shape()
    if partial.rank.is_dynamic:
        raise ConfigError(f"tensor '{name}' has a dynamic rank; list its dims in config.pbtxt")
    shape = tuple(d.get_length() if d.is_static else -1 for d in partial)
    return TensorIO(name, datatype, shape)


class OpenVinoBackend(Backend):
    name = "openvino"
    platforms: tuple[str, ...] = (PLATFORM,)
    default_filename = "model.xml"

    def complete_config(
        self, version_dir: Path, config: ModelConfig, default_max_batch_size: int
    ) -> None:
        ov = _openvino()
        model = _read(ov.Core(), _path(version_dir, config))
        inputs = [_port_io(p) for p in model.inputs]
        outputs = [_port_io(p) for p in model.outputs]
        complete(
            config, inputs, outputs, default_max_batch_size, platform=PLATFORM, backend=self.name
        )

    def load(
        self, version_dir: Path, config: ModelConfig, placement: InstancePlacement
    ) -> OpenVinoRuntime:
        ov = _openvino()
        params = string_parameters(config)
        check_parameters(params, _KNOWN_PARAMETERS, "openvino", config.name)
        hint = params.get("PERFORMANCE_HINT", "LATENCY").upper()
        if hint not in _HINTS:
            raise ConfigError(
                f"parameter PERFORMANCE_HINT '{hint}' is not one of {', '.join(_HINTS)}"
            )
        properties: dict[str, Any] = {
            "PERFORMANCE_HINT": hint,
            "INFERENCE_NUM_THREADS": int_parameter(
                params, "INFERENCE_NUM_THREADS", placement.cpu_threads()
            ),
        }
        if "NUM_STREAMS" in params:
            properties["NUM_STREAMS"] = params["NUM_STREAMS"]
        properties["INFERENCE_PRECISION_HINT"] = params.get("INFERENCE_PRECISION_HINT", "f32")
        core = ov.Core()
        path = _path(version_dir, config)
        model = _read(core, path)
        try:
            compiled = core.compile_model(model, "CPU", properties)
        except Exception as exc:
            raise ModelLoadError(f"OpenVINO cannot compile {path.name}: {exc}") from None
        return OpenVinoRuntime(compiled)


def _fixed_width(name: str, array: np.ndarray) -> np.ndarray:
    """BYTES as the fixed-width numpy strings OpenVINO's Python API takes. Those cannot end
    in a NUL byte (numpy drops trailing NULs), so such an element is a clear 400, never a
    silently shortened string."""
    flat = array.reshape(-1).tolist()
    for index, value in enumerate(flat):
        if isinstance(value, bytes) and value.endswith(b"\x00"):
            raise InvalidInput(
                f"input '{name}': element {index} ends with a NUL byte, which OpenVINO's "
                "Python API cannot carry"
            )
    items = [v if isinstance(v, bytes) else str(v).encode("utf-8") for v in flat]
    return np.array(items, dtype=np.bytes_).reshape(array.shape)


class OpenVinoRuntime(Runtime):
    """One compiled model and one infer request (an instance runs one batch at a time)."""

    inline = True

    def __init__(self, compiled: Any) -> None:
        self._compiled = compiled
        self._request = compiled.create_infer_request()
        self._ports = {name: port for port in compiled.outputs for name in port.get_names()}
        self._string_inputs = {
            port.get_any_name()
            for port in compiled.inputs
            if np.dtype(port.get_element_type().to_dtype()).kind in ("S", "U")
        }

    def execute(self, inputs: Tensors, output_names: Sequence[str]) -> Tensors:
        feeds = inputs
        if self._string_inputs:
            feeds = dict(inputs)
            for name in self._string_inputs & feeds.keys():
                feeds[name] = _fixed_width(name, feeds[name])
        try:
            results = self._request.infer(feeds, share_inputs=True)
            outputs = {name: np.asarray(results[self._ports[name]]) for name in output_names}
        except KeyError as exc:
            raise InternalError(f"OpenVINO model has no output {exc}") from None
        except Exception as exc:
            raise InternalError(f"OpenVINO inference failed: {exc}") from None
        for name, array in outputs.items():
            if array.dtype.kind in "SU":
                # The tensor's raw bytes: the results' text view replaces bytes that are not
                # UTF-8 (what numpy cannot keep, trailing NULs, no model input can carry).
                raw = self._request.get_tensor(self._ports[name]).bytes_data
                out = np.empty(array.size, dtype=object)
                out[:] = raw.tolist()
                outputs[name] = out.reshape(array.shape)
        return outputs

    def close(self) -> None:
        self._request = None
        self._compiled = None
