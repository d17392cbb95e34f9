"""What crosses a worker connection: tensors, requests, results and errors as plain tuples.

A numeric tensor is ``(name, dtype name, shape, data)``: ``data`` is a ``bytearray`` for a
tensor of a few KB (it rides in the message, and arrives writable) or a ``Ref`` to an arena
block (copied once, read in place). A BYTES tensor travels as Triton's serialization (a 4-byte
little-endian length before each element), so any bytes survive: NULs, non-UTF-8. Errors
travel as (class name, message[, status]) and come back as the same ``InferdError`` class.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from inferd.backends.work import CANCELLED, Executed, InstanceFailed, Result, Work
from inferd.core.errors import (
    ConfigError,
    DeadlineExceeded,
    InferdError,
    InternalError,
    InvalidInput,
    ModelFailed,
    ModelLoadError,
    NotFound,
    PayloadTooLarge,
    Unavailable,
    Unimplemented,
)
from inferd.core.types import Tensors
from inferd.scheduling.channel import Channel

INLINE_BYTES = 16 << 10  # a tensor up to this size rides in the message
INLINE_BUDGET_BYTES = 32 << 10  # inline bytes per message at most
READ_CHUNK_BYTES = 8 << 20  # a large element leaves shared memory in chunks this large
BYTES = "BYTES"

_LEN = struct.Struct("<I")
_ERRORS: dict[str, type[InferdError]] = {
    cls.__name__: cls
    for cls in (
        InvalidInput,
        PayloadTooLarge,
        NotFound,
        Unavailable,
        DeadlineExceeded,
        Unimplemented,
        ModelLoadError,
        ConfigError,
        InternalError,
        InstanceFailed,
        ModelFailed,
    )
}
_DTYPES: dict[str, np.dtype[Any]] = {}
_NAMES: dict[np.dtype[Any], str] = {}  # dtype.name is computed in Python each time: slow


def dtype_named(name: str) -> np.dtype[Any]:
    """A numpy dtype by name (``bfloat16`` comes from ml_dtypes)."""
    dtype = _DTYPES.get(name)
    if dtype is None:
        if name == "bfloat16":
            import ml_dtypes

            dtype = np.dtype(ml_dtypes.bfloat16)
        else:
            dtype = np.dtype(name)
        _DTYPES[name] = dtype
    return dtype


def bytes_parts(array: np.ndarray) -> tuple[list[bytes | bytearray], int]:
    """Triton's BYTES serialization of an object, bytes or str array (str as UTF-8), as the
    parts to write one after the other (the elements themselves, never copied here), and
    their total length."""
    parts: list[bytes | bytearray] = []
    total = 0
    for item in array.ravel().tolist():
        if isinstance(item, bytes | bytearray):
            data = item
        elif isinstance(item, memoryview):
            data = item.tobytes()
        else:
            data = str(item).encode("utf-8")
        size = len(data)
        parts.append(_LEN.pack(size))
        parts.append(data)
        total += 4 + size
    return parts, total


def serialize_bytes(array: np.ndarray) -> bytes:
    """Triton's BYTES serialization of an object, bytes or str array (str as UTF-8)."""
    return b"".join(bytes_parts(array)[0])


def deserialize_bytes(
    raw: bytes | bytearray | memoryview,
    shape: tuple[int, ...],
    element: type[bytes] | type[bytearray] = bytes,
    read: Callable[[int, int], None] | None = None,
) -> np.ndarray:
    """An object array of ``element`` (``bytes``, or ``bytearray`` for an executor that hands
    its requests writable bodies) from Triton's BYTES serialization. ``read(start, end)`` is
    told of each large range of ``raw`` copied out (a bytearray's, chunk by chunk), so that a
    mapping of shared memory lets go of its pages as it goes."""
    view = memoryview(raw)
    items: list[bytes | bytearray] = []
    offset, end = 0, len(view)
    while offset < end:
        (size,) = _LEN.unpack_from(view, offset)
        offset += 4
        if read is None or size < READ_CHUNK_BYTES:
            items.append(element(view[offset : offset + size]))
        elif element is bytearray:  # grown by remapping, chunk by chunk
            item = bytearray()
            for at in range(offset, offset + size, READ_CHUNK_BYTES):
                stop = min(at + READ_CHUNK_BYTES, offset + size)
                item += view[at:stop]
                read(at, stop)
            items.append(item)
        else:
            items.append(element(view[offset : offset + size]))
            read(offset, offset + size)
        offset += size
    array = np.empty(len(items), dtype=object)
    array[:] = items
    return array.reshape(shape)


class Encoder:
    """Encodes the tensors of one message, inline while its budget lasts, else in arenas."""

    __slots__ = ("_budget", "_channel")

    def __init__(self, channel: Channel) -> None:
        self._channel = channel
        self._budget = INLINE_BUDGET_BYTES

    def tensors(self, tensors: Tensors) -> list[tuple[Any, ...]]:
        return [self.tensor(name, array) for name, array in tensors.items()]

    def tensor(self, name: str, array: np.ndarray) -> tuple[Any, ...]:
        if not isinstance(array, np.ndarray):
            array = np.asarray(array)
        dtype = array.dtype
        token = _NAMES.get(dtype)
        if token is None:
            if dtype.kind in "OSU":
                parts, size = bytes_parts(array)
                if size <= INLINE_BYTES and size <= self._budget:
                    self._budget -= size
                    return (name, BYTES, array.shape, b"".join(parts))
                # written part by part into the arena: a large element is copied once
                return (name, BYTES, array.shape, self._channel.arenas.put_parts(parts, size))
            if not dtype.isnative:
                array = array.astype(dtype.newbyteorder("="))
                dtype = array.dtype
            token = _NAMES.setdefault(dtype, dtype.name)
        nbytes = array.nbytes
        if nbytes <= INLINE_BYTES and nbytes <= self._budget:
            self._budget -= nbytes
            data: Any = bytearray(np.ascontiguousarray(array).data)
        else:
            data = self._channel.arenas.put(array)
        return (name, token, array.shape, data)


def decode_tensors(
    channel: Channel,
    encoded: Sequence[tuple[Any, ...]],
    element: type[bytes] | type[bytearray] = bytes,
) -> Tensors:
    """The tensors of one message; BYTES elements as ``element`` (``deserialize_bytes``)."""
    tensors: Tensors = {}
    for name, token, shape, data in encoded:
        if token == BYTES:
            if isinstance(data, bytes | bytearray):
                tensors[name] = deserialize_bytes(data, tuple(shape), element)
            else:  # read in place: each element copied once, out of the arena
                mapped = channel.mapped
                with mapped.view(data) as view:
                    read = functools.partial(mapped.drop_pages, data)
                    tensors[name] = deserialize_bytes(view, tuple(shape), element, read)
            continue
        dtype = dtype_named(token)
        if isinstance(data, bytearray | bytes):
            tensors[name] = np.frombuffer(data, dtype).reshape(shape)
        else:
            tensors[name] = channel.mapped.array(tuple(data), dtype, tuple(shape))
    return tensors


# ---------------------------------------------------------------------- errors


def encode_error(exc: InferdError) -> tuple[Any, ...]:
    if isinstance(exc, ModelFailed):
        return ModelFailed.__name__, exc.message, exc.status
    for cls in type(exc).__mro__:
        if cls.__name__ in _ERRORS and _ERRORS[cls.__name__] is cls:
            return cls.__name__, exc.message
    return InternalError.__name__, exc.message


def decode_error(name: str, message: str, status: int | None = None) -> InferdError:
    if status is not None and name == ModelFailed.__name__:
        return ModelFailed(message, status)
    return _ERRORS.get(name, InternalError)(message)


# ---------------------------------------------------------------------- requests and results


def tensor_bytes(array: np.ndarray) -> int:
    """What ``array``'s data takes: its elements' lengths for BYTES (object) tensors."""
    if array.dtype.kind != "O":
        return int(array.nbytes)
    return sum(len(x) for x in array.flat if isinstance(x, (bytes, bytearray, memoryview, str)))


def works_bytes(works: Sequence[Work]) -> int:
    """What the tensors of ``works`` take (``tensor_bytes``)."""
    return sum(tensor_bytes(np.asarray(a)) for w in works for a in w.inputs.values())


def encode_works(channel: Channel, works: Sequence[Work]) -> list[tuple[Any, ...]]:
    encoder = Encoder(channel)
    return [
        (
            w.request_id,
            w.rows,
            w.outputs,
            w.parameters,
            w.correlation_id,
            w.flags,
            encoder.tensors(w.inputs),
        )
        for w in works
    ]


def decode_works(
    channel: Channel,
    encoded: Sequence[tuple[Any, ...]],
    element: type[bytes] | type[bytearray] = bytes,
) -> list[Work]:
    """The requests of one job; BYTES elements as ``element`` (``deserialize_bytes``)."""
    return [
        Work(
            decode_tensors(channel, inputs, element),
            rows,
            tuple(outputs),
            request_id,
            parameters,
            correlation_id,
            flags,
        )
        for request_id, rows, outputs, parameters, correlation_id, flags, inputs in encoded
    ]


def encode_result(encoder: Encoder, result: Result) -> tuple[Any, ...]:
    if result is CANCELLED:
        return ("C",)
    if isinstance(result, InferdError):
        return ("E", *encode_error(result))
    return ("T", encoder.tensors(result))


def decode_result(channel: Channel, encoded: tuple[Any, ...]) -> Result:
    if encoded[0] == "T":
        return decode_tensors(channel, encoded[1])
    if encoded[0] == "C":
        return CANCELLED
    return decode_error(*encoded[1:])


def encode_executed(channel: Channel, executed: Executed) -> tuple[Any, ...]:
    encoder = Encoder(channel)
    return (
        [encode_result(encoder, r) for r in executed.results],
        executed.input_ns,
        executed.infer_ns,
        executed.output_ns,
    )


def decode_executed(channel: Channel, encoded: tuple[Any, ...]) -> Executed:
    results, input_ns, infer_ns, output_ns = encoded
    return Executed([decode_result(channel, r) for r in results], input_ns, infer_ns, output_ns)
