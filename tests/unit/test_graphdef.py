"""GraphDef tensor names: a node's name and the tensor a session feeds or fetches."""

from __future__ import annotations

from inferd.backends.graphdef import node_name, tensor_name


def test_names_with_scopes_and_output_indexes() -> None:
    assert node_name("InceptionV3/Predictions/Softmax") == "InceptionV3/Predictions/Softmax"
    assert node_name("InceptionV3/Predictions/Softmax:0") == "InceptionV3/Predictions/Softmax"
    assert tensor_name("InceptionV3/Predictions/Softmax") == "InceptionV3/Predictions/Softmax:0"
    assert tensor_name("split:1") == "split:1"
    assert tensor_name("odd:name") == "odd:name:0"
