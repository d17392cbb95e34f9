"""``tf.Example`` features, protocol-neutral: what TF Serving's classify and regress take.

Both TF Serving adapters decode their examples (REST JSON objects, gRPC ``tf.Example``
messages) into ``Features``: feature name -> a 1-D array (float32, int64, or an object array
of ``bytes``). A signature that parses examples itself (``ParseExample``: TF Serving's
classification and regression signatures) is fed them serialized, by the small encoder here
(the wire format is three nested messages; no TensorFlow import on the request path).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from inferd.core.errors import InvalidInput

Features = Mapping[str, np.ndarray]

# Field keys (field number << 3 | wire type 2, length-delimited) of the messages involved.
_FEATURES_IN_EXAMPLE = b"\x0a"  # Example.features = 1
_FEATURE_IN_FEATURES = b"\x0a"  # Features.feature = 1 (map entries)
_ENTRY_KEY = b"\x0a"  # map entry key = 1
_ENTRY_VALUE = b"\x12"  # map entry value = 2
_BYTES_LIST = b"\x0a"  # Feature.bytes_list = 1
_FLOAT_LIST = b"\x12"  # Feature.float_list = 2
_INT64_LIST = b"\x1a"  # Feature.int64_list = 3
_VALUE = b"\x0a"  # BytesList / FloatList / Int64List .value = 1 (packed for numbers)


def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1  # negative int64: ten bytes of two's complement, as protobuf does
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _field(key: bytes, payload: bytes) -> bytes:
    return key + _varint(len(payload)) + payload


def _feature(name: str, values: np.ndarray) -> bytes:
    if values.dtype == object:
        payload = b"".join(_field(_VALUE, v) for v in values.tolist())
        kind = _BYTES_LIST
    elif values.dtype.kind == "f":
        payload = _field(_VALUE, values.astype("<f4").tobytes()) if values.size else b""
        kind = _FLOAT_LIST
    elif values.dtype.kind in "iub":
        packed = b"".join(_varint(v) for v in values.astype(np.int64).tolist())
        payload = _field(_VALUE, packed) if values.size else b""
        kind = _INT64_LIST
    else:
        raise InvalidInput(f"feature '{name}' holds {values.dtype} values: not a tf.Example type")
    entry = _field(_ENTRY_KEY, name.encode("utf-8")) + _field(_ENTRY_VALUE, _field(kind, payload))
    return _field(_FEATURE_IN_FEATURES, entry)


def serialize(features: Features) -> bytes:
    """One ``tf.Example`` message, serialized."""
    body = b"".join(_feature(name, values) for name, values in features.items())
    return _field(_FEATURES_IN_EXAMPLE, body)


def serialize_all(examples: Sequence[Features], context: Features) -> np.ndarray:
    """Examples (each merged over the shared context, as TF Serving merges them) as a 1-D
    object array of serialized ``tf.Example`` bytes: the input of a ParseExample signature."""
    out = np.empty(len(examples), dtype=object)
    out[:] = [serialize({**context, **example}) for example in examples]
    return out


def check_examples(examples: Sequence[Features]) -> None:
    if not examples:
        raise InvalidInput("the request has no examples")
