"""Tensor codecs: JSON and raw bytes, every datatype, and the errors they raise."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from inferd.core import datatypes
from inferd.core.errors import InvalidInput
from inferd.protocols import codecs

NUMERIC = [d for d in datatypes.ALL if not d.is_bytes and d.name != "BF16"]


@pytest.mark.parametrize("dt", NUMERIC, ids=lambda d: d.name)
def test_json_round_trip_every_numeric_type(dt: datatypes.DataType) -> None:
    values = [[1, 0, 1], [0, 1, 1]] if dt.name == "BOOL" else [[1, 2, 3], [4, 5, 6]]
    array = codecs.from_json_data("t", dt, (2, 3), values)
    assert array.dtype == dt.numpy
    assert array.shape == (2, 3)
    flat = codecs.to_json_data("t", array)
    np.testing.assert_array_equal(np.asarray(flat, dtype=dt.numpy), array.ravel())


@pytest.mark.parametrize("dt", [*NUMERIC, datatypes.BY_NAME["BF16"]], ids=lambda d: d.name)
def test_raw_round_trip_is_zero_copy(dt: datatypes.DataType) -> None:
    array = np.arange(6).reshape(2, 3).astype(dt.numpy)
    raw = bytes(codecs.to_raw(array))
    assert len(raw) == 6 * dt.itemsize
    back = codecs.from_raw("t", dt, (2, 3), raw)
    np.testing.assert_array_equal(back, array)
    assert back.base is not None  # a view over the body, not a copy


def test_bf16_json_is_rejected_but_encodes_as_floats() -> None:
    with pytest.raises(InvalidInput, match="BF16 data must be sent as binary"):
        codecs.from_json_data("t", datatypes.BY_NAME["BF16"], (1,), [1.0])
    out = codecs.to_json_data("t", np.array([1.5], dtype=ml_dtypes.bfloat16))
    assert out.tolist() == [1.5]


def test_bytes_json_and_raw() -> None:
    bt = datatypes.BYTES
    array = codecs.from_json_data("s", bt, (2,), ["héllo", "x"])
    assert array.tolist() == ["héllo".encode(), b"x"]
    raw = bytes(codecs.to_raw(array))
    assert raw == b"\x06\x00\x00\x00h\xc3\xa9llo\x01\x00\x00\x00x"
    back = codecs.from_raw("s", bt, (2, 1), raw)
    assert back.shape == (2, 1)
    assert back.ravel().tolist() == [b"h\xc3\xa9llo", b"x"]
    assert codecs.to_json_data("s", back) == ["héllo", "x"]


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"\x05\x00\x00\x00ab", "overruns"),
        (b"\x01\x00", "inside a length prefix"),
        (b"\x01\x00\x00\x00a", "needs 2 BYTES elements, got 1"),
    ],
)
def test_bytes_raw_errors(raw: bytes, message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        codecs.from_raw("s", datatypes.BYTES, (2,), raw)


def test_non_utf8_bytes_need_binary_output() -> None:
    array = np.array([b"\xff"], dtype=object)
    with pytest.raises(InvalidInput, match="request it as binary data"):
        codecs.to_json_data("o", array)


def test_json_errors_name_the_input() -> None:
    fp32 = datatypes.FP32
    with pytest.raises(InvalidInput, match="input 'a': shape \\[2\\] needs 2 values, got 3"):
        codecs.from_json_data("a", fp32, (2,), [1, 2, 3])
    with pytest.raises(InvalidInput, match="input 'a': data is not"):
        codecs.from_json_data("a", fp32, (1,), [{"x": 1}])
    with pytest.raises(InvalidInput, match="non-negative integers"):
        codecs.check_shape("a", [1, "2"])
    with pytest.raises(InvalidInput, match="needs 8 bytes, got 7"):
        codecs.from_raw("a", fp32, (2,), b"\x00" * 7)


def test_datatype_table_lookups() -> None:
    assert datatypes.from_name("FP32").config_name == "TYPE_FP32"
    assert datatypes.from_config_name("TYPE_STRING") is datatypes.BYTES
    assert datatypes.of_array(np.array(["a"])) is datatypes.BYTES
    assert datatypes.BY_NAME["FP16"].tf_name == "DT_HALF"
    with pytest.raises(InvalidInput, match="unknown datatype 'F32'"):
        datatypes.from_name("F32")


def test_json_strings_keep_their_nul_bytes() -> None:
    """Never through fixed-width numpy strings, which drop trailing NULs."""
    array = codecs.from_json_data("s", datatypes.BYTES, (2, 2), [["abc\x00", ""], ["\x00", "é"]])
    assert array.tolist() == [[b"abc\x00", b""], [b"\x00", "é".encode()]]
    with pytest.raises(InvalidInput, match="BYTES data must be a list of strings"):
        codecs.from_json_data("s", datatypes.BYTES, (1,), [1])
