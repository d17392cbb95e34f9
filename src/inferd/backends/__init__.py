"""The backend table: built-in backends by name, plus third-party ones from entry points.

A third-party package registers a backend class under the ``inferd.backends`` entry-point
group; the class must satisfy ``inferd.backends.base.Backend``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from importlib.metadata import entry_points
from pathlib import Path
from typing import TYPE_CHECKING

from inferd.errors import ConfigError

if TYPE_CHECKING:  # a Python model's worker imports this package without protobuf
    from inferd.backends.base import Backend
    from inferd.config.model_config_pb2 import ModelConfig


def _onnxruntime() -> Backend:
    from inferd.backends.onnxruntime import OnnxRuntimeBackend

    return OnnxRuntimeBackend()


def _tensorflow() -> Backend:
    from inferd.backends.tensorflow import TensorFlowBackend

    return TensorFlowBackend()


def _pytorch() -> Backend:
    from inferd.backends.torch import TorchBackend

    return TorchBackend()


def _openvino() -> Backend:
    from inferd.backends.openvino import OpenVinoBackend

    return OpenVinoBackend()


def _sklearn() -> Backend:
    from inferd.backends.sklearn import SklearnBackend

    return SklearnBackend()


def _xgboost() -> Backend:
    from inferd.backends.xgboost import XGBoostBackend

    return XGBoostBackend()


def _lightgbm() -> Backend:
    from inferd.backends.lightgbm import LightGBMBackend

    return LightGBMBackend()


def _python() -> Backend:
    from inferd.backends.python.backend import PythonBackend

    return PythonBackend()


def _torchserve() -> Backend:
    from inferd.backends.torchserve.backend import TorchServeBackend

    return TorchServeBackend()


def _ensemble() -> Backend:
    from inferd.backends.ensemble import EnsembleBackend

    return EnsembleBackend()


def _echo() -> Backend:
    from inferd.backends.echo import EchoBackend

    return EchoBackend()


# Each framework is imported by its own backend, when a model first needs it.
BUILTIN: dict[str, Callable[[], Backend]] = {
    "echo": _echo,
    "ensemble": _ensemble,
    "python": _python,
    "torchserve": _torchserve,
    "onnxruntime": _onnxruntime,
    "tensorflow": _tensorflow,
    "pytorch": _pytorch,
    "torch": _pytorch,
    "openvino": _openvino,
    "sklearn": _sklearn,
    "xgboost": _xgboost,
    "lightgbm": _lightgbm,
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
# The file a version directory holds, for a config that names no backend.
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
}
# A file with this suffix in a version directory selects the backend (TorchServe's ``.mar``).
DEFAULT_SUFFIXES: dict[str, str] = {".mar": "torchserve"}

_cache: dict[str, Backend] = {}


def get_backend(name: str) -> Backend:
    if name in _cache:
        return _cache[name]
    factory = BUILTIN.get(name)
    if factory is None:
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
