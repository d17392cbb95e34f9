"""What inferd.Server's calls take and give: arrays as given, strings as the object arrays of
bytes models get, requested outputs, the response's arrays as a dict with its facts."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import inferd
from inferd.app.calls import Outputs, build_request
from inferd.core.errors import InvalidInput
from inferd.core.types import InferResponse


def test_arrays_pass_as_given() -> None:
    x = np.ones((2, 3), np.float32)
    request = build_request("m", {"x": x}, version=2, request_id="r", parameters={"priority": 1})
    assert request.inputs["x"] is x
    assert (request.model_name, request.model_version, request.id) == ("m", "2", "r")
    assert request.parameters == {"priority": 1} and request.outputs is None
    assert build_request("m", {"x": [1, 2]}).inputs["x"].tolist() == [1, 2]


def test_strings_become_object_arrays_of_bytes() -> None:
    request = build_request(
        "m",
        {
            "u": np.array([["a", "é"]]),
            "s": np.array([b"x", b"yz"]),
            "o": np.array(["t", b"\x00b"], object),
            "ok": np.array([b"kept"], object),
            "list": ["one", "two"],
        },
    )
    inputs = request.inputs
    assert inputs["u"].dtype == object and inputs["u"].tolist() == [[b"a", "é".encode()]]
    assert inputs["s"].tolist() == [b"x", b"yz"] and inputs["s"].dtype == object
    assert inputs["o"].tolist() == [b"t", b"\x00b"]
    assert inputs["list"].tolist() == [b"one", b"two"]
    assert inputs["ok"].tolist() == [b"kept"]
    with pytest.raises(
        InvalidInput, match="input 'o': a string tensor holds bytes or str, not int"
    ):
        build_request("m", {"o": np.array([1, "a"], object)})


def test_requested_outputs() -> None:
    assert build_request("m", {}, outputs=["a", "b"]).output_names() == ["a", "b"]
    wanted = build_request("m", {}, outputs={"p": {"classification": 2}}).outputs
    assert wanted is not None and wanted[0].parameters == {"classification": 2}
    with pytest.raises(InvalidInput, match="list of output names, got the string 'ab'"):
        build_request("m", {}, outputs="ab")


def test_bad_calls_say_what_is_wrong() -> None:
    with pytest.raises(InvalidInput, match="model name must be a non-empty string"):
        build_request("", {})
    with pytest.raises(InvalidInput, match="inputs must be a mapping"):
        build_request("m", [np.ones(1)])  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="input names must be strings"):
        build_request("m", {1: np.ones(1)})  # type: ignore[dict-item]


def test_outputs_are_a_dict_with_the_response_facts() -> None:
    y = np.ones(2)
    out = Outputs(InferResponse("m", "3", {"y": y}, "id1", {"triton_final_response": True}))
    assert out == {"y": y} and out["y"] is y
    assert (out.model_name, out.model_version, out.id) == ("m", "3", "id1")
    assert out.parameters == {"triton_final_response": True}
    assert "model_version='3'" in repr(out)


def test_the_package_imports_cheaply_and_names_the_api() -> None:
    code = (
        "import sys, inferd\n"
        "heavy = {'numpy', 'inferd.app.embedded', 'granian', 'onnxruntime'} & set(sys.modules)\n"
        "assert not heavy, heavy\n"
        "assert inferd.Server.__module__ == 'inferd.app.embedded'\n"
        "assert 'inferd.app.frontends' not in sys.modules\n"  # HTTP only once it is served
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    assert inferd.NotFound.__module__ == "inferd.core.errors"
    assert inferd.Outputs is Outputs and inferd.__version__
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        inferd.Nope  # noqa: B018
