"""Calibration and check rows: files, ranges, random rows, the split between them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from inferd.core.errors import ConfigError
from inferd.optimize import data
from inferd.optimize.data import InputSpec
from inferd.optimize.steps import Options, split_rows

IMAGE = InputSpec("x", np.dtype(np.float32), (-1, 2, 3))
IDS = InputSpec("ids", np.dtype(np.int64), (-1, 4))


def _options(**changes: object) -> Options:
    base: dict[str, object] = {
        "model_dir": Path("."),
        "int8": "static",
        "fp16": False,
        "calibration": None,
        "calibration_rows": 4,
        "check_rows": 6,
        "ranges": (),
        "source_version": None,
        "as_version": None,
        "min_agreement": 0.99,
        "latency_runs": 1,
        "reduce_range": False,
        "max_fp32_nodes": 2,
        "progress": False,
        "report": None,
    }
    base.update(changes)
    return Options(**base)  # type: ignore[arg-type]


def test_parse_range() -> None:
    assert data.parse_range("x=-1:2.5") == ("x", -1.0, 2.5)
    assert data.parse_range("0:16") == ("", 0.0, 16.0)
    with pytest.raises(ConfigError, match="HIGH must be at least LOW"):
        data.parse_range("3:1")
    with pytest.raises(ConfigError, match="is not \\[NAME=\\]LOW:HIGH"):
        data.parse_range("x=a:b")


def test_npz_single_array_takes_the_input_name(tmp_path: Path) -> None:
    path = tmp_path / "d.npz"
    np.savez(path, images=np.ones((5, 2, 3)), labels=np.arange(5))
    rows = data.load_npz(path, [IMAGE])
    assert rows.arrays["x"].dtype == np.float32 and rows.arrays["x"].shape == (5, 2, 3)
    assert rows.labels is not None and rows.labels.tolist() == [0, 1, 2, 3, 4]
    assert rows.sources == ["5 rows of d.npz"]


def test_npz_shape_mismatch_names_the_input(tmp_path: Path) -> None:
    path = tmp_path / "d.npz"
    np.savez(path, x=np.ones((5, 3, 3)))
    with pytest.raises(ConfigError, match=r"rows of input 'x' have shape \[3, 3\]"):
        data.load_npz(path, [IMAGE])


def test_sample_json_list_and_labels(tmp_path: Path) -> None:
    path = tmp_path / "sample.json"
    path.write_text(json.dumps({"inputs": [[1, 2, 3, 4], [5, 6, 7, 8]], "labels": [0, 1]}))
    rows = data.load_sample_json(path, [IDS])
    assert rows.arrays["ids"].dtype == np.int64 and rows.arrays["ids"][1].tolist() == [5, 6, 7, 8]
    assert rows.labels is not None and len(rows) == 2


def test_ranges_declared_observed_default() -> None:
    observed = data.Rows({"x": np.array([[[-2.0] * 3] * 2, [[5.0] * 3] * 2], dtype=np.float32)})
    ranges = data.input_ranges([IMAGE, IDS], [("ids", 0, 9)], observed)
    assert ranges == {"ids": (0.0, 9.0), "x": (-2.0, 5.0)}
    assert data.input_ranges([IMAGE], [], data.Rows({})) == {"x": data.DEFAULT_RANGE}
    with pytest.raises(ConfigError, match="'nope', which is not a model input"):
        data.input_ranges([IMAGE], [("nope", 0, 1)], data.Rows({}))


def test_random_rows_stay_in_range() -> None:
    rng = np.random.default_rng(0)
    rows = data.random_rows([IMAGE, IDS], {"x": (-1.0, 1.0), "ids": (3.0, 5.0)}, 50, rng)
    assert rows.arrays["x"].shape == (50, 2, 3) and rows.arrays["x"].dtype == np.float32
    assert rows.arrays["x"].min() >= -1.0 and rows.arrays["x"].max() <= 1.0
    assert set(np.unique(rows.arrays["ids"])) <= {3, 4, 5}
    variable = InputSpec("v", np.dtype(np.float32), (-1, -1))
    with pytest.raises(ConfigError, match="has variable dims"):
        data.random_rows([variable], {"v": (0.0, 1.0)}, 2, rng)


def test_split_holds_out_a_quarter_and_tops_up(tmp_path: Path) -> None:
    path = tmp_path / "d.npz"
    np.savez(path, x=np.arange(8 * 6, dtype=np.float32).reshape(8, 2, 3), labels=np.arange(8))
    calibration, held_out = split_rows(_options(calibration=path), [IMAGE], tmp_path, True)
    assert calibration is not None and len(calibration) == 4
    assert calibration.arrays["x"][0, 0, 0] == 0.0
    assert len(held_out) == 6
    assert held_out.arrays["x"][0, 0, 0] == 24.0  # row 4: the first row not calibrated on
    assert held_out.labels is not None and held_out.labels.tolist() == [4, 5, 6, 7]
    assert held_out.sources[0] == "4 held-out rows of d.npz"
    assert held_out.sources[1].startswith("2 random rows (x in [0, 47])")


def test_split_without_calibration_checks_on_every_row(tmp_path: Path) -> None:
    path = tmp_path / "d.npz"
    np.savez(path, x=np.zeros((8, 2, 3), dtype=np.float32))
    calibration, held_out = split_rows(_options(calibration=path), [IMAGE], tmp_path, False)
    assert calibration is None
    assert len(held_out) == 6 and held_out.sources == ["6 held-out rows of d.npz"]


def test_feeds_batch_rows_or_whole_inputs() -> None:
    rows = data.Rows({"x": np.zeros((5, 2, 3), dtype=np.float32)})
    assert [f["x"].shape for f in data.feeds(rows, [IMAGE], 2)] == [(2, 2, 3)] * 2 + [(1, 2, 3)]
    fixed = InputSpec("x", np.dtype(np.float32), (2, 3))
    assert [f["x"].shape for f in data.feeds(rows, [fixed], 2)] == [(2, 3)] * 5
