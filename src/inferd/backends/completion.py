"""Config completion shared by the framework backends: a model's tensors, as read from its file,
fill in the inputs, outputs and ``max_batch_size`` that a config leaves out.

Triton's rules: an empty config of a model whose every tensor has a variable first dimension
batches with the server's default ``max_batch_size``; a config tensor that names one the model
lacks, or declares another datatype, is an error naming both.
"""

from __future__ import annotations

import difflib
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inferd.config.model_config_pb2 import ModelConfig, ModelInput, ModelOutput
from inferd.config.spec import config_enum_of, datatype_of
from inferd.core.datatypes import DataType
from inferd.core.errors import ConfigError, ModelLoadError
from inferd.install import install_hint

log = logging.getLogger("inferd.backends")


@dataclass(frozen=True, slots=True)
class TensorIO:
    """One model tensor as the model file describes it (``-1``: a variable dimension)."""

    name: str
    datatype: DataType
    shape: tuple[int, ...]


def complete(
    config: ModelConfig,
    inputs: Sequence[TensorIO],
    outputs: Sequence[TensorIO],
    default_max_batch_size: int,
    *,
    platform: str,
    backend: str,
) -> None:
    """Fill ``config`` from the model's tensors; configured tensors are checked against them."""
    if not config.input and not config.output and config.max_batch_size == 0:
        every = list(inputs) + list(outputs)
        if every and all(len(t.shape) >= 1 and t.shape[0] == -1 for t in every):
            config.max_batch_size = default_max_batch_size
    batching = config.max_batch_size > 0
    _complete_tensors(config.input, inputs, batching, "input")
    _complete_tensors(config.output, outputs, batching, "output")
    if not config.platform and platform:
        config.platform = platform
    if not config.backend:
        config.backend = backend


def _complete_tensors(
    configured: Any, found: Sequence[TensorIO], batching: bool, kind: str
) -> None:
    by_name = {t.name: t for t in found}
    for tensor in configured:
        model_io = by_name.get(tensor.name)
        if model_io is None:
            raise ConfigError(
                f"config {kind} '{tensor.name}' is not in the model; the model has "
                f"{', '.join(by_name) or 'none'}"
            )
        if tensor.data_type == 0:
            tensor.data_type = config_enum_of(model_io.datatype)
        elif datatype_of(tensor.data_type, f"{kind} '{tensor.name}'") != model_io.datatype:
            raise ConfigError(
                f"config {kind} '{tensor.name}' declares "
                f"{datatype_of(tensor.data_type, kind).config_name} but the model has "
                f"{model_io.datatype.config_name}"
            )
        if not tensor.dims:
            set_dims(tensor, model_io.shape, batching)
    if len(configured) == 0:
        for model_io in found:
            tensor = configured.add()
            tensor.name = model_io.name
            tensor.data_type = config_enum_of(model_io.datatype)
            set_dims(tensor, model_io.shape, batching)


def set_dims(tensor: ModelInput | ModelOutput, shape: tuple[int, ...], batching: bool) -> None:
    """Config dims from a model shape; a scalar per row becomes ``dims [1]`` + ``reshape []``."""
    if batching and (not shape or shape[0] not in (-1, 0)):
        raise ConfigError(
            f"tensor '{tensor.name}' has shape {list(shape)} without a variable first "
            "(batch) dimension, so the model cannot batch: set max_batch_size: 0"
        )
    dims = shape[1:] if batching else shape
    if dims:
        tensor.dims.extend(dims)
    else:
        # A scalar per batch row: clients send [batch, 1], the model takes [batch].
        tensor.dims.append(1)
        tensor.reshape.SetInParent()


def require_listed(config: ModelConfig, what: str) -> None:
    """For a model file that carries no tensor metadata: the config must list every tensor."""
    missing = [
        f"{kind} '{t.name or '?'}'"
        for kind, tensors in (("input", config.input), ("output", config.output))
        for t in tensors
        if t.data_type == 0 or not t.dims
    ]
    if not config.input or not config.output or missing:
        raise ConfigError(
            f"{what}: list every input and output in config.pbtxt with name, data_type and dims"
            + (f" (incomplete: {', '.join(missing)})" if missing else "")
        )


def string_parameters(config: ModelConfig) -> dict[str, str]:
    return {key: value.string_value for key, value in config.parameters.items()}


def check_parameters(
    params: Mapping[str, str], known: set[str], backend: str, model: str = ""
) -> None:
    """Parameters the backend does not use are ignored, as Triton's backends ignore them
    (Triton's own examples set ``execute_delay_ms`` on ONNX models), with one warning that
    names them (a typo of a known one gets the closest name). Config fields inferd does not
    implement still fail the load by name: that is the config parser's and ``build_spec``'s."""
    unknown = frozenset(params) - known
    key = (backend, model, unknown)
    if not unknown or key in _WARNED or _COPIES_ONLY:
        return
    if len(_WARNED) < _WARNED_KEPT:
        _WARNED.add(key)
    hints = []
    for name in sorted(unknown):
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.8)
        hints.append(f"{name} (did you mean {close[0]}?)" if close else name)
    log.warning(
        "model '%s': the %s backend ignores parameter(s) %s; it reads: %s",
        model,
        backend,
        ", ".join(hints),
        ", ".join(sorted(known)) or "none",
    )


# (backend, model, unknown names) already warned about: once per model, not per instance.
_WARNED: set[tuple[str, str, frozenset[str]]] = set()
_WARNED_KEPT = 4096
_COPIES_ONLY = False  # a frontend worker: what it loads, the model host loaded (and warned of)


def copies_only() -> None:
    """This process loads only copies of versions the model host loaded (a frontend worker):
    the host's warnings about parameters are the server's, not repeated by each worker."""
    global _COPIES_ONLY
    _COPIES_ONLY = True


def int_parameter(params: Mapping[str, str], key: str, default: int) -> int:
    if key not in params:
        return default
    try:
        value = int(params[key])
    except ValueError:
        raise ConfigError(f"parameter {key} must be an integer, got '{params[key]}'") from None
    if value < 0:
        raise ConfigError(f"parameter {key} must be >= 0, got {value}")
    return value


def bool_parameter(params: Mapping[str, str], key: str) -> bool:
    value = params.get(key, "false").strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off", ""):
        return False
    raise ConfigError(f"parameter {key} must be true or false, got '{params[key]}'")


def missing_extra(framework: str, extra: str, exc: ImportError) -> ModelLoadError:
    """The error of a model whose framework is not installed."""
    return ModelLoadError(
        f"this model needs {framework}, which is not installed ({exc}): {install_hint(extra)}"
    )


def model_file(version_dir: Path, config: ModelConfig, filenames: Sequence[str]) -> Path:
    """The config's ``default_model_filename``, else the first of ``filenames`` present in
    the version folder (else the first of them, for the error message)."""
    if config.default_model_filename:
        return version_dir / config.default_model_filename
    for name in filenames:
        if (version_dir / name).exists():
            return version_dir / name
    return version_dir / filenames[0]
