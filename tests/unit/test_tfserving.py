"""TF Serving's semantics in the core, over echo models: which signature a request runs,
predict with TF Serving's leniency for rows of scalars, classify and regress read from a
model's outputs, examples into input columns, and the signature metadata."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from inferd.config.spec import CLASSIFY_METHOD, PREDICT_METHOD, signature_spec
from inferd.core import datatypes
from inferd.core.errors import InvalidInput
from inferd.plane.dataplane import DataPlane
from inferd.plane.model import ModelVersion
from inferd.plane.tfserving import TfServing
from tests.echo_support import echo_version, registry_with

SCORES = """backend: "echo"
max_batch_size: 8
input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [3] }]
"""
SCALARS = """backend: "echo"
max_batch_size: 8
input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [1] }]
"""


@pytest.fixture
def models(tmp_path: Path) -> Iterator[dict[str, ModelVersion]]:
    loaded = {
        "scores": echo_version(tmp_path, SCORES, name="scores"),
        "scalars": echo_version(tmp_path, SCALARS, name="scalars"),
    }
    yield loaded

    async def close() -> None:
        for model in loaded.values():
            await model.close()

    asyncio.run(close())


def _tf(models: dict[str, ModelVersion]) -> TfServing:
    return DataPlane(registry_with(*models.values())).tfserving


def test_signature_choice(models: dict[str, ModelVersion]) -> None:
    model = models["scores"]
    fp32, text = datatypes.FP32, datatypes.BYTES
    model.signatures = {
        "serving_default": signature_spec(
            model.config, "serving_default", PREDICT_METHOD, [("INPUT0", fp32, (-1, 3))], []
        ),
        "classify_it": signature_spec(
            model.config, "classify_it", CLASSIFY_METHOD, [("inputs", text, (-1,))],
            [("scores", fp32, (-1, 3))],
        ),
    }  # fmt: skip
    tf = _tf(models)
    own = tf.target("scores")
    assert (own.signature, own.method, own.spec) == ("serving_default", PREDICT_METHOD, model.spec)
    chosen = tf.target("scores", verb="classify")  # the one classification signature
    assert (chosen.signature, chosen.method) == ("classify_it", CLASSIFY_METHOD)
    assert [t.name for t in chosen.spec.inputs] == ["inputs"]
    named = tf.target("scores", signature="serving_default", verb="classify")
    assert named.method == PREDICT_METHOD  # named: that one, read as scores
    with pytest.raises(InvalidInput) as info:
        tf.target("scores", signature="nope")
    assert info.value.message == (
        "unknown signature_name 'nope'; model 'scores' serves 'classify_it', 'serving_default'"
    )
    meta = tf.metadata("scores")
    assert [(s.name, s.method) for s in meta.signatures] == [
        ("serving_default", PREDICT_METHOD),
        ("classify_it", CLASSIFY_METHOD),
    ]
    assert meta.signatures[0].inputs[0].dims == (-1, 3)
    assert [s.name for s in _tf({"scalars": models["scalars"]}).metadata("scalars").signatures] == [
        "serving_default"
    ]


def test_predict_rows_of_scalars_as_tf_serving_feeds_them(models: dict[str, ModelVersion]) -> None:
    tf = _tf(models)
    target = tf.target("scalars")

    async def run() -> list[tuple[tuple[int, ...], list[float]]]:
        answers = []
        for x in (np.array([1.0, 2.0, 5.0]), np.array([[1.0], [2.0], [5.0]])):
            response = await tf.predict(target, {"INPUT0": x.astype(np.float32)})
            out = response.outputs["OUTPUT0"]
            answers.append((out.shape, out.ravel().tolist()))
        return answers

    # Rows of scalars come back as scalars, rows of [1] as [1]: as TF Serving answers.
    assert asyncio.run(run()) == [((3,), [1.0, 2.0, 5.0]), ((3, 1), [1.0, 2.0, 5.0])]
    with pytest.raises(InvalidInput, match=r"shape \[3,2\] does not match the model's \[-1,1\]"):
        asyncio.run(tf.predict(target, {"INPUT0": np.zeros((3, 2), np.float32)}))


def test_classify_and_regress_read_a_models_outputs(models: dict[str, ModelVersion]) -> None:
    tf = _tf(models)
    context = {"INPUT0": np.array([0.25, 0.5, 0.25], np.float32)}
    examples = [{"INPUT0": np.array([0.5, 0.25, 0.25], np.float32)}, {}]

    async def run() -> tuple[list[list[tuple[str, float]]], list[float]]:
        classified = await tf.classify(tf.target("scores", verb="classify"), examples, context)
        ints = [{"INPUT0": np.array([2], np.int64)}, {"INPUT0": np.array([-1], np.int64)}]
        regressed = await tf.regress(tf.target("scalars", verb="regress"), ints, {})
        return classified.results, regressed.results

    classified, regressed = asyncio.run(run())
    assert classified == [
        [("0", 0.5), ("1", 0.25), ("2", 0.25)],
        [("0", 0.25), ("1", 0.5), ("2", 0.25)],  # the context's features
    ]
    assert regressed == [2.0, -1.0]  # int64 features, cast to the input's FP32
    with pytest.raises(InvalidInput, match="no output of one float per example; :regress"):
        asyncio.run(tf.regress(tf.target("scores"), [context], {}))
    with pytest.raises(InvalidInput, match="no output of \\[batch, classes\\] float scores"):
        asyncio.run(tf.classify(tf.target("scalars"), [{"INPUT0": np.ones(1, np.float32)}], {}))


@pytest.mark.parametrize(
    ("examples", "message"),
    [
        ([], "the request has no examples"),
        ([{"z": np.ones(1, np.float32)}], "example 0 has unknown feature 'z'"),
        ([{"INPUT0": np.ones(1, np.float32)}, {}], "example 1 lacks feature 'INPUT0'"),
        (
            [{"INPUT0": np.ones(2, np.float32)}],
            "feature 'INPUT0': 1 examples do not fill shape [1, 1]",
        ),
        (
            [{"INPUT0": np.array([b"a"], dtype=object)}],
            "feature 'INPUT0': input 'INPUT0' takes numbers",
        ),
    ],
)
def test_bad_examples_name_the_feature(
    models: dict[str, ModelVersion], examples: list[dict[str, np.ndarray]], message: str
) -> None:
    tf = _tf(models)
    with pytest.raises(InvalidInput) as info:
        asyncio.run(tf.regress(tf.target("scalars"), examples, {}))
    assert info.value.message == message
