"""Calibration and check data for ``inferd optimize``: rows from a ``.npz`` or the model's
``sample.json``, topped up with random rows drawn within the declared or observed range.

A row is one request row of a batching model (the shape without the batch dimension), or one
whole input of a model that does not batch.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from inferd.core.errors import ConfigError

Arrays = dict[str, npt.NDArray[Any]]
LABELS_KEY = "labels"
SAMPLE_FILE = "sample.json"
DEFAULT_RANGE = (0.0, 1.0)


@dataclass(frozen=True, slots=True)
class InputSpec:
    """One model input: name, numpy dtype, and shape (-1 for a variable dimension)."""

    name: str
    dtype: np.dtype[Any]
    shape: tuple[int, ...]

    @property
    def batching(self) -> bool:
        return bool(self.shape) and self.shape[0] == -1

    @property
    def row_shape(self) -> tuple[int, ...]:
        return self.shape[1:] if self.batching else self.shape


@dataclass(slots=True)
class Rows:
    """Aligned rows of every input, optional labels, and where they came from."""

    arrays: Arrays
    labels: npt.NDArray[Any] | None = None
    sources: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(next(iter(self.arrays.values()))) if self.arrays else 0

    def take(self, start: int, stop: int) -> Rows:
        labels = None if self.labels is None else self.labels[start:stop]
        return Rows({k: v[start:stop] for k, v in self.arrays.items()}, labels, list(self.sources))


def parse_range(text: str) -> tuple[str, float, float]:
    """``[NAME=]LOW:HIGH``."""
    name, sep, span = text.rpartition("=")
    low_text, colon, high_text = span.partition(":")
    try:
        low, high = float(low_text), float(high_text)
    except ValueError:
        raise ConfigError(f"--input-range '{text}' is not [NAME=]LOW:HIGH") from None
    if not colon or high < low:
        raise ConfigError(f"--input-range '{text}': HIGH must be at least LOW")
    return (name if sep else ""), low, high


def load_npz(path: Path, inputs: Sequence[InputSpec]) -> Rows:
    try:
        with np.load(path, allow_pickle=False) as data:
            stored = {key: data[key] for key in data.files}
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read calibration file {path}: {exc}") from None
    labels = stored.pop(LABELS_KEY, None)
    if len(inputs) == 1 and inputs[0].name not in stored and len(stored) == 1:
        stored = {inputs[0].name: next(iter(stored.values()))}
    return _checked(stored, labels, inputs, path.name)


def load_sample_json(path: Path, inputs: Sequence[InputSpec]) -> Rows:
    """``{"inputs": rows}`` for a one-input model or ``{"inputs": {name: rows}}``, and
    optional ``"labels"`` (the demo's ``digits/sample.json``)."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        given = doc["inputs"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from None
    if isinstance(given, list):
        if len(inputs) != 1:
            raise ConfigError(f"{path}: 'inputs' is a list, but the model has {len(inputs)}")
        given = {inputs[0].name: given}
    if not isinstance(given, dict):
        raise ConfigError(f"{path}: 'inputs' must be a list of rows or an object of inputs")
    by_name = {spec.name: spec for spec in inputs}
    stored = {
        name: np.asarray(rows, dtype=by_name[name].dtype if name in by_name else None)
        for name, rows in given.items()
    }
    labels = np.asarray(doc["labels"]) if LABELS_KEY in doc else None
    return _checked(stored, labels, inputs, path.name)


def _checked(
    stored: Mapping[str, npt.NDArray[Any]],
    labels: npt.NDArray[Any] | None,
    inputs: Sequence[InputSpec],
    source: str,
) -> Rows:
    arrays: Arrays = {}
    for spec in inputs:
        if spec.name not in stored:
            raise ConfigError(
                f"{source} has no array for input '{spec.name}' (it has "
                f"{', '.join(stored) or 'none'})"
            )
        array = np.ascontiguousarray(stored[spec.name], dtype=spec.dtype)
        row_shape = array.shape[1:]
        if len(row_shape) != len(spec.row_shape) or any(
            want not in (-1, got) for want, got in zip(spec.row_shape, row_shape, strict=True)
        ):
            raise ConfigError(
                f"{source}: rows of input '{spec.name}' have shape {list(row_shape)}, the model "
                f"takes {list(spec.row_shape)} per row"
            )
        arrays[spec.name] = array
    counts = {len(a) for a in arrays.values()}
    if len(counts) != 1 or 0 in counts:
        raise ConfigError(f"{source}: inputs must have the same, non-zero number of rows")
    if labels is not None and len(labels) != len(next(iter(arrays.values()))):
        raise ConfigError(f"{source}: '{LABELS_KEY}' has {len(labels)} rows, inputs have more")
    return Rows(arrays, labels, [f"{len(next(iter(arrays.values())))} rows of {source}"])


def input_ranges(
    inputs: Sequence[InputSpec], declared: Sequence[tuple[str, float, float]], observed: Rows
) -> dict[str, tuple[float, float]]:
    """Per input: the declared range, else the range seen in the data, else [0, 1)."""
    ranges: dict[str, tuple[float, float]] = {}
    for name, low, high in declared:
        if not name:
            if len(inputs) != 1:
                raise ConfigError("--input-range without NAME= is for one-input models only")
            name = inputs[0].name
        if name not in {s.name for s in inputs}:
            raise ConfigError(f"--input-range names '{name}', which is not a model input")
        ranges[name] = (low, high)
    for spec in inputs:
        if spec.name in ranges:
            continue
        if spec.name in observed.arrays:
            values = observed.arrays[spec.name]
            ranges[spec.name] = (float(values.min()), float(values.max()))
        else:
            ranges[spec.name] = DEFAULT_RANGE
    return ranges


def random_rows(
    inputs: Sequence[InputSpec],
    ranges: Mapping[str, tuple[float, float]],
    count: int,
    rng: np.random.Generator,
) -> Rows:
    arrays: Arrays = {}
    for spec in inputs:
        if any(d < 0 for d in spec.row_shape):
            raise ConfigError(
                f"input '{spec.name}' has variable dims {list(spec.shape)}: random rows need "
                "fixed ones; give data with --calibration FILE.npz"
            )
        low, high = ranges[spec.name]
        shape = (count, *spec.row_shape)
        if spec.dtype.kind in "iu":
            arrays[spec.name] = rng.integers(int(low), int(high) + 1, shape).astype(spec.dtype)
        elif spec.dtype.kind == "b":
            arrays[spec.name] = rng.random(shape) < 0.5
        elif spec.dtype.kind == "f":
            arrays[spec.name] = rng.uniform(low, high, shape).astype(spec.dtype)
        else:
            raise ConfigError(
                f"input '{spec.name}' ({spec.dtype}) cannot be drawn at random; give data "
                "with --calibration FILE.npz"
            )
    text = ", ".join(f"{n} in [{lo:g}, {hi:g}]" for n, (lo, hi) in ranges.items())
    return Rows(arrays, None, [f"{count} random rows ({text})"])


def concat(first: Rows, second: Rows) -> Rows:
    if not len(first):
        return second
    if not len(second):
        return first
    arrays = {k: np.concatenate([first.arrays[k], second.arrays[k]]) for k in first.arrays}
    labels = None
    if first.labels is not None and second.labels is None:
        labels = first.labels  # labels cover the leading rows only
    return Rows(arrays, labels, first.sources + second.sources)


def feeds(rows: Rows, inputs: Sequence[InputSpec], batch_rows: int) -> list[Arrays]:
    """The rows as model feeds: slices of ``batch_rows`` for a batching model, else one row."""
    batching = all(s.batching for s in inputs)
    count = len(rows)
    if batching:
        return [
            {k: v[i : i + batch_rows] for k, v in rows.arrays.items()}
            for i in range(0, count, batch_rows)
        ]
    return [{k: v[i] for k, v in rows.arrays.items()} for i in range(count)]
