"""The backend table: built-in backends by name, plus third-party ones from entry points.

A third-party package registers a backend class under the ``inferd.backends`` entry-point
group; the class must satisfy ``inferd.backends.base.Backend``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from importlib.metadata import entry_points
from pathlib import Path
from typing import TYPE_CHECKING

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
    if name in _cache:
        return _cache[name]
    factory: Callable[[], Backend] | None = None
    if name in BUILTIN:
        module, _, attr = BUILTIN[name].partition(":")
        factory = getattr(importlib.import_module(module), attr)
    else:
        for ep in entry_points(group="inferd.backends"):
            if ep.name == name:
                factory = ep.load()
                break
    if factory is None:
        raise ConfigError(f"unknown backend '{name}'; available: {', '.join(available())}")
    backend = factory()
    _cache[name] = backend
    return backend


def available() -> list[str]:
    return sorted(set(BUILTIN) | {ep.name for ep in entry_points(group="inferd.backends")})


def select_backend(config: ModelConfig, version_dirs: Iterable[Path]) -> Backend:
    """The backend a model needs: from ``backend``, then ``platform``, then its files."""
    if config.HasField("ensemble_scheduling") and config.platform != "ensemble":
        raise ConfigError('ensemble_scheduling needs platform: "ensemble"')
    if config.backend:
        return get_backend(config.backend)
    if config.platform:
        name = PLATFORMS.get(config.platform)
        if name is None:
            raise ConfigError(
                f"unsupported platform '{config.platform}'; supported: {', '.join(PLATFORMS)}"
            )
        return get_backend(name)
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
