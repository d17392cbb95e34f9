"""Tests for the demo model repository writer (inferd.demo.models)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import onnxruntime as ort
import pytest

from inferd.demo.models import DEMO_MODELS, write_demo_repository


def _session(path: Path) -> ort.InferenceSession:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def _run(path: Path, feeds: dict[str, npt.NDArray[Any]]) -> list[npt.NDArray[Any]]:
    outputs: list[npt.NDArray[Any]] = _session(path).run(None, feeds)
    return outputs


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("demo_repo")
    assert write_demo_repository(root) == list(DEMO_MODELS)
    return root


def test_layout_and_configs(repo: Path) -> None:
    assert DEMO_MODELS == ("half_plus_two", "digits", "resnet50")
    for name in DEMO_MODELS:
        assert (repo / name / "1" / "model.onnx").is_file()
        assert (repo / name / "1" / ".inferd-demo").is_file()
    assert (repo / "digits" / "config.pbtxt").read_text() == (
        'name: "digits"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 64\n'
    )
    assert not (repo / "half_plus_two" / "config.pbtxt").exists()
    assert not (repo / "resnet50" / "config.pbtxt").exists()
    leftovers = [p.name for p in repo.rglob("*.tmp")]
    assert leftovers == []


def test_half_plus_two(repo: Path) -> None:
    session = _session(repo / "half_plus_two" / "1" / "model.onnx")
    assert [i.name for i in session.get_inputs()] == ["x"]
    assert session.get_inputs()[0].shape == ["batch"]
    assert [o.name for o in session.get_outputs()] == ["y"]
    (y,) = session.run(None, {"x": np.array([1.0, 2.0, 5.0], dtype=np.float32)})
    assert y.dtype == np.float32
    np.testing.assert_allclose(y, [2.5, 3.0, 4.5])


def test_digits(repo: Path) -> None:
    model = repo / "digits" / "1" / "model.onnx"
    session = _session(model)
    assert [o.name for o in session.get_outputs()] == ["label", "probabilities"]
    assert session.get_inputs()[0].shape == ["batch", 64]
    sample = json.loads((repo / "digits" / "sample.json").read_text())
    inputs = np.asarray(sample["inputs"], dtype=np.float32)
    labels = np.asarray(sample["labels"], dtype=np.int64)
    assert inputs.shape == (8, 64)
    assert labels.shape == (8,)
    label, proba = _run(model, {"input": inputs})
    assert label.dtype == np.int64
    assert proba.shape == (8, 10)
    assert int((label == labels).sum()) >= 7
    np.testing.assert_array_equal(label, proba.argmax(axis=1))
    np.testing.assert_allclose(proba.sum(axis=1), np.ones(8), atol=1e-5)


def test_resnet50(repo: Path) -> None:
    model = repo / "resnet50" / "1" / "model.onnx"
    assert model.stat().st_size > 95_000_000
    session = _session(model)
    assert session.get_inputs()[0].shape == ["batch", 3, 224, 224]
    assert [o.name for o in session.get_outputs()] == ["output"]
    x = np.random.default_rng(1).standard_normal((2, 3, 224, 224), dtype=np.float32)
    (out,) = session.run(None, {"input": x})
    assert out.shape == (2, 1000)
    assert out.dtype == np.float32
    assert np.isfinite(out).all()
    assert np.ptp(out) > 0.0
    assert not np.array_equal(out[0], out[1])


def test_second_call_skips_rewrite(repo: Path) -> None:
    paths = sorted(p for p in repo.rglob("*") if p.is_file())
    before = {p: p.stat().st_mtime_ns for p in paths}
    assert write_demo_repository(repo) == list(DEMO_MODELS)
    assert {p: p.stat().st_mtime_ns for p in paths} == before
    assert sorted(p for p in repo.rglob("*") if p.is_file()) == paths


def test_changed_file_is_rebuilt(tmp_path: Path) -> None:
    assert write_demo_repository(tmp_path, models=["half_plus_two"]) == ["half_plus_two"]
    model = tmp_path / "half_plus_two" / "1" / "model.onnx"
    original = model.read_bytes()
    model.write_bytes(b"corrupted")
    assert write_demo_repository(tmp_path, models=["half_plus_two"]) == ["half_plus_two"]
    assert model.read_bytes() == original
    assert sorted(p.name for p in tmp_path.iterdir()) == ["half_plus_two"]


def test_unknown_name_raises(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no_such_model"):
        write_demo_repository(tmp_path, models=("half_plus_two", "no_such_model"))
    assert list(tmp_path.iterdir()) == []


def test_resnet_pipeline_files(tmp_path: Path) -> None:
    from inferd.backends.ensemble_graph import build_graph
    from inferd.config.text import parse_config_text
    from inferd.demo.models import PIPELINE_MODELS, default_models

    assert PIPELINE_MODELS == ("resnet_preprocess", "resnet_postprocess", "resnet")
    assert set(PIPELINE_MODELS) <= set(default_models())
    write_demo_repository(tmp_path, models=PIPELINE_MODELS)
    graph = build_graph(parse_config_text((tmp_path / "resnet" / "config.pbtxt").read_text()))
    assert graph.models() == ["resnet_preprocess", "resnet50", "resnet_postprocess"]
    assert (tmp_path / "resnet" / "1").is_dir()
    labels = (tmp_path / "resnet_postprocess" / "labels.txt").read_text().splitlines()
    assert len(labels) == 1000 and labels[7] == "class 7"
    assert (tmp_path / "resnet_preprocess" / "1" / "model.py").is_file()


def test_a_missing_extra_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    from inferd.demo.models import missing_extra

    monkeypatch.setitem(sys.modules, "sklearn", None)  # as on a plain install
    root = Path(__file__).resolve().parents[2]  # this checkout: no package index has inferd
    assert missing_extra("digits") == f"scikit-learn: pip install -e '{root}[demo]'"
    assert missing_extra("half_plus_two") == ""
