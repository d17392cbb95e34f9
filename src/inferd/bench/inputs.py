"""The tensors the bench sends: shapes resolved against the model, data random, zero or from a file.

Shapes follow perf_analyzer: a batching model's first dim becomes ``--batch-size``;
``--shape NAME:DIMS`` fills the other variable dims (given with or without the batch dim).
A data file is perf_analyzer's ``{"data": [{NAME: [...] | {"content": [...], "shape": [...]}}]}``
(several entries are sent in turn) or one KServe v2 request ``{"inputs": [...]}``, whose
names, datatypes and shapes are sent as written, so it also serves servers that describe no
inputs, and can provoke rejections on purpose.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from inferd.bench.options import BenchError
from inferd.bench.specs import ModelSpec, TensorSpec
from inferd.core import datatypes
from inferd.core.datatypes import DataType
from inferd.core.errors import InvalidInput
from inferd.protocols import codecs


@dataclass(frozen=True, slots=True)
class InputTensor:
    name: str
    datatype: DataType
    array: np.ndarray


Sample = tuple[InputTensor, ...]


def batches(spec: ModelSpec) -> bool:
    """Whether the first dim of every input is the batch dim."""
    if spec.max_batch_size is not None:
        return spec.max_batch_size > 0
    return bool(spec.inputs) and all(t.shape[:1] == (-1,) for t in spec.inputs)


def resolve_shapes(
    spec: ModelSpec, batch_size: int, overrides: dict[str, tuple[int, ...]]
) -> dict[str, tuple[int, ...]]:
    """The concrete shape of every input, or a BenchError naming the input at fault."""
    names = {t.name for t in spec.inputs}
    for name in overrides:
        if name not in names:
            raise BenchError(
                f"--shape: model '{spec.name}' has no input '{name}' "
                f"(inputs: {', '.join(sorted(names)) or 'none described'})"
            )
    batching = batches(spec)
    if batching and spec.max_batch_size and batch_size > spec.max_batch_size:
        raise BenchError(
            f"--batch-size {batch_size} is over model '{spec.name}' max_batch_size "
            f"{spec.max_batch_size}"
        )
    if not batching and batch_size > 1:
        raise BenchError(f"model '{spec.name}' does not batch; --batch-size must be 1")
    return {t.name: _shape_of(t, batching, batch_size, overrides.get(t.name)) for t in spec.inputs}


def _shape_of(
    tensor: TensorSpec, batching: bool, batch_size: int, given: tuple[int, ...] | None
) -> tuple[int, ...]:
    model = tensor.shape
    if given is None:
        shape = tuple(batch_size if batching and i == 0 else d for i, d in enumerate(model))
        if -1 in shape:
            raise BenchError(
                f"input '{tensor.name}' has variable dims {list(model)}; "
                f"give --shape {tensor.name}:DIMS"
            )
        return shape
    if batching and len(given) == len(model) - 1:
        given = (batch_size, *given)
    check_shape(tensor, given)
    return given


def check_shape(tensor: TensorSpec, shape: tuple[int, ...]) -> None:
    """A shape must have the model's rank and agree with every fixed dim."""
    model = tensor.shape
    if len(shape) != len(model) or any(m not in (-1, d) for m, d in zip(model, shape, strict=True)):
        raise BenchError(
            f"shape {list(shape)} for input '{tensor.name}' does not match the model's "
            f"{list(model)}"
        )


def generated(
    spec: ModelSpec, shapes: dict[str, tuple[int, ...]], kind: str, seed: int = 0
) -> list[Sample]:
    """One sample of random or zero data for every input."""
    if not spec.inputs:
        raise BenchError(
            f"model '{spec.name}' describes no inputs; give --input-data FILE.json with a "
            'v2 request {"inputs": [...]}'
        )
    rng = np.random.default_rng(seed)
    sample = []
    for tensor in spec.inputs:
        datatype = _datatype(tensor.datatype, tensor.name)
        sample.append(
            InputTensor(tensor.name, datatype, _data(datatype, shapes[tensor.name], kind, rng))
        )
    return [tuple(sample)]


def _datatype(name: str, input_name: str) -> DataType:
    try:
        return datatypes.from_name(name)
    except InvalidInput:
        raise BenchError(f"input '{input_name}': unknown datatype '{name}'") from None


def _data(
    datatype: DataType, shape: tuple[int, ...], kind: str, rng: np.random.Generator
) -> np.ndarray:
    if datatype.is_bytes:
        text = b"" if kind == "zero" else rng.bytes(8).hex().encode()
        return np.full(shape, text, dtype=object)
    if kind == "zero":
        return np.zeros(shape, dtype=datatype.numpy)
    if datatype.name == "BOOL":
        return rng.random(shape) < 0.5
    if datatype.numpy.kind in "iu":
        return rng.integers(0, 100, size=shape).astype(datatype.numpy)
    return rng.random(shape, dtype=np.float32).astype(datatype.numpy)


def from_file(
    path: Path, spec: ModelSpec, shapes: dict[str, tuple[int, ...]], batch_size: int
) -> list[Sample]:
    """Samples from a JSON data file (see the module docstring for its two forms)."""
    try:
        doc = orjson.loads(path.read_bytes())
    except OSError as exc:
        raise BenchError(f"--input-data {path}: {exc.strerror or exc}") from None
    except orjson.JSONDecodeError as exc:
        raise BenchError(f"--input-data {path}: not JSON: {exc}") from None
    try:
        if isinstance(doc, dict) and isinstance(doc.get("inputs"), list):
            return [_v2_request(doc["inputs"], spec)]
        if isinstance(doc, dict) and isinstance(doc.get("data"), list) and doc["data"]:
            return [_pa_entry(e, spec, shapes, batch_size) for e in doc["data"]]
    except InvalidInput as exc:
        raise BenchError(f"--input-data {path}: {exc.message}") from None
    raise BenchError(
        f'--input-data {path}: expected {{"data": [...]}} (perf_analyzer) or a v2 request '
        '{"inputs": [...]}'
    )


def _v2_request(items: list[Any], spec: ModelSpec) -> Sample:
    known = {t.name: t for t in spec.inputs}
    sample = []
    for item in items:
        if not isinstance(item, dict) or not {"name", "datatype", "shape", "data"} <= item.keys():
            raise BenchError("--input-data: each input needs name, datatype, shape and data")
        name = str(item["name"])
        shape = codecs.check_shape(name, item["shape"])
        if name in known:
            check_shape(known[name], shape)
        datatype = _datatype(str(item["datatype"]), name)
        sample.append(
            InputTensor(name, datatype, codecs.from_json_data(name, datatype, shape, item["data"]))
        )
    return tuple(sample)


def _pa_entry(
    entry: Any, spec: ModelSpec, shapes: dict[str, tuple[int, ...]], batch_size: int
) -> Sample:
    if not isinstance(entry, dict):
        raise BenchError("--input-data: each entry of 'data' must be an object")
    missing = [t.name for t in spec.inputs if t.name not in entry]
    unknown = [n for n in entry if n not in shapes]
    if unknown or missing:
        what = f"no input '{unknown[0]}'" if unknown else f"input '{missing[0]}' missing"
        raise BenchError(f"--input-data: {what} (model '{spec.name}' takes {', '.join(shapes)})")
    batching = batches(spec)
    sample = []
    for tensor in spec.inputs:
        value = entry[tensor.name]
        shape = shapes[tensor.name]
        datatype = _datatype(tensor.datatype, tensor.name)
        if isinstance(value, dict):
            if "shape" in value:
                given = codecs.check_shape(tensor.name, value["shape"])
                shape = (batch_size, *given) if batching else given
                check_shape(tensor, shape)
            if "datatype" in value:
                datatype = _datatype(str(value["datatype"]), tensor.name)
            value = value.get("content")
        per_row = shape[1:] if batching else shape
        flat = codecs.from_json_data(tensor.name, datatype, (_count(value),), value)
        if batching and flat.size == codecs.element_count(per_row):
            flat = np.tile(flat, batch_size)  # one row given: every row of the batch repeats it
        if flat.size != codecs.element_count(shape):
            raise BenchError(
                f"--input-data: input '{tensor.name}' of shape {list(shape)} needs "
                f"{codecs.element_count(shape)} values, got {flat.size}"
            )
        array = flat.reshape(shape)
        sample.append(InputTensor(tensor.name, datatype, array))
    return tuple(sample)


def _count(value: Any) -> int:
    """Elements in nested JSON lists (no per-element loop: numpy measures it)."""
    if isinstance(value, str):
        return 1
    try:
        return int(np.asarray(value, dtype=object).size)
    except ValueError:
        raise BenchError("--input-data: ragged nested lists") from None
