"""tf.Example encoding: what inferd writes parses as the protobuf message, byte for byte."""

from __future__ import annotations

import numpy as np

from inferd.plane.tfexample import serialize, serialize_all
from inferd.protocols.tfserving import tensorflow_pb2


def test_examples_encode_as_protobuf_does() -> None:
    features: dict[str, np.ndarray] = {
        "f": np.array([1.5, -2.0], np.float32),
        "i": np.array([7, -3, 2**40], np.int64),
        "s": np.array([b"a\x00b", b"", b"\xff"], dtype=object),
        "empty": np.array([], np.float32),
    }
    parsed = tensorflow_pb2.Example.FromString(serialize(features))
    feature = parsed.features.feature
    assert list(feature["f"].float_list.value) == [1.5, -2.0]
    assert list(feature["i"].int64_list.value) == [7, -3, 2**40]
    assert list(feature["s"].bytes_list.value) == [b"a\x00b", b"", b"\xff"]
    assert feature["empty"].WhichOneof("kind") == "float_list"
    expected = tensorflow_pb2.Example()
    expected.features.feature["i"].int64_list.value.extend([7, -3, 2**40])
    assert serialize({"i": features["i"]}) == expected.SerializeToString()


def test_examples_merge_over_the_context() -> None:
    context: dict[str, np.ndarray] = {
        "x": np.array([1.0], np.float32),
        "c": np.array([5], np.int64),
    }
    encoded = serialize_all([{"x": np.array([2.0], np.float32)}, {}], context)
    first, second = (tensorflow_pb2.Example.FromString(e) for e in encoded)
    assert first.features.feature["x"].float_list.value == [2.0]
    assert second.features.feature["x"].float_list.value == [1.0]
    assert first.features.feature["c"].int64_list.value == [5]
