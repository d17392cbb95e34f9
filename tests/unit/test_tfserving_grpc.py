"""TF Serving TensorProtos: answers in the typed value field of each dtype (TF Serving's
default), or in tensor_content when asked; what goes out comes back in unchanged."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from inferd.protocols.tfserving import tensorflow_pb2
from inferd.protocols.tfserving.grpc import to_array, to_tensor


@pytest.mark.parametrize(
    ("array", "field"),
    [
        (np.array([[1.5, -2.0]], np.float32), "float_val"),
        (np.array([1e300, 2.0]), "double_val"),
        (np.array([-128, 127], np.int8), "int_val"),
        (np.array([65535], np.uint16), "int_val"),
        (np.array([2**40], np.int64), "int64_val"),
        (np.array([True, False]), "bool_val"),
        (np.array([2**32 - 1], np.uint32), "uint32_val"),
        (np.array([2**64 - 1], np.uint64), "uint64_val"),
        (np.array([1.5, 65504.0], np.float16), "half_val"),
        (np.array([1.5, -3.0], ml_dtypes.bfloat16), "half_val"),
        (np.array([b"a\x00", b"", b"\xff"], dtype=object), "string_val"),
    ],
)
def test_typed_value_fields_round_trip(array: np.ndarray, field: str) -> None:
    tensor = tensorflow_pb2.TensorProto()
    to_tensor(array, tensor)
    assert tensor.tensor_content == b""
    assert [f.name for f, _ in tensor.ListFields() if f.name.endswith("_val")] == [field]
    back = to_array(tensorflow_pb2.TensorProto.FromString(tensor.SerializeToString()), "t")
    assert back.dtype == array.dtype and back.shape == array.shape
    assert back.tolist() == array.tolist()


def test_float_val_holds_the_values_and_tensor_content_when_asked() -> None:
    array = np.array([2.5, 3.0, 4.5], np.float32)
    typed = tensorflow_pb2.TensorProto()
    to_tensor(array, typed)
    assert list(typed.float_val) == [2.5, 3.0, 4.5]
    assert [d.size for d in typed.tensor_shape.dim] == [3]
    packed = tensorflow_pb2.TensorProto()
    to_tensor(array, packed, as_content=True)
    assert packed.tensor_content == array.tobytes() and not packed.float_val


def test_a_hostile_shape_is_refused_before_anything_is_allocated() -> None:
    from inferd.core.errors import InvalidInput

    def tensor(dims: list[int], values: list[float]) -> tensorflow_pb2.TensorProto:
        proto = tensorflow_pb2.TensorProto(dtype=tensorflow_pb2.DT_FLOAT, float_val=values)
        for size in dims:
            proto.tensor_shape.dim.add().size = size
        return proto

    # One value fills the tensor (TensorFlow's rule), within reason.
    assert to_array(tensor([2, 3], [1.5]), "x").tolist() == [[1.5] * 3] * 2
    with pytest.raises(InvalidInput, match="would fill shape"):
        to_array(tensor([1 << 20, 1 << 20], [1.0]), "x")  # 4 TiB from 4 bytes
    with pytest.raises(InvalidInput, match="would fill shape"):
        to_array(tensor([1 << 16, 1 << 16], []), "x")  # no values: zeros, 16 GiB of them
    with pytest.raises(InvalidInput, match="too large"):
        to_array(tensor([1 << 40, 1 << 40], [1.0]), "x")  # the product overflows int64
    with pytest.raises(InvalidInput, match="dimensions"):
        to_array(tensor([1] * 40, [1.0]), "x")
