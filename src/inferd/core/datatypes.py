"""The one datatype table: KServe v2 names, Triton config names, TF dtypes and numpy dtypes.

Every codec and backend converts through this module; nothing else spells a dtype.
BYTES tensors are numpy object arrays whose elements are ``bytes``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import ml_dtypes
import numpy as np

from inferd.core.errors import InvalidInput


@dataclass(frozen=True, slots=True)
class DataType:
    """One tensor element type under every name the outside world gives it."""

    name: str  # KServe v2 / Triton wire name: "FP32"
    config_name: str  # Triton model config enum name: "TYPE_FP32"
    tf_name: str  # TensorFlow dtype enum name: "DT_FLOAT"
    numpy: np.dtype[np.generic]  # object for BYTES

    @property
    def itemsize(self) -> int:
        """Bytes per element on the wire; 0 for the variable-length BYTES type."""
        return 0 if self.name == "BYTES" else self.numpy.itemsize

    is_bytes: bool = field(init=False, compare=False, repr=False)  # the name is "BYTES"

    def __post_init__(self) -> None:
        object.__setattr__(self, "is_bytes", self.name == "BYTES")


def _dt(name: str, config: str, tf: str, dtype: object) -> DataType:
    return DataType(name, config, tf, np.dtype(dtype))  # type: ignore[call-overload]


ALL: tuple[DataType, ...] = (
    _dt("BOOL", "TYPE_BOOL", "DT_BOOL", np.bool_),
    _dt("UINT8", "TYPE_UINT8", "DT_UINT8", np.uint8),
    _dt("UINT16", "TYPE_UINT16", "DT_UINT16", np.uint16),
    _dt("UINT32", "TYPE_UINT32", "DT_UINT32", np.uint32),
    _dt("UINT64", "TYPE_UINT64", "DT_UINT64", np.uint64),
    _dt("INT8", "TYPE_INT8", "DT_INT8", np.int8),
    _dt("INT16", "TYPE_INT16", "DT_INT16", np.int16),
    _dt("INT32", "TYPE_INT32", "DT_INT32", np.int32),
    _dt("INT64", "TYPE_INT64", "DT_INT64", np.int64),
    _dt("FP16", "TYPE_FP16", "DT_HALF", np.float16),
    _dt("FP32", "TYPE_FP32", "DT_FLOAT", np.float32),
    _dt("FP64", "TYPE_FP64", "DT_DOUBLE", np.float64),
    _dt("BF16", "TYPE_BF16", "DT_BFLOAT16", ml_dtypes.bfloat16),
    _dt("BYTES", "TYPE_STRING", "DT_STRING", np.object_),
)

BY_NAME: dict[str, DataType] = {d.name: d for d in ALL}
BY_CONFIG_NAME: dict[str, DataType] = {d.config_name: d for d in ALL}
BY_TF_NAME: dict[str, DataType] = {d.tf_name: d for d in ALL}
_BY_NUMPY: dict[np.dtype[np.generic], DataType] = {d.numpy: d for d in ALL}

BYTES = BY_NAME["BYTES"]
FP32 = BY_NAME["FP32"]


def from_name(name: str) -> DataType:
    """Look up a KServe v2 datatype name; an unknown name is a client error."""
    if not isinstance(name, str):
        raise InvalidInput(f'datatype must be a string such as "FP32", not {type(name).__name__}')
    try:
        return BY_NAME[name]
    except KeyError:
        raise InvalidInput(
            f"unknown datatype '{name}'; expected one of {', '.join(BY_NAME)}"
        ) from None


def from_config_name(name: str) -> DataType:
    try:
        return BY_CONFIG_NAME[name]
    except KeyError:
        raise InvalidInput(f"unsupported config data_type '{name}'") from None


def of_array(array: np.ndarray) -> DataType:
    """The datatype of a numpy array (strings and bytes both map to BYTES)."""
    return from_numpy(array.dtype)


def from_numpy(dtype: np.dtype[np.generic]) -> DataType:
    found = _BY_NUMPY.get(dtype)
    if found is not None:
        return found
    if dtype.kind in ("S", "U", "O"):
        return BYTES
    raise InvalidInput(f"numpy dtype {dtype} has no inference datatype")
