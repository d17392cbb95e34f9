"""Tensor codecs shared by every protocol: JSON values, raw little-endian bytes, BYTES framing.

Decoding checks shape x datatype x byte length once; after that the core trusts the array.
Numeric tensors never pass through a per-element Python loop; only BYTES elements, which
are Python objects by nature, are framed one by one.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from typing import Any

import numpy as np

from inferd.core import datatypes
from inferd.core.datatypes import DataType
from inferd.core.errors import InvalidInput

_LEN = struct.Struct("<I")
MAX_DIMS = 32  # numpy allows 64; no model takes more
MAX_ELEMENTS = 1 << 40  # per tensor, counting zero-sized dimensions as 1
_INT_ONLY = frozenset({int})
FEW_VALUES = 64  # up to this many values a check runs on Python floats, not numpy calls
# Shapes (tuples of ints) that passed ``check_shape``: the same few come again and again.
VALID_SHAPES_KEPT = 256
_VALID_SHAPES: set[tuple[int, ...]] = set()


def check_shape(name: str, shape: Any) -> tuple[int, ...]:
    # Whole-list checks (no per-dimension Python code): only ints (not bools), none negative.
    if not isinstance(shape, list | tuple) or not {*map(type, shape)} <= _INT_ONLY:
        raise InvalidInput(f"input '{name}': shape must be a list of non-negative integers")
    dims = tuple(shape)
    if dims in _VALID_SHAPES:  # a shape of ints that passed before
        return dims
    if shape and min(shape) < 0:
        raise InvalidInput(f"input '{name}': shape must be a list of non-negative integers")
    if len(shape) > MAX_DIMS:
        raise InvalidInput(f"input '{name}': shape has {len(shape)} dimensions, at most {MAX_DIMS}")
    # Zero-sized dimensions do not make the others harmless to numpy: bound the rest.
    if math.prod(filter(None, shape)) > MAX_ELEMENTS:
        raise InvalidInput(f"input '{name}': shape {list(shape)} is too large")
    if len(_VALID_SHAPES) >= VALID_SHAPES_KEPT:  # many distinct shapes: start over
        _VALID_SHAPES.clear()
    _VALID_SHAPES.add(dims)
    return dims


def element_count(shape: Sequence[int]) -> int:
    return math.prod(shape)


def from_json_data(name: str, datatype: DataType, shape: tuple[int, ...], data: Any) -> np.ndarray:
    """A tensor from JSON ``data`` (flat or nested, row-major)."""
    count = math.prod(shape)
    if datatype.is_bytes:
        array = _bytes_from_json(name, data)
    elif datatype.name == "BF16":
        raise InvalidInput(f"input '{name}': BF16 data must be sent as binary data")
    else:
        try:
            array = np.asarray(data, dtype=datatype.numpy)
        except (ValueError, TypeError, OverflowError):
            raise InvalidInput(
                f"input '{name}': data is not a (nested) list of {datatype.name} values"
            ) from None
        if array.dtype.kind == "f":
            size = array.size
            if size > FEW_VALUES or (size and not all(map(math.isfinite, array.ravel().tolist()))):
                check_finite(name, datatype, array)  # raises, naming it, if one is not finite
    if array.size != count:
        raise InvalidInput(
            f"input '{name}': shape {list(shape)} needs {count} values, got {array.size}"
        )
    return array.reshape(shape)


def check_finite(name: str, datatype: DataType, array: np.ndarray) -> None:
    """JSON has no NaN or infinity: one in a float array was a null or out of range."""
    if array.dtype.kind != "f" or not array.size:
        return
    if array.size <= FEW_VALUES:  # cheaper than two numpy calls on a handful of values
        finite = all(map(math.isfinite, array.ravel().tolist()))
    else:
        finite = bool(np.isfinite(array).all())
    if not finite:
        raise InvalidInput(
            f"input '{name}': data holds null or a value outside the range of {datatype.name}"
        )


def _bytes_from_json(name: str, data: Any) -> np.ndarray:
    """BYTES from JSON strings, flat or nested, each UTF-8 encoded as it is (never through
    fixed-width numpy strings, which drop trailing NULs)."""
    items: list[bytes] = []
    stack = [data]
    while stack:
        value = stack.pop()
        if isinstance(value, str):
            items.append(value.encode("utf-8"))
        elif isinstance(value, list):
            stack.extend(reversed(value))
        else:
            raise InvalidInput(f"input '{name}': BYTES data must be a list of strings")
    array = np.empty(len(items), dtype=object)
    array[:] = items
    return array


def from_raw(
    name: str, datatype: DataType, shape: tuple[int, ...], raw: memoryview | bytes
) -> np.ndarray:
    """A tensor from little-endian bytes (BYTES: 4-byte length prefix per element). No copy."""
    count = element_count(shape)
    if datatype.is_bytes:
        return _bytes_from_raw(name, shape, count, raw)
    expected = count * datatype.itemsize
    if len(raw) != expected:
        raise InvalidInput(
            f"input '{name}': shape {list(shape)} of {datatype.name} needs {expected} bytes, "
            f"got {len(raw)}"
        )
    return np.ndarray(shape, datatype.numpy, raw)  # frombuffer + reshape in one call


def _bytes_from_raw(
    name: str, shape: tuple[int, ...], count: int, raw: memoryview | bytes
) -> np.ndarray:
    view = memoryview(raw)
    items: list[bytes] = []
    offset, end = 0, len(view)
    while offset < end:
        if offset + 4 > end:
            raise InvalidInput(f"input '{name}': BYTES data ends inside a length prefix")
        (size,) = _LEN.unpack_from(view, offset)
        offset += 4
        if offset + size > end:
            raise InvalidInput(f"input '{name}': BYTES element overruns the data")
        items.append(bytes(view[offset : offset + size]))
        offset += size
    if len(items) != count:
        raise InvalidInput(
            f"input '{name}': shape {list(shape)} needs {count} BYTES elements, got {len(items)}"
        )
    array = np.empty(count, dtype=object)
    array[:] = items
    return array.reshape(shape)


def to_raw(array: np.ndarray) -> bytes | memoryview:
    """The tensor's wire bytes; a view of the array's memory where that is possible."""
    if array.dtype.kind in "OSU":  # BYTES: objects, or numpy strings
        return b"".join(_LEN.pack(len(b)) + b for b in _as_bytes_list(array))
    if array.flags.c_contiguous:  # its own buffer, as bytes: one call
        exported: Any = array  # numpy exports the buffer protocol; its stubs do not say so
        try:
            return memoryview(exported).cast("B")
        except (ValueError, TypeError):  # a dtype the buffer protocol lacks (bfloat16)
            pass
    flat: Any = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
    return memoryview(flat)


def _as_bytes_list(array: np.ndarray) -> list[bytes]:
    items = array.ravel().tolist()
    return [b if isinstance(b, bytes) else str(b).encode("utf-8") for b in items]


def to_json_data(name: str, array: np.ndarray, datatype: DataType | None = None) -> Any:
    """Flat JSON-ready data: a numpy array orjson serializes natively, or a list of str
    (``datatype``: the array's, when the caller has it already)."""
    if datatype is None:
        datatype = datatypes.of_array(array)
    if datatype.is_bytes:
        try:
            return [b.decode("utf-8") for b in _as_bytes_list(array)]
        except UnicodeDecodeError:
            raise InvalidInput(
                f"output '{name}' holds bytes that are not UTF-8; request it as binary data"
            ) from None
    flat = array.ravel()
    if datatype.name in ("FP16", "BF16"):
        return flat.astype(np.float32)
    return np.ascontiguousarray(flat)
