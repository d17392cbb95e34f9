"""TensorFlow backend: SavedModels, in Triton's layout (``<version>/model.savedmodel/``) or TF
Serving's (``<version>/saved_model.pb`` + ``variables/``).

One signature is served: config parameter ``signature_name`` (default ``serving_default``).
Its input and output keys are the tensor names, and the config is completed from the
signature's dtypes and shapes. Threads: TensorFlow's pools are process-wide and set once, at
the first load, to the machine's cores (parameters ``intra_op_thread_count``,
``inter_op_thread_count`` override them); TensorFlow releases the GIL inside its ops, so
instances run on worker threads.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from inferd import datatypes
from inferd.backends.base import InstancePlacement, available_cpus
from inferd.backends.completion import (
    TensorIO,
    check_parameters,
    complete,
    int_parameter,
    missing_extra,
    string_parameters,
)
from inferd.backends.tf_graph import unsafe_ops
from inferd.config.model_config_pb2 import ModelConfig
from inferd.errors import ConfigError, InternalError, ModelLoadError
from inferd.trust import Capability, allowed, require
from inferd.types import Tensors

log = logging.getLogger("inferd.backends.tensorflow")

PLATFORM = "tensorflow_savedmodel"
DEFAULT_SIGNATURE = "serving_default"
SAVED_MODEL_DIR = "model.savedmodel"  # Triton's layout
SAVED_MODEL_FILE = "saved_model.pb"  # TF Serving's layout: directly in the version folder
_SERVE_TAG = "serve"
_KNOWN_PARAMETERS = {"signature_name", "intra_op_thread_count", "inter_op_thread_count"}
_threads_lock = threading.Lock()
_threads_set = False


def _tensorflow() -> Any:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # no C++ info lines in the server log
    try:
        import tensorflow
    except ImportError as exc:
        raise missing_extra("TensorFlow", "tensorflow", exc) from None
    return tensorflow


def saved_model_dir(version_dir: Path, config: ModelConfig) -> Path:
    """The SavedModel folder: ``model.savedmodel`` (or the configured name), else the version."""
    named = version_dir / (config.default_model_filename or SAVED_MODEL_DIR)
    if named.is_dir() or config.default_model_filename:
        return named
    if (version_dir / SAVED_MODEL_FILE).is_file():
        return version_dir
    return named


def signature_name(config: ModelConfig) -> str:
    params = string_parameters(config)
    return params.get("signature_name") or DEFAULT_SIGNATURE


def _parse(path: Path) -> Any:
    _tensorflow()
    from tensorflow.core.protobuf import saved_model_pb2

    pb = path / SAVED_MODEL_FILE
    saved = saved_model_pb2.SavedModel()
    try:
        saved.ParseFromString(pb.read_bytes())
    except FileNotFoundError:
        raise ModelLoadError(
            f"no SavedModel at {path.name}: {SAVED_MODEL_FILE} is missing"
        ) from None
    except Exception as exc:
        raise ModelLoadError(f"cannot read {pb.name}: {exc}") from None
    return saved


def check_ops(path: Path) -> None:
    """Refuse a graph with file-system or Python ops unless --allow-unsafe-ops grants them."""
    if allowed(Capability.UNSAFE_OPS):
        return
    ops = unsafe_ops(_parse(path))
    if ops:
        require(
            Capability.UNSAFE_OPS,
            f"the SavedModel holds file-system or process operations ({', '.join(ops)})",
        )


def read_signature(path: Path, name: str) -> tuple[list[TensorIO], list[TensorIO]]:
    """The inputs and outputs of one signature, read from saved_model.pb without loading it."""
    saved = _parse(path)
    pb = path / SAVED_MODEL_FILE
    graphs = [g for g in saved.meta_graphs if _SERVE_TAG in g.meta_info_def.tags]
    graphs = graphs or list(saved.meta_graphs)
    if not graphs:
        raise ModelLoadError(f"{pb.name} holds no MetaGraph")
    signatures = graphs[0].signature_def
    if name not in signatures:
        available = ", ".join(sorted(k for k in signatures if not k.startswith("__"))) or "none"
        raise ConfigError(
            f"the SavedModel has no signature '{name}' (it has: {available}); set the config "
            'parameter signature_name, e.g. parameters { key: "signature_name" '
            'value: { string_value: "..." } }'
        )
    signature = signatures[name]
    # Signature maps have no order: sort by name so that metadata is the same on every load.
    return (
        [_tensor_io(key, signature.inputs[key]) for key in sorted(signature.inputs)],
        [_tensor_io(key, signature.outputs[key]) for key in sorted(signature.outputs)],
    )


def _tensor_io(key: str, info: Any) -> TensorIO:
    from tensorflow.core.framework import types_pb2

    dtype_name = types_pb2.DataType.Name(info.dtype)
    datatype = datatypes.BY_TF_NAME.get(dtype_name)
    if datatype is None:
        raise ConfigError(
            f"signature tensor '{key}' has dtype {dtype_name}, which inferd cannot serve"
        )
    if info.tensor_shape.unknown_rank:
        raise ConfigError(
            f"signature tensor '{key}' has an unknown rank; list its dims in config.pbtxt"
        )
    shape = tuple(int(d.size) if d.size >= 0 else -1 for d in info.tensor_shape.dim)
    return TensorIO(key, datatype, shape)


def _set_threads(tf: Any, intra: int, inter: int) -> None:
    global _threads_set
    with _threads_lock:
        if _threads_set:
            return
        _threads_set = True
        try:
            tf.config.threading.set_intra_op_parallelism_threads(intra)
            tf.config.threading.set_inter_op_parallelism_threads(inter)
        except RuntimeError:  # the runtime started before the first model loaded
            log.debug("TensorFlow thread pools were already set up")


class TensorFlowBackend:
    name = "tensorflow"
    platforms: tuple[str, ...] = (PLATFORM,)
    default_filename = SAVED_MODEL_DIR

    def gpu_available(self) -> bool:
        try:
            tf = _tensorflow()
        except ModelLoadError:
            return False
        return bool(tf.config.list_physical_devices("GPU"))

    def complete_config(
        self, version_dir: Path, config: ModelConfig, default_max_batch_size: int
    ) -> None:
        check_parameters(string_parameters(config), _KNOWN_PARAMETERS, "tensorflow")
        path = saved_model_dir(version_dir, config)
        check_ops(path)
        inputs, outputs = read_signature(path, signature_name(config))
        complete(
            config, inputs, outputs, default_max_batch_size, platform=PLATFORM, backend=self.name
        )

    def load(
        self, version_dir: Path, config: ModelConfig, placement: InstancePlacement
    ) -> TensorFlowRuntime:
        tf = _tensorflow()
        params = string_parameters(config)
        check_parameters(params, _KNOWN_PARAMETERS, "tensorflow")
        _set_threads(
            tf,
            int_parameter(params, "intra_op_thread_count", available_cpus()),
            int_parameter(params, "inter_op_thread_count", 1),
        )
        path = saved_model_dir(version_dir, config)
        check_ops(path)
        name = signature_name(config)
        device = f"/GPU:{placement.device_id}" if placement.kind == "GPU" else "/CPU:0"
        try:
            with tf.device(device):
                loaded = tf.saved_model.load(str(path), tags=[_SERVE_TAG])
        except Exception as exc:
            raise ModelLoadError(
                f"TensorFlow cannot load the SavedModel {path.name}: {exc}"
            ) from None
        if name not in loaded.signatures:
            raise ConfigError(
                f"the SavedModel has no signature '{name}' "
                f"(it has: {', '.join(loaded.signatures) or 'none'})"
            )
        return TensorFlowRuntime(tf, loaded, loaded.signatures[name], device)


class TensorFlowRuntime:
    """One loaded SavedModel; the signature's concrete function runs whole batches."""

    inline = True

    def __init__(self, tf: Any, loaded: Any, function: Any, device: str) -> None:
        self._tf = tf
        self._loaded = loaded  # keeps the variables the function captures alive
        self._function = function
        self._device = device

    def execute(self, inputs: Tensors, output_names: Sequence[str]) -> Tensors:
        tf = self._tf
        try:
            with tf.device(self._device):
                feeds = {name: tf.constant(array) for name, array in inputs.items()}
                results = self._function(**feeds)
        except Exception as exc:
            raise InternalError(f"TensorFlow execution failed: {_first_line(exc)}") from None
        outputs: Tensors = {}
        for name in output_names:
            if name not in results:
                raise InternalError(f"the signature returned no output '{name}'")
            array = results[name].numpy()
            outputs[name] = array if array.dtype != object else np.asarray(array, dtype=object)
        return outputs

    def close(self) -> None:
        self._function = None
        self._loaded = None


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
