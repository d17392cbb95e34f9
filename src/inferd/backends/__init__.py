"""The backend table: built-in backends by name, plus third-party ones from entry points.

A third-party package registers a subclass of ``inferd.backends.base.Backend`` under the
``inferd.backends`` entry-point group (``inferd.backends.entry_points``: a built-in wins over
an entry point of the same name; one that fails to load fails only its models' loads).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from inferd.backends import entry_points
from inferd.core.errors import ConfigError

if TYPE_CHECKING:  # a Python model's worker imports this package without protobuf
    from inferd.backends.base import Backend
    from inferd.config.model_config_pb2 import ModelConfig


# Each built-in backend as ``module:class``, imported when a model first needs it (the backend
# imports its framework), the way entry points name third-party ones: this table imports none.
BUILTIN: dict[str, str] = {
    "echo": "inferd.backends.echo:EchoBackend",
    "function": "inferd.backends.function:FunctionBackend",
    "ensemble": "inferd.backends.ensemble:EnsembleBackend",
    "python": "inferd.backends.python.backend:PythonBackend",
    "torchserve": "inferd.backends.torchserve.backend:TorchServeBackend",
    "onnxruntime": "inferd.backends.onnxruntime:OnnxRuntimeBackend",
    "tensorflow": "inferd.backends.tensorflow:TensorFlowBackend",
    "pytorch": "inferd.backends.torch:TorchBackend",
    "torch": "inferd.backends.torch:TorchBackend",
    "openvino": "inferd.backends.openvino:OpenVinoBackend",
    "sklearn": "inferd.backends.sklearn:SklearnBackend",
    "xgboost": "inferd.backends.xgboost:XGBoostBackend",
    "lightgbm": "inferd.backends.lightgbm:LightGBMBackend",
}
# Triton's ``platform`` values and the backend each selects.
PLATFORMS: dict[str, str] = {
    "onnxruntime_onnx": "onnxruntime",
    "tensorflow_savedmodel": "tensorflow",
    "tensorflow_graphdef": "tensorflow",
    "pytorch_libtorch": "pytorch",
    "openvino": "openvino",
    "ensemble": "ensemble",
}
# The file a version directory holds, for a config that names no backend, in the order looked
# for: a framework's model file wins over a ``model.py`` beside it (code that may load it), so a
# folder is a Python model by its files only when it holds no other model file. The Python
# backend still runs it only where the operator allowed Python models (inferd.security.trust).
DEFAULT_FILES: dict[str, str] = {
    "model.onnx": "onnxruntime",
    "model.savedmodel": "tensorflow",  # Triton's SavedModel folder
    "saved_model.pb": "tensorflow",  # TF Serving's layout: the SavedModel is the version folder
    "model.graphdef": "tensorflow",  # a frozen TF GraphDef
    "model.pt": "pytorch",  # TorchScript
    "model.pt2": "pytorch",  # torch.export
    "model.xml": "openvino",  # OpenVINO IR (+ model.bin)
    "model.joblib": "sklearn",
    "model.pkl": "sklearn",
    "model.json": "xgboost",
    "model.ubj": "xgboost",
    "model.txt": "lightgbm",
    "MAR-INF/MANIFEST.json": "torchserve",  # an unpacked TorchServe archive
    "model.py": "python",
}
# A file with this suffix in a version directory selects the backend (TorchServe's ``.mar``).
DEFAULT_SUFFIXES: dict[str, str] = {".mar": "torchserve"}

_cache: dict[str, Backend] = {}


def get_backend(name: str) -> Backend:
    """The backend called ``name``: a built-in, else an ``inferd.backends`` entry point
    (ConfigError naming the problem when there is none or it does not load)."""
    if name in _cache:
        return _cache[name]
    if name in BUILTIN:
        module, _, attr = BUILTIN[name].partition(":")
        backend: Backend = getattr(importlib.import_module(module), attr)()
    else:
        eps = entry_points.registered(BUILTIN).get(name)
        if not eps:
            raise ConfigError(f"unknown backend '{name}'; available: {', '.join(available())}")
        backend = entry_points.load(name, eps)
    _cache[name] = backend
    return backend


def available() -> list[str]:
    return sorted(set(BUILTIN) | set(entry_points.registered(BUILTIN)))


def for_platform(platform: str) -> Backend:
    """The backend a Triton ``platform`` selects: a built-in's, else the entry-point backend
    whose ``platforms`` lists it (ConfigError naming the platforms known, and any entry
    point that could not be asked because it failed to load)."""
    name = PLATFORMS.get(platform)
    if name is not None:
        return get_backend(name)
    failed: list[str] = []
    for ep_name in entry_points.registered(BUILTIN):
        try:
            backend = get_backend(ep_name)
        except ConfigError as exc:
            failed.append(exc.message)
            continue
        if platform in backend.platforms:
            return backend
    known = ", ".join(PLATFORMS)
    why = "".join(f"; {f}" for f in failed)
    raise ConfigError(f"unsupported platform '{platform}'; supported: {known}{why}")


def select_backend(config: ModelConfig, version_dirs: Iterable[Path]) -> Backend:
    """The backend a model needs: from ``backend``, then ``platform``, then its files."""
    if config.HasField("ensemble_scheduling") and config.platform != "ensemble":
        raise ConfigError('ensemble_scheduling needs platform: "ensemble"')
    if config.backend:
        return get_backend(config.backend)
    if config.platform:
        return for_platform(config.platform)
    if config.default_model_filename:
        suffix = Path(config.default_model_filename).suffix
        for filename, name in DEFAULT_FILES.items():
            if Path(filename).suffix == suffix:
                return get_backend(name)
    dirs = list(version_dirs)
    for filename, name in DEFAULT_FILES.items():
        if any((d / filename).exists() for d in dirs):
            return get_backend(name)
    for suffix, name in DEFAULT_SUFFIXES.items():
        if any(any(d.glob(f"*{suffix}")) for d in dirs if d.is_dir()):
            return get_backend(name)
    raise ConfigError(
        "cannot tell which backend serves this model: no known model file "
        f"({', '.join(DEFAULT_FILES)}) in its version folders and no backend/platform in config"
    )
