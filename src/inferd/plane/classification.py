"""Triton's classification extension and ``label_filename``: an output requested with the
``classification`` parameter answers, per row, its top K entries as ``"<score>:<index>[:<label>]"``.

Scores are written as Triton writes them (C++ ``std::to_string``: ``%f`` for floats, ``%d``
for integers); the label of an index is that line of the output's label file, when it has one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from inferd.config.model_config_pb2 import ModelConfig
from inferd.core.datatypes import of_array
from inferd.core.errors import ConfigError, InvalidInput
from inferd.core.types import RequestedOutput, Tensors

CLASSIFICATION_PARAMETER = "classification"
_SCORE_FORMATS = {"f": "%f", "i": "%d", "u": "%d"}  # numpy dtype kind -> Triton's std::to_string
_SUPPORTED = frozenset(
    np.dtype(t) for t in ("uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32")
) | frozenset(np.dtype(t) for t in ("int64", "float32", "float64"))

Labels = Mapping[str, tuple[str, ...]]  # output name -> one label per class index


def read_labels(folder: Path, config: ModelConfig) -> dict[str, tuple[str, ...]]:
    """The label file of each output that names one (a file beside ``config.pbtxt``)."""
    labels: dict[str, tuple[str, ...]] = {}
    for output in config.output:
        if not output.label_filename:
            continue
        path = folder / output.label_filename
        where = f"output '{output.name}': label_filename '{output.label_filename}'"
        if Path(output.label_filename).is_absolute() or ".." in Path(output.label_filename).parts:
            raise ConfigError(f"{where} must name a file beside config.pbtxt")
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise ConfigError(f"{where}: no such file beside config.pbtxt") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{where} cannot be read: {exc}") from None
        labels[output.name] = tuple(text.splitlines())
    return labels


def class_counts(requested: Sequence[RequestedOutput] | None) -> dict[str, int]:
    """The outputs requested with ``classification: K`` and their K (InvalidInput if K is bad)."""
    counts: dict[str, int] = {}
    for output in requested or ():
        value = output.parameters.get(CLASSIFICATION_PARAMETER)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InvalidInput(
                f"output '{output.name}': parameter '{CLASSIFICATION_PARAMETER}' must be a "
                f"positive integer, got {value!r}"
            )
        counts[output.name] = value
    return counts


def classify(outputs: Tensors, counts: Mapping[str, int], labels: Labels, batched: bool) -> Tensors:
    """Replace each output in ``counts`` by its top-K class strings (BYTES, [rows, K] when the
    model batches, else [K]); the others are left as they are."""
    for name, count in counts.items():
        outputs[name] = top_classes(name, outputs[name], count, labels.get(name, ()), batched)
    return outputs


def top_classes(
    name: str, array: np.ndarray, count: int, labels: Sequence[str], batched: bool
) -> np.ndarray:
    if array.dtype not in _SUPPORTED:
        raise InvalidInput(
            f"output '{name}': class result not available for output due to unsupported type "
            f"'{of_array(array).name}'"
        )
    rows = array.reshape(array.shape[0] if batched and array.ndim else 1, -1)
    k = min(count, rows.shape[1])
    # Highest first; equal scores keep index order.
    if array.dtype.kind == "f":
        keys: np.ndarray = -rows.astype(np.float64)
    else:  # bitwise not reverses the order of integers without overflow
        keys = ~rows.astype(np.uint64 if array.dtype.kind == "u" else np.int64)
    order = np.argsort(keys, axis=1, kind="stable")[:, :k]
    scores = np.take_along_axis(rows, order, axis=1)
    score_format = _SCORE_FORMATS[array.dtype.kind]
    strings = [
        _entry(score_format % score, index, labels)
        for score_row, index_row in zip(scores.tolist(), order.tolist(), strict=True)
        for score, index in zip(score_row, index_row, strict=True)
    ]
    result = np.empty(len(strings), dtype=object)
    result[:] = strings
    return result.reshape((rows.shape[0], k) if batched else (k,))


def _entry(score: str, index: int, labels: Sequence[str]) -> bytes:
    if index < len(labels):
        return f"{score}:{index}:{labels[index]}".encode()
    return f"{score}:{index}".encode()
