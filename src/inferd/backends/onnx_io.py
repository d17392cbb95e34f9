"""An ONNX file's inputs, outputs and metadata, read without reading its weights.

Config completion needs a model's graph inputs and outputs, the names of its initializers (old
exporters list those among the inputs) and its metadata properties. ``onnx.load`` parses the
whole file, weights included: for a 10 MB model that is most of a cold load's time (lazy
serving loads models on first use). ``light_model`` maps the file and walks the protobuf wire
format, copying only those fields (each initializer reduced to its name) into a small
``ModelProto``; the weights' pages are never read. A file that is not a well-formed ONNX
protobuf raises ``ValueError``.
"""

from __future__ import annotations

import mmap
from collections.abc import Iterator
from pathlib import Path

import onnx

# Field numbers of onnx.proto (ModelProto, GraphProto, TensorProto).
_MODEL_KEPT = {1, 8, 14}  # ir_version, opset_import, metadata_props
_MODEL_GRAPH = 7
_GRAPH_KEPT = {2, 11, 12}  # name, input, output
_GRAPH_INITIALIZER = 5
_TENSOR_NAME = 8
_LENGTH_DELIMITED = 2


def _varint(data: memoryview, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise ValueError("truncated or malformed varint")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def _fields(data: memoryview, start: int, end: int) -> Iterator[tuple[int, int, int, int]]:
    """(field number, wire type, start of the field's tag, end of the field) of each field;
    a length-delimited field's value is the last ``length`` bytes before its end."""
    pos = start
    while pos < end:
        tag_at = pos
        tag, pos = _varint(data, pos)
        field, wire = tag >> 3, tag & 7
        if wire == 0:
            _, pos = _varint(data, pos)
        elif wire == 1:
            pos += 8
        elif wire == _LENGTH_DELIMITED:
            length, pos = _varint(data, pos)
            pos += length
        elif wire == 5:
            pos += 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        if pos > end or field == 0:
            raise ValueError("truncated or malformed protobuf field")
        yield field, wire, tag_at, pos


def _value(data: memoryview, tag_at: int) -> tuple[int, int]:
    """Where a length-delimited field's value lies."""
    _, pos = _varint(data, tag_at)
    length, pos = _varint(data, pos)
    return pos, pos + length


def _length_delimited(field: int, value: bytes) -> bytes:
    tag = (field << 3) | _LENGTH_DELIMITED
    out = bytearray()
    for number in (tag, len(value)):
        while number >= 0x80:
            out.append((number & 0x7F) | 0x80)
            number >>= 7
        out.append(number)
    return bytes(out) + value


def _initializer_name(data: memoryview, start: int, end: int) -> bytes:
    for field, wire, tag_at, _ in _fields(data, start, end):
        if field == _TENSOR_NAME and wire == _LENGTH_DELIMITED:
            begin, stop = _value(data, tag_at)
            return bytes(data[begin:stop])
    return b""


def _light(data: memoryview) -> bytes:
    out = bytearray()
    for field, wire, tag_at, end in _fields(data, 0, len(data)):
        if field in _MODEL_KEPT:
            out += data[tag_at:end]
        elif field == _MODEL_GRAPH and wire == _LENGTH_DELIMITED:
            graph = bytearray()
            start, stop = _value(data, tag_at)
            for inner, inner_wire, inner_at, inner_end in _fields(data, start, stop):
                if inner in _GRAPH_KEPT:
                    graph += data[inner_at:inner_end]
                elif inner == _GRAPH_INITIALIZER and inner_wire == _LENGTH_DELIMITED:
                    name = _initializer_name(data, *_value(data, inner_at))
                    tensor = _length_delimited(_TENSOR_NAME, name)
                    graph += _length_delimited(_GRAPH_INITIALIZER, tensor)
            out += _length_delimited(_MODEL_GRAPH, bytes(graph))
    return bytes(out)


def light_model(path: Path) -> onnx.ModelProto:
    """The model's ir_version, opsets, metadata, graph inputs and outputs, and initializer
    names (nothing else); ValueError for a file that is not an ONNX protobuf."""
    with open(path, "rb") as file:
        if not file.seek(0, 2):
            raise ValueError("the file is empty")
        with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            view = memoryview(mapped)
            try:
                light = _light(view)
            finally:
                view.release()
    model = onnx.ModelProto()
    model.ParseFromString(light)
    return model
