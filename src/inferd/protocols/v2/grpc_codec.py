"""KServe v2 gRPC messages to and from InferRequest / InferResponse, raw tensor bytes zero-copy.

Infer requests are deserialized here rather than by protobuf alone: above a small size the
``raw_input_contents`` entries are cut out of the received bytes as memoryviews (protobuf
would copy each one twice), and the rest of the message is parsed by protobuf. Responses are
serialized the same way: protobuf encodes the small header, and each output's raw bytes are
appended as a ``raw_output_contents`` field, one join for the whole message.
Tensor checks (shape x datatype x byte length) are the shared ones in codecs.py.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from inferd.core import datatypes
from inferd.core.datatypes import DataType
from inferd.core.errors import InvalidInput
from inferd.core.types import InferRequest, InferResponse, Parameters, RequestedOutput, Tensors
from inferd.plane.shared_memory import SystemSharedMemory
from inferd.protocols import codecs
from inferd.protocols import grpc_service_pb2 as pb
from inferd.protocols.v2 import shm_tensors

REGION = shm_tensors.REGION

# Repeated fields are read as slices (``field[:]``, a list): iterating one directly ends in
# an IndexError raised and caught inside protobuf, which costs more than the loop.

# Below this size a request is parsed by protobuf alone: cutting fields out costs more.
SPLIT_ABOVE_BYTES = 64 * 1024

_RAW_INPUT_FIELD = 7  # ModelInferRequest.raw_input_contents
_RAW_OUTPUT_TAG = bytes([6 << 3 | 2])  # ModelInferResponse.raw_output_contents, length-delimited
_STREAM_RESPONSE_TAG = bytes([2 << 3 | 2])  # ModelStreamInferResponse.infer_response
_INT64_MAX = 2**63 - 1
_SMALL_VARINTS = [bytes((n,)) for n in range(0x80)]

# The typed contents field that carries each datatype (FP16 and BF16 have none: raw only).
_CONTENTS_FIELD: dict[str, str] = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}
# Element type of each contents field as protobuf holds it (wider than INT8, UINT16 ...).
_FIELD_NUMPY: dict[str, np.dtype[Any]] = {
    "bool_contents": np.dtype(np.bool_),
    "int_contents": np.dtype(np.int32),
    "int64_contents": np.dtype(np.int64),
    "uint_contents": np.dtype(np.uint32),
    "uint64_contents": np.dtype(np.uint64),
}
# Fixed-width fields are packed on the wire: their bytes are the little-endian array itself.
_PACKED_FIXED: dict[str, np.dtype[Any]] = {
    "fp32_contents": np.dtype("<f4"),
    "fp64_contents": np.dtype("<f8"),
}


@dataclass(slots=True)
class WireInferRequest:
    """A received ModelInferRequest: the message, and each input's raw bytes (if sent raw)."""

    message: pb.ModelInferRequest
    raw_inputs: list[bytes | memoryview]


def parse_infer_request(data: bytes) -> WireInferRequest:
    """The gRPC request deserializer for ModelInfer and ModelStreamInfer."""
    if len(data) > SPLIT_ABOVE_BYTES:
        split = _split_raw_inputs(data)
        if split is not None:
            head, raws = split
            return WireInferRequest(pb.ModelInferRequest.FromString(head), raws)
    message = pb.ModelInferRequest.FromString(data)
    return WireInferRequest(message, [*message.raw_input_contents[:]])


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7


def _split_raw_inputs(data: bytes) -> tuple[bytes, list[bytes | memoryview]] | None:
    """Cut field 7 out of a serialized request: (the other fields, views of field 7).

    Walks the top-level fields only (a handful per request, whatever the tensor sizes).
    None when the bytes hold anything unexpected: protobuf then parses, and reports, them all.
    """
    view = memoryview(data)
    raws: list[bytes | memoryview] = []
    kept: list[memoryview] = []
    pos, kept_from, end = 0, 0, len(data)
    try:
        while pos < end:
            field_start = pos
            key, pos = _read_varint(data, pos)
            if key & 7 != 2:  # every ModelInferRequest field is length-delimited
                return None
            size, pos = _read_varint(data, pos)
            if pos + size > end:
                return None
            if key >> 3 == _RAW_INPUT_FIELD:
                kept.append(view[kept_from:field_start])
                raws.append(view[pos : pos + size])
                kept_from = pos + size
            pos += size
    except IndexError:  # truncated varint
        return None
    kept.append(view[kept_from:])
    return b"".join(kept), raws


def decode_request(
    wire: WireInferRequest, regions: SystemSharedMemory | None = None
) -> InferRequest:
    """The request; inputs that name a shared memory region are views over ``regions`` (and
    have no raw_input_contents entry, as Triton's clients send them)."""
    message, raws = wire.message, wire.raw_inputs
    if not message.model_name:
        raise InvalidInput("'model_name' is missing")
    tensors = message.inputs[:]
    in_shm = (
        [bool(t.parameters) and REGION in t.parameters for t in tensors]
        if regions is not None
        else []
    )
    on_wire = len(tensors) - sum(in_shm)
    if raws and len(raws) != on_wire:
        for index, tensor in enumerate(tensors):  # Triton checks this first, input by input
            if not (in_shm and in_shm[index]) and tensor.HasField("contents"):
                raise _contents_and_raw(tensor.name, message.model_name)
        raise InvalidInput(
            f"raw_input_contents has {len(raws)} entries but the request has "
            f"{on_wire} inputs outside shared memory; send one entry per input, in order"
        )
    inputs: Tensors = {}
    input_parameters: dict[str, Parameters] = {}
    raw_index = 0
    for index, tensor in enumerate(tensors):
        name = tensor.name
        if not name:
            raise InvalidInput(f"inputs[{index}]: 'name' is missing")
        if name in inputs:
            raise InvalidInput(f"input '{name}' is given twice")
        datatype = _datatype(name, tensor.datatype)
        shape = codecs.check_shape(name, tensor.shape[:])
        if in_shm and in_shm[index]:
            params = parameters_to_dict(tensor.parameters)
            if tensor.HasField("contents"):
                raise InvalidInput(
                    f"input '{name}' names a shared memory region: it takes no contents"
                )
            assert regions is not None
            inputs[name] = shm_tensors.read_input(regions, name, datatype, shape, params)
        elif raws:
            if tensor.HasField("contents"):
                raise _contents_and_raw(name, message.model_name)
            inputs[name] = codecs.from_raw(name, datatype, shape, raws[raw_index])
            raw_index += 1
        else:
            inputs[name] = _from_contents(name, datatype, shape, tensor)
        if tensor.parameters:
            input_parameters[name] = parameters_to_dict(tensor.parameters)
    outputs = [
        RequestedOutput(o.name, parameters_to_dict(o.parameters)) for o in message.outputs[:]
    ]
    return InferRequest(
        model_name=message.model_name,
        model_version=message.model_version,
        inputs=inputs,
        id=message.id,
        outputs=outputs or None,
        parameters=parameters_to_dict(message.parameters) if message.parameters else {},
        input_parameters=input_parameters,
    )


def _contents_and_raw(name: str, model: str) -> InvalidInput:
    """Triton's words (infer_handler.cc) for an input with typed contents beside raw ones."""
    return InvalidInput(
        f"contents field must not be specified when using raw_input_contents for '{name}' "
        f"for model '{model}'"
    )


def _datatype(name: str, text: str) -> DataType:
    if not text:
        raise InvalidInput(f"input '{name}': 'datatype' is missing")
    try:
        return datatypes.from_name(text)
    except InvalidInput as exc:
        raise InvalidInput(f"input '{name}': {exc.message}") from None


def _from_contents(
    name: str,
    datatype: DataType,
    shape: tuple[int, ...],
    tensor: pb.ModelInferRequest.InferInputTensor,
) -> np.ndarray:
    count = codecs.element_count(shape)
    if not tensor.HasField("contents") and count:
        raise InvalidInput(f"input '{name}' has no data: set its 'contents' or raw_input_contents")
    expected = _CONTENTS_FIELD.get(datatype.name)
    if expected is None:
        raise InvalidInput(
            f"input '{name}': {datatype.name} has no typed contents field; "
            "send it in raw_input_contents"
        )
    contents = tensor.contents
    for fd, _ in contents.ListFields():
        if fd.name != expected:
            raise InvalidInput(
                f"input '{name}': contents.{fd.name} does not carry {datatype.name}; "
                f"use contents.{expected}"
            )
    values = getattr(contents, expected)
    if len(values) != count:
        raise InvalidInput(
            f"input '{name}': shape {list(shape)} needs {count} values, "
            f"got {len(values)} in contents.{expected}"
        )
    if datatype.is_bytes:
        array = np.empty(count, dtype=object)
        array[:] = list(values)
        return array.reshape(shape)
    packed = _PACKED_FIXED.get(expected)
    if packed is not None:  # the packed field's bytes are the array: no per-element work
        return _packed_array(contents.SerializeToString(), packed, count).reshape(shape)
    wide = np.array(list(values), dtype=_FIELD_NUMPY[expected])
    if wide.dtype != datatype.numpy:
        info = np.iinfo(datatype.numpy.str)  # INT8, INT16, UINT8, UINT16 only
        if count and (wide.min() < info.min or wide.max() > info.max):
            raise InvalidInput(
                f"input '{name}': contents.{expected} holds values outside the "
                f"{datatype.name} range {info.min}..{info.max}"
            )
        wide = wide.astype(datatype.numpy)
    return wide.reshape(shape)


def _packed_array(data: bytes, dtype: np.dtype[Any], count: int) -> np.ndarray:
    if not count:
        return np.empty(0, dtype=dtype)
    _, pos = _read_varint(data, 0)  # the field key
    size, pos = _read_varint(data, pos)
    return np.frombuffer(data, dtype=dtype, count=size // dtype.itemsize, offset=pos)


def parameters_to_dict(params: Mapping[str, pb.InferParameter]) -> Parameters:
    found: Parameters = {}
    for key, param in params.items():
        choice = param.WhichOneof("parameter_choice")
        if choice is not None:
            found[key] = getattr(param, choice)
    return found


def set_parameters(target: Any, params: Mapping[str, Any]) -> None:
    """Fill a ``map<string, InferParameter>`` from Python values."""
    for key, value in params.items():
        param = target[key]
        if isinstance(value, bool | np.bool_):
            param.bool_param = bool(value)
        elif isinstance(value, int | np.integer):
            if int(value) > _INT64_MAX:
                param.uint64_param = int(value)
            else:
                param.int64_param = int(value)
        elif isinstance(value, float | np.floating):
            param.double_param = float(value)
        else:
            param.string_param = str(value)


@dataclass(slots=True)
class EncodedInferResponse:
    """A ModelInferResponse as header message plus the outputs' raw bytes, not yet joined."""

    header: pb.ModelInferResponse
    raw_outputs: list[bytes | memoryview] = field(default_factory=list)

    def chunks(self) -> list[bytes | memoryview]:
        parts: list[bytes | memoryview] = [self.header.SerializeToString()]
        for raw in self.raw_outputs:
            parts += (_RAW_OUTPUT_TAG, _varint(len(raw)), raw)
        return parts

    def serialize(self) -> bytes:
        """The gRPC response serializer for ModelInfer."""
        return b"".join(self.chunks())


def encode_response(
    response: InferResponse, in_shared_memory: Collection[str] = ()
) -> EncodedInferResponse:
    """``in_shared_memory``: the outputs already written to shared memory. As Triton does, every
    output keeps its place and has a raw_output_contents entry, empty for those: clients (the
    C++ one in perf_analyzer, tritonclient) find an output's bytes by its position."""
    header = pb.ModelInferResponse(
        model_name=response.model_name, model_version=response.model_version, id=response.id
    )
    raws: list[bytes | memoryview] = []
    for name, array in response.outputs.items():
        header.outputs.add(name=name, datatype=datatypes.of_array(array).name, shape=array.shape)
        raws.append(b"" if name in in_shared_memory else codecs.to_raw(array))
    if response.parameters:
        set_parameters(header.parameters, response.parameters)
    return EncodedInferResponse(header, raws)


def error_header(wire: WireInferRequest) -> EncodedInferResponse:
    """What a stream answers with its error message: which request failed."""
    message = wire.message
    header = pb.ModelInferResponse(
        model_name=message.model_name, model_version=message.model_version, id=message.id
    )
    return EncodedInferResponse(header)


@dataclass(slots=True)
class StreamResponse:
    """One ModelStreamInferResponse: a response, or the error of one request of the stream."""

    response: EncodedInferResponse
    error_message: str = ""

    def serialize(self) -> bytes:
        """The gRPC response serializer for ModelStreamInfer."""
        parts: list[bytes | memoryview] = []
        if self.error_message:
            parts.append(
                pb.ModelStreamInferResponse(error_message=self.error_message).SerializeToString()
            )
        inner = self.response.chunks()
        parts += (_STREAM_RESPONSE_TAG, _varint(sum(len(c) for c in inner)), *inner)
        return b"".join(parts)


def _varint(value: int) -> bytes:
    if value < 0x80:
        return _SMALL_VARINTS[value]
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)
