"""Request checks against a model's spec: names, datatypes, shapes and batch sizes, requested
outputs, and the config reshape both ways."""

from __future__ import annotations

import numpy as np
import pytest

from inferd.config.spec import build_spec
from inferd.config.text import parse_config_text
from inferd.core.errors import InvalidInput
from inferd.plane import validate

CONFIG = """
name: "m"
max_batch_size: 4
input [
  { name: "a" data_type: TYPE_FP32 dims: [2] },
  { name: "img" data_type: TYPE_UINT8 dims: [4] reshape { shape: [2, 2] } },
  { name: "opt" data_type: TYPE_STRING dims: [-1] optional: true }
]
output [
  { name: "y" data_type: TYPE_FP32 dims: [2] },
  { name: "flat" data_type: TYPE_FP32 dims: [4] reshape { shape: [2, 2] } }
]
"""
SPEC = build_spec(parse_config_text(CONFIG))


def _inputs(rows: int = 2, **override: np.ndarray) -> dict[str, np.ndarray]:
    found: dict[str, np.ndarray] = {
        "a": np.zeros((rows, 2), np.float32),
        "img": np.zeros((rows, 4), np.uint8),
    }
    found.update(override)
    return found


def test_inputs_come_back_model_shaped_with_their_batch_size() -> None:
    inputs, rows = validate.check_inputs(SPEC, _inputs(3))
    assert rows == 3
    assert inputs["img"].shape == (3, 2, 2)  # the config's reshape
    assert "opt" not in inputs  # optional and absent
    same, _ = validate.check_inputs(SPEC, _inputs(1, img=np.zeros((1, 2, 2), np.uint8)))
    assert same["img"].shape == (1, 2, 2)  # sent as the model takes it (TF Serving clients)


def test_an_accepted_signature_is_remembered_and_a_refused_one_never_is() -> None:
    spec = build_spec(parse_config_text(CONFIG))
    first, rows = validate.check_inputs(spec, _inputs(3))
    assert len(spec.accepted) == 1
    img = np.arange(12, dtype=np.uint8).reshape(3, 4)
    again, again_rows = validate.check_inputs(spec, _inputs(3, img=img))
    assert (rows, again_rows) == (3, 3)
    assert again["img"].shape == first["img"].shape == (3, 2, 2)
    assert np.shares_memory(again["img"], img)  # reshaped, not copied
    assert again["img"][2].tolist() == [[8, 9], [10, 11]]
    assert list(again) == ["a", "img"]
    wrong = _inputs(3, a=np.zeros((3, 2), np.float64))
    for _ in range(2):
        with pytest.raises(InvalidInput, match="datatype FP64 does not match"):
            validate.check_inputs(spec, wrong)
    assert len(spec.accepted) == 1


def test_remembered_signatures_are_bounded() -> None:
    spec = build_spec(parse_config_text(CONFIG.replace("max_batch_size: 4", "max_batch_size: 0")))
    for n in range(validate.ACCEPTED_LIMIT + 10):
        inputs: dict[str, np.ndarray] = {"a": np.zeros(2, np.float32), "img": np.zeros(4, np.uint8)}
        inputs["opt"] = np.array([b"x"] * (n + 1), dtype=object)
        out, rows = validate.check_inputs(spec, inputs)
        assert (rows, out["opt"].shape, out["img"].shape) == (0, (n + 1,), (2, 2))
    assert len(spec.accepted) == validate.ACCEPTED_LIMIT


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        (
            _inputs(z=np.zeros((2, 2), np.float32)),
            "unexpected input 'z' for model 'm'; it takes 'a', 'img', 'opt'",
        ),
        ({"a": np.zeros((2, 2), np.float32)}, "missing input 'img' for model 'm'"),
        (
            _inputs(a=np.zeros((2, 2), np.float64)),
            "input 'a': datatype FP64 does not match the model's FP32",
        ),
        (
            _inputs(a=np.zeros((2, 3), np.float32)),
            "input 'a': shape [2,3] does not match the model's [-1,2]",
        ),
        (
            _inputs(a=np.zeros((3, 2), np.float32)),
            "input 'img' has batch size 2 but another input has 3",
        ),
        (
            _inputs(5),
            "input 'a': batch size 5 is outside 1..4 (max_batch_size of model 'm')",
        ),
        (_inputs(a=np.array(1.0, np.float32)), "input 'a': expected shape [-1,2], got a scalar"),
    ],
)
def test_bad_inputs_name_the_problem(inputs: dict[str, np.ndarray], message: str) -> None:
    with pytest.raises(InvalidInput) as info:
        validate.check_inputs(SPEC, inputs)
    assert info.value.message == message


def test_outputs_requested_and_reshaped_both_ways() -> None:
    assert validate.check_outputs(SPEC, None) == ("y", "flat")
    assert validate.check_outputs(SPEC, ["flat"]) == ("flat",)
    with pytest.raises(InvalidInput, match="unknown output 'z' for model 'm'; it has 'y', 'flat'"):
        validate.check_outputs(SPEC, ["z"])
    with pytest.raises(InvalidInput, match="output 'y' is requested twice"):
        validate.check_outputs(SPEC, ["y", "y"])
    model = {
        "y": np.ones((3, 2), np.float32),
        "flat": np.arange(12, dtype=np.float32).reshape(3, 2, 2),
    }
    shaped = validate.shape_outputs(SPEC, dict(model), 3)
    assert shaped["flat"].shape == (3, 4) and shaped["y"].shape == (3, 2)
    native = validate.native_outputs(SPEC, shaped)
    assert native["flat"].shape == (3, 2, 2)
    np.testing.assert_array_equal(native["flat"], model["flat"])
