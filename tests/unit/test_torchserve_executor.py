"""A TorchServe handler's answers are encoded byte for byte as TorchServe encodes them."""

from __future__ import annotations

import json
from typing import Any

import pytest

from inferd.backends.torchserve.executor import encode_answer


@pytest.mark.parametrize(
    "value",
    [
        9,
        -3,
        0,
        10**30,
        True,
        False,
        None,
        1.5,
        [1, 2, 3],
        [7],
        [],
        [True, 1],
        [1, 2.5],
        [[1], [2]],
        {"label": 3, "score": 0.25},
        ["é", 1],
    ],
)
def test_answers_are_torchserve_json(value: Any) -> None:
    assert encode_answer(value) == json.dumps(value, indent=2).encode("utf-8")


def test_bytes_and_text_go_as_they_are() -> None:
    assert encode_answer(b"\x00\x01") == b"\x00\x01"
    assert encode_answer(bytearray(b"ab")) == b"ab"
    assert encode_answer("café") == "café".encode()


def test_an_unencodable_answer_is_a_type_error() -> None:
    with pytest.raises(TypeError):
        encode_answer(object())
