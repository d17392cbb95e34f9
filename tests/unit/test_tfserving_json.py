"""TF Serving REST answers: single vs several outputs, rows vs columns, bytes outputs."""

from __future__ import annotations

import numpy as np

from inferd.config.spec import build_spec
from inferd.config.text import parse_config_text
from inferd.protocols.tfserving_http import _predictions

SPEC = build_spec(
    parse_config_text(
        'name: "m"\nmax_batch_size: 4\n'
        'input [{ name: "x", data_type: TYPE_FP32, dims: [2] }]\n'
        'output [{ name: "label", data_type: TYPE_STRING, dims: [1], reshape: { shape: [] } },'
        ' { name: "probabilities", data_type: TYPE_FP32, dims: [2] },'
        ' { name: "image_bytes", data_type: TYPE_STRING, dims: [1], reshape: { shape: [] } }]'
    )
)


def _outputs() -> dict[str, np.ndarray]:
    labels = np.empty(2, dtype=object)
    labels[:] = [b"cat", b"dog"]
    raw = np.empty(2, dtype=object)
    raw[:] = [b"\x00\x01", b"\xff"]
    probs = np.array([[0.9, 0.1], [0.2, 0.8]], dtype=np.float32)
    return {"label": labels, "probabilities": probs, "image_bytes": raw}


def test_rows_with_bytes_outputs() -> None:
    rows = _predictions(SPEC, _outputs(), row_format=True)["predictions"]
    assert [r["label"] for r in rows] == ["cat", "dog"]
    assert rows[0]["image_bytes"] == {"b64": "AAE="}
    np.testing.assert_allclose(rows[1]["probabilities"], [0.2, 0.8], rtol=1e-6)


def test_columns_with_bytes_outputs() -> None:
    columns = _predictions(SPEC, _outputs(), row_format=False)["outputs"]
    assert columns["label"] == ["cat", "dog"]
    assert columns["image_bytes"] == [{"b64": "AAE="}, {"b64": "/w=="}]


def test_single_output_is_bare() -> None:
    only = {"probabilities": _outputs()["probabilities"]}
    assert _predictions(SPEC, only, row_format=False)["outputs"].shape == (2, 2)
    assert _predictions(SPEC, only, row_format=True)["predictions"].tolist()[0][0] > 0.89
