"""Triton's classification extension: top K per row as "<score>:<index>[:<label>]", written as
Triton writes them, and label files read beside the config."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from inferd.config.text import parse_config_text
from inferd.core.errors import ConfigError, InvalidInput
from inferd.core.types import RequestedOutput
from inferd.plane.classification import class_counts, classify, read_labels, top_classes


def test_top_classes_per_row_with_labels() -> None:
    scores = np.array([[0.1, 0.7, 0.2], [0.5, 0.25, 0.25]], np.float32)
    got = top_classes("p", scores, 2, ("cat", "dog"), batched=True)
    assert got.shape == (2, 2) and got.dtype == object
    assert got.tolist() == [
        [b"0.700000:1:dog", b"0.200000:2"],
        [b"0.500000:0:cat", b"0.250000:1:dog"],  # equal scores: the lower index first
    ]


def test_k_is_capped_unbatched_and_integers() -> None:
    got = top_classes("p", np.array([3, -1, 7], np.int64), 10, (), batched=False)
    assert got.tolist() == [b"7:2", b"3:0", b"-1:1"]
    big = np.array([[2**64 - 1, 5]], np.uint64)
    assert top_classes("p", big, 1, (), batched=True).tolist() == [[b"18446744073709551615:0"]]
    # FP64 scores are written with six decimals, like C++ std::to_string.
    tiny = np.array([[1e-7, 123456.789]], np.float64)
    assert top_classes("p", tiny, 2, (), True).tolist() == [[b"123456.789000:1", b"0.000000:0"]]


def test_unsupported_types_and_bad_counts_are_refused() -> None:
    with pytest.raises(InvalidInput, match="unsupported type 'FP16'"):
        top_classes("p", np.zeros((1, 2), np.float16), 1, (), True)
    with pytest.raises(InvalidInput, match="'classification' must be a positive integer"):
        class_counts([RequestedOutput("p", {"classification": 0})])
    with pytest.raises(InvalidInput, match="got 'x'"):
        class_counts([RequestedOutput("p", {"classification": "x"})])
    assert class_counts([RequestedOutput("p", {"classification": 3}), RequestedOutput("q")]) == {
        "p": 3
    }
    outputs = {"p": np.array([[1.0, 2.0]], np.float32), "q": np.array([1])}
    classified = classify(outputs, {"p": 1}, {}, batched=True)
    assert classified["p"].tolist() == [[b"2.000000:1"]]
    assert classified["q"].tolist() == [1]


def test_label_files_beside_the_config(tmp_path: Path) -> None:
    (tmp_path / "labels.txt").write_text("zero\none\n")
    config = parse_config_text(
        'name: "m"\noutput [{ name: "p" data_type: TYPE_FP32 dims: [2] label_filename: '
        '"labels.txt" }, { name: "q" data_type: TYPE_FP32 dims: [2] }]'
    )
    assert read_labels(tmp_path, config) == {"p": ("zero", "one")}
    config.output[0].label_filename = "missing.txt"
    with pytest.raises(ConfigError, match=r"output 'p': label_filename 'missing\.txt': no such"):
        read_labels(tmp_path, config)
    config.output[0].label_filename = "../labels.txt"
    with pytest.raises(ConfigError, match=r"must name a file beside config\.pbtxt"):
        read_labels(tmp_path, config)
