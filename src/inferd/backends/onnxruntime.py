"""ONNX Runtime backend: CPU by default, CUDA when the instance group asks for a GPU and one exists.

Config parameters (``parameters { key: ... value: { string_value: ... } }``):
``intra_op_thread_count`` (default: the machine's cores shared among instances),
``inter_op_thread_count`` (default 1), ``graph_optimization_level``
(disable | basic | extended | all, default all), ``allow_spinning`` (0 | 1, default 0:
spinning worker threads would steal the CPU that decodes the next request).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from inferd.backends import onnxruntime_accelerators as accelerators
from inferd.backends.base import Backend, InstancePlacement, model_path
from inferd.backends.completion import (
    TensorIO,
    check_parameters,
    complete,
    int_parameter,
    string_parameters,
)
from inferd.backends.work import Runtime
from inferd.config.model_config_pb2 import ModelConfig
from inferd.core import datatypes
from inferd.core.errors import ConfigError, InternalError, InvalidInput, ModelLoadError
from inferd.core.types import Tensors

log = logging.getLogger("inferd.backends.onnxruntime")

_OPT_LEVELS = {
    "disable": "ORT_DISABLE_ALL",
    "basic": "ORT_ENABLE_BASIC",
    "extended": "ORT_ENABLE_EXTENDED",
    "all": "ORT_ENABLE_ALL",
    "0": "ORT_DISABLE_ALL",
    "1": "ORT_ENABLE_BASIC",
    "2": "ORT_ENABLE_EXTENDED",
    "99": "ORT_ENABLE_ALL",
}
_KNOWN_PARAMETERS = {
    "intra_op_thread_count",
    "inter_op_thread_count",
    "graph_optimization_level",
    "allow_spinning",
}
NOTE_PREFIX = "optimize."  # config parameters that record how a version was optimized
METADATA_PREFIX = "inferd.optimize."  # the same notes, in the ONNX file's metadata_props


def _read_io(path: Path) -> tuple[list[TensorIO], list[TensorIO], dict[str, str]]:
    """Graph inputs and outputs, and inferd's notes, read from the file without a session
    (nor its weights: ``onnx_io``)."""
    from onnx import helper

    from inferd.backends.onnx_io import light_model

    try:
        model = light_model(path)
    except Exception as exc:
        raise ModelLoadError(f"cannot read ONNX model {path.name}: {exc}") from None
    notes = {
        NOTE_PREFIX + p.key[len(METADATA_PREFIX) :]: p.value
        for p in model.metadata_props
        if p.key.startswith(METADATA_PREFIX)
    }
    initializers = {i.name for i in model.graph.initializer}

    def convert(values: Any) -> list[TensorIO]:
        found = []
        for v in values:
            if v.name in initializers:
                continue
            tensor_type = v.type.tensor_type
            try:
                dtype = helper.tensor_dtype_to_np_dtype(tensor_type.elem_type)
                datatype = datatypes.from_numpy(dtype)
            except (KeyError, InvalidInput):
                raise ModelLoadError(
                    f"ONNX tensor '{v.name}' has an unsupported element type "
                    f"{tensor_type.elem_type}"
                ) from None
            dims = tuple(
                int(d.dim_value) if d.HasField("dim_value") and d.dim_value > 0 else -1
                for d in tensor_type.shape.dim
            )
            found.append(TensorIO(v.name, datatype, dims))
        return found

    return convert(model.graph.input), convert(model.graph.output), notes


class OnnxRuntimeBackend(Backend):
    name = "onnxruntime"
    platforms: tuple[str, ...] = ("onnxruntime_onnx",)
    default_filename = "model.onnx"

    def gpu_available(self) -> bool:
        import onnxruntime as ort

        return "CUDAExecutionProvider" in ort.get_available_providers()

    def prime(self) -> bool:
        """Import onnxruntime and onnx and run one session of a one-node model: what stays
        (the libraries, the runtime's environment and thread pools) is not any model's."""
        import onnxruntime as ort
        from onnx import TensorProto, helper

        x, y = (helper.make_tensor_value_info(n, TensorProto.FLOAT, [1]) for n in ("x", "y"))
        graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "prime", [x], [y])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
        model.ir_version = 8  # what every onnxruntime reads
        providers = ["CPUExecutionProvider"]
        session = ort.InferenceSession(model.SerializeToString(), providers=providers)
        session.run(None, {"x": np.zeros(1, np.float32)})
        return True

    def complete_config(
        self, version_dir: Path, config: ModelConfig, default_max_batch_size: int
    ) -> None:
        inputs, outputs, notes = _read_io(model_path(version_dir, config, self))
        for key, value in notes.items():
            if key not in config.parameters:
                config.parameters[key].string_value = value
        complete(
            config,
            inputs,
            outputs,
            default_max_batch_size,
            platform=self.platforms[0],
            backend=self.name,
        )

    def load(self, version_dir: Path, config: ModelConfig, placement: InstancePlacement) -> Runtime:
        import onnxruntime as ort

        params = {
            k: v for k, v in string_parameters(config).items() if not k.startswith(NOTE_PREFIX)
        }
        check_parameters(params, _KNOWN_PARAMETERS, self.name, config.name)
        acceleration = accelerators.plan(
            config, placement.kind, placement.device_id, ort.get_available_providers()
        )
        if acceleration.openvino_backend:
            return _load_on_openvino(version_dir, config, placement, params)
        options = ort.SessionOptions()
        options.intra_op_num_threads = int_parameter(
            params, "intra_op_thread_count", placement.cpu_threads()
        )
        options.inter_op_num_threads = int_parameter(params, "inter_op_thread_count", 1)
        options.graph_optimization_level = getattr(
            ort.GraphOptimizationLevel, _graph_level(params, acceleration.graph_level)
        )
        spinning = params.get("allow_spinning", "0")
        options.add_session_config_entry("session.intra_op.allow_spinning", spinning)
        options.add_session_config_entry("session.inter_op.allow_spinning", spinning)
        options.log_severity_level = 3
        providers = list(acceleration.providers)
        path = model_path(version_dir, config, self)
        try:
            session = ort.InferenceSession(str(path), sess_options=options, providers=providers)
        except Exception as exc:
            raise ModelLoadError(f"onnxruntime cannot load {path.name}: {exc}") from None
        used = session.get_providers()
        log.info("model '%s': onnxruntime providers %s", config.name, ", ".join(used))
        missing = [p for p in accelerators.provider_names(providers) if p not in used]
        if missing and placement.index == 0:
            log.warning(
                "model '%s': onnxruntime did not enable %s; running on %s",
                config.name,
                ", ".join(missing),
                ", ".join(used),
            )
        return OnnxRuntimeSession(session)


def _as_text(name: str, array: np.ndarray) -> np.ndarray:
    """BYTES elements as the ``str`` objects ORT's Python API takes (it stores their UTF-8
    bytes, so every byte string that is UTF-8 reaches the model intact, NULs included; never
    through fixed-width numpy strings, which drop trailing NULs). Bytes that are not UTF-8
    cannot cross ORT's Python API: a clear 400 names the element."""
    flat = array.reshape(-1).tolist()
    try:
        text = [v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in flat]
    except UnicodeDecodeError:
        index = next(i for i, v in enumerate(flat) if isinstance(v, bytes) and not _is_utf8(v))
        raise InvalidInput(
            f"input '{name}': element {index} is not UTF-8 text; ONNX Runtime carries "
            "strings as text, so it cannot take arbitrary bytes"
        ) from None
    out = np.empty(len(text), dtype=object)
    out[:] = text
    return out.reshape(array.shape)


def _is_utf8(value: bytes) -> bool:
    try:
        value.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _as_bytes(array: np.ndarray) -> np.ndarray:
    flat = array.reshape(-1).tolist()
    out = np.empty(len(flat), dtype=object)
    out[:] = [v.encode("utf-8") if isinstance(v, str) else bytes(v) for v in flat]
    return out.reshape(array.shape)


def _graph_level(params: dict[str, str], configured: str | None) -> str:
    """The ORT level: ``optimization.graph.level`` or the parameter (both: they must agree)."""
    if "graph_optimization_level" not in params:
        return configured or _OPT_LEVELS["all"]
    level = params["graph_optimization_level"].lower()
    if level not in _OPT_LEVELS:
        raise ConfigError(
            f"parameter graph_optimization_level '{level}' is not one of "
            f"{', '.join(sorted(set(_OPT_LEVELS)))}"
        )
    if configured is not None and configured != _OPT_LEVELS[level]:
        raise ConfigError(
            f"parameter graph_optimization_level '{level}' contradicts config field "
            "'optimization.graph.level'; set one of them"
        )
    return _OPT_LEVELS[level]


def _load_on_openvino(
    version_dir: Path, config: ModelConfig, placement: InstancePlacement, params: dict[str, str]
) -> Runtime:
    """``cpu_execution_accelerator openvino`` without ORT's OpenVINO provider: inferd's
    OpenVINO backend reads the same ONNX file."""
    from inferd.backends.openvino import OpenVinoBackend

    ov_config = ModelConfig()
    ov_config.CopyFrom(config)
    ov_config.ClearField("optimization")
    ov_config.parameters.clear()
    ov_config.default_model_filename = model_path(version_dir, config, OnnxRuntimeBackend()).name
    if "intra_op_thread_count" in params:
        ov_config.parameters["INFERENCE_NUM_THREADS"].string_value = params["intra_op_thread_count"]
    runtime = OpenVinoBackend().load(version_dir, ov_config, placement)
    log.info(
        "model '%s': cpu_execution_accelerator openvino (inferd's OpenVINO backend)", config.name
    )
    return runtime


class OnnxRuntimeSession(Runtime):
    """One InferenceSession; ORT releases the GIL while it runs."""

    inline = True

    def __init__(self, session: Any) -> None:
        self._session = session
        self._string_inputs = {i.name for i in session.get_inputs() if i.type == "tensor(string)"}
        self._string_outputs = {o.name for o in session.get_outputs() if o.type == "tensor(string)"}
        self.providers: tuple[str, ...] = tuple(session.get_providers())
        self.graph_level: str = session.get_session_options().graph_optimization_level.name
        # On the CPU provider alone, the Python wrapper's ``run`` only re-checks the input
        # names (validated before a request gets here), that no OrtValue is fed (only numpy
        # arrays are) and falls back from GPU providers: call the C session directly, which
        # saves some 60 bytecodes per call. Other providers keep the wrapper's fallback.
        native = getattr(session, "_sess", None)
        cpu_only = self.providers == ("CPUExecutionProvider",)
        self._run: Callable[[Sequence[str], Tensors, Any], list[Any]] = (
            native.run if native is not None and cpu_only else session.run
        )

    def execute(self, inputs: Tensors, output_names: Sequence[str]) -> Tensors:
        feeds = inputs
        if self._string_inputs:
            feeds = dict(inputs)
            for name in self._string_inputs & feeds.keys():
                feeds[name] = _as_text(name, feeds[name])
        try:
            results = self._run(output_names, feeds, None)
        except Exception as exc:
            raise InternalError(f"onnxruntime execution failed: {exc}") from None
        outputs = dict(zip(output_names, results, strict=True))
        if self._string_outputs:
            for name in self._string_outputs & outputs.keys():
                outputs[name] = _as_bytes(outputs[name])
        return outputs

    def close(self) -> None:
        self._session = None
        self._run = _closed


def _closed(output_names: Sequence[str], feeds: Tensors, options: Any) -> list[Any]:
    raise InternalError("the onnxruntime session is closed")
