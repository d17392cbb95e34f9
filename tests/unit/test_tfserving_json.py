"""TF Serving REST answers: single vs several outputs, rows vs columns, bytes outputs."""

from __future__ import annotations

import numpy as np

from inferd.protocols.tfserving.http import _predictions


def _outputs() -> dict[str, np.ndarray]:
    labels = np.empty(2, dtype=object)
    labels[:] = [b"cat", b"dog"]
    raw = np.empty(2, dtype=object)
    raw[:] = [b"\x00\x01", b"\xff"]
    probs = np.array([[0.9, 0.1], [0.2, 0.8]], dtype=np.float32)
    return {"label": labels, "probabilities": probs, "image_bytes": raw}


def test_rows_with_bytes_outputs() -> None:
    rows = _predictions(_outputs(), row_format=True)["predictions"]
    assert [r["label"] for r in rows] == ["cat", "dog"]
    assert rows[0]["image_bytes"] == {"b64": "AAE="}
    np.testing.assert_allclose(rows[1]["probabilities"], [0.2, 0.8], rtol=1e-6)


def test_columns_with_bytes_outputs() -> None:
    columns = _predictions(_outputs(), row_format=False)["outputs"]
    assert columns["label"] == ["cat", "dog"]
    assert columns["image_bytes"] == [{"b64": "AAE="}, {"b64": "/w=="}]


def test_single_output_is_bare() -> None:
    only = {"probabilities": _outputs()["probabilities"]}
    assert _predictions(only, row_format=False)["outputs"].shape == (2, 2)
    assert _predictions(only, row_format=True)["predictions"].tolist()[0][0] > 0.89


def test_nan_and_infinity_tokens_both_ways() -> None:
    from inferd.protocols.tfserving.http import parse_json, tf_json

    doc = parse_json(b'{"instances": [NaN, Infinity, -Infinity, 1.5]}')
    values = doc["instances"]
    assert np.isnan(values[0]) and values[1:] == [np.inf, -np.inf, 1.5]
    answer = tf_json({"predictions": np.array([np.nan, np.inf, -np.inf, 0.1], np.float32)})
    assert answer.body == b'{"predictions":[NaN,Infinity,-Infinity,0.1]}'
    assert tf_json({"predictions": np.array([0.1], np.float32)}).body == b'{"predictions":[0.1]}'
