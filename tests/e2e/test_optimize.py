"""``inferd optimize`` on small models (fast settings), then a real server serving the new versions.

Refusals leave the model folder as it was: no new version, no staging folder.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.optimize_support import (
    inferd,
    write_digits_held_out,
    write_small_cnn,
    write_tie_model,
)
from tests.support import ServerProcess

# These small models may time slower or faster as the host's noise goes: the accuracy tests keep
# what they write either way (the speed verdict has tests of its own).
FAST = ("--latency-runs", "1", "--no-progress", "--allow-slower")
ALL_VERSIONS = "version_policy: { all {} }\n"


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory, demo_repo: Path) -> Path:
    root = tmp_path_factory.mktemp("optimize") / "models"
    for name in ("digits", "half_plus_two"):
        shutil.copytree(demo_repo / name, root / name)
    with (root / "digits" / "config.pbtxt").open("a", encoding="utf-8") as f:
        f.write(ALL_VERSIONS)
    write_small_cnn(root / "cnn")
    (root / "cnn" / "config.pbtxt").write_text(ALL_VERSIONS, encoding="utf-8")
    write_tie_model(root / "ties")
    return root


@pytest.fixture(scope="module")
def digits_run(repo: Path) -> dict[str, object]:
    held_out = repo.parent / "digits_held_out.npz"
    write_digits_held_out(held_out)
    report = repo.parent / "digits.json"
    done = inferd(
        "optimize",
        str(repo / "digits"),
        "--int8",
        "dynamic",
        "--calibration",
        str(held_out),
        "--check-samples",
        "450",
        "--report",
        str(report),
        *FAST,
    )
    assert done.returncode == 0, done.stderr
    return {"stdout": done.stdout, "report": json.loads(report.read_text())}


@pytest.fixture(scope="module")
def cnn_run(repo: Path) -> dict[str, object]:
    report = repo.parent / "cnn.json"
    done = inferd(
        "optimize",
        str(repo / "cnn"),
        "--int8",
        "--calibration-samples",
        "16",
        "--check-samples",
        "64",
        "--input-range=-1:1",
        "--min-agreement",
        "0.9",
        "--report",
        str(report),
        *FAST,
    )
    assert done.returncode == 0, done.stderr
    return {"stdout": done.stdout, "report": json.loads(report.read_text())}


@pytest.fixture(scope="module")
def server(
    repo: Path, digits_run: dict[str, object], cnn_run: dict[str, object]
) -> Iterator[ServerProcess]:
    proc = ServerProcess(repo).start()
    yield proc
    proc.stop()


def _infer(
    server: ServerProcess, model: str, version: int, name: str, x: np.ndarray
) -> dict[str, Any]:
    body = {
        "inputs": [
            {"name": name, "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}
        ]
    }
    url = f"{server.http_url}/v2/models/{model}/versions/{version}/infer"
    response = httpx.post(url, json=body, timeout=30)
    assert response.status_code == 200, response.text
    return {o["name"]: np.array(o["data"]).reshape(o["shape"]) for o in response.json()["outputs"]}


def test_digits_int8_dynamic_keeps_accuracy(digits_run: dict[str, object]) -> None:
    report = digits_run["report"]
    assert isinstance(report, dict)
    assert report["version"] == 2 and report["source_version"] == 1
    assert report["method"].startswith("int8 dynamic")
    assert report["notes"]["op_types"] == "MatMul"
    assert report["check_rows"] == 450
    assert report["agreement"] >= 0.99
    accuracy = report["accuracy"]
    assert accuracy["rows"] == 450
    assert abs(accuracy["optimized"] - accuracy["original"]) <= 0.005
    assert set(report["latency_ms"]) == {"1", "32"}
    stdout = str(digits_run["stdout"])
    assert "optimized  2" in stdout and "agreement" in stdout
    assert "accuracy on 450 labelled rows" in stdout


def test_new_digits_version_serves_with_its_notes(server: ServerProcess, repo: Path) -> None:
    # The new version has its model folder's mode, not mkdtemp's 0700: any server user reads it.
    assert (repo / "digits" / "2").stat().st_mode & 0o777 == (
        repo / "digits"
    ).stat().st_mode & 0o777
    config = httpx.get(f"{server.http_url}/v2/models/digits/versions/2/config", timeout=60).json()
    params = {k: v["string_value"] for k, v in config["parameters"].items()}
    assert params["optimize.method"].startswith("int8 dynamic")
    assert params["optimize.op_types"] == "MatMul"
    assert params["optimize.source_version"] == "1"
    assert float(params["optimize.agreement"]) >= 0.99
    sample = json.loads((repo / "digits" / "sample.json").read_text())
    x = np.array(sample["inputs"], dtype=np.float32)
    original = _infer(server, "digits", 1, "input", x)["label"].ravel()
    optimized = _infer(server, "digits", 2, "input", x)["label"].ravel()
    assert optimized.tolist() == original.tolist()
    assert (optimized == np.array(sample["labels"])).mean() >= 0.85


def test_cnn_int8_static_qdq_serves(cnn_run: dict[str, object], server: ServerProcess) -> None:
    report = cnn_run["report"]
    assert isinstance(report, dict)
    assert "static QDQ" in report["method"]
    assert report["notes"]["calibration_method"] == "MinMax"
    assert report["notes"]["calibration_rows"] == "16"
    assert "Conv" in report["notes"]["op_types"].split(",")
    assert report["notes"]["per_channel"] == "true"
    assert report["agreement"] >= 0.9
    x = np.random.default_rng(5).uniform(-1, 1, (16, 3, 8, 8)).astype(np.float32)
    original = _infer(server, "cnn", 1, "x", x)["logits"]
    optimized = _infer(server, "cnn", 2, "x", x)["logits"]
    assert optimized.shape == (16, 4)
    assert (original.argmax(1) == optimized.argmax(1)).mean() >= 0.8
    config = httpx.get(f"{server.http_url}/v2/models/cnn/versions/2/config", timeout=60).json()
    assert config["parameters"]["optimize.calibration_method"]["string_value"] == "MinMax"


def _untouched(folder: Path) -> None:
    assert sorted(p.name for p in folder.iterdir() if p.is_dir()) == ["1"]
    assert not [p for p in folder.iterdir() if p.name.startswith(".optimize-")]


def test_refuses_a_model_with_nothing_to_quantize(repo: Path) -> None:
    done = inferd("optimize", str(repo / "half_plus_two"), "--int8", *FAST)
    assert done.returncode == 2
    assert "does not quantize" in done.stderr and "Add, Mul" in done.stderr
    assert "nothing written" in done.stderr
    _untouched(repo / "half_plus_two")


def test_refuses_below_min_agreement(repo: Path) -> None:
    done = inferd("optimize", str(repo / "ties"), "--int8", "dynamic", *FAST)
    assert done.returncode == 2
    assert "below --min-agreement 99.00%" in done.stderr
    assert "scores:" in done.stderr and "top-1" in done.stderr
    _untouched(repo / "ties")


def test_graph_optimization_only(tmp_path: Path, demo_repo: Path) -> None:
    root = tmp_path / "models"
    shutil.copytree(demo_repo / "half_plus_two", root / "half_plus_two")
    report = tmp_path / "graph.json"
    done = inferd("optimize", str(root / "half_plus_two"), "--report", str(report), *FAST)
    assert done.returncode == 0, done.stderr
    doc = json.loads(report.read_text())
    assert doc["method"] == "onnxruntime extended optimizations, saved offline"
    assert doc["agreement"] == 1.0
    assert doc["outputs"] == ["y: 100.00% within 1% (max |err| 0, mean 0)"]
    assert (root / "half_plus_two" / "2" / "model.onnx").is_file()
    # Both models timed in interleaved rounds at batch 1 and 32, each with its verdict.
    for batch in ("1", "32"):
        timing = doc["latency_ms"][batch]
        assert timing["verdict"] in ("faster", "slower", "within noise")
        assert timing["rounds"] >= 1 and 0 <= timing["faster_rounds"] <= timing["rounds"]
    assert "at batch 1: " in done.stdout and "(the copy won " in done.stdout


def test_the_docs_first_example_works_as_printed(tmp_path: Path, demo_repo: Path) -> None:
    """The optimize page's first commands (too slow for the docs harness: ResNet-50 INT8), run
    as written in a folder of their own (the demo models linked in first, so demo-models finds
    them built): a version 2 faster than the original, or, on a host where it timed slower, a
    refusal that says so and writes nothing."""
    page = (Path(__file__).parents[2] / "docs" / "tools" / "optimize.md").read_text()
    found = re.search(r"^# inferd optimize\n.*?```bash\n(.*?)```", page, re.S)
    assert found, "docs/tools/optimize.md: no first example"
    commands = [line.split("#")[0].split() for line in found.group(1).splitlines()]
    assert [c[:2] for c in commands] == [["inferd", "demo-models"], ["inferd", "optimize"]]
    for name in ("half_plus_two", "digits", "resnet50"):
        shutil.copytree(demo_repo / name, tmp_path / "models" / name, copy_function=os.link)
    done = [inferd(*command[1:], cwd=tmp_path, timeout_s=600) for command in commands]
    assert done[0].returncode == 0, done[0].stderr
    optimized = done[1]
    if optimized.returncode == 0:
        assert (tmp_path / "models" / "resnet50" / "2" / "model.onnx").is_file()
        assert "optimized  2" in optimized.stdout and "100.00% top-1" in optimized.stdout
        assert "at batch 32: " in optimized.stdout
    else:
        assert "slower than the original" in optimized.stderr, optimized.stderr
        assert "--allow-slower writes it anyway" in optimized.stderr
        _untouched(tmp_path / "models" / "resnet50")


def test_bad_flags_and_existing_version(repo: Path) -> None:
    both = inferd("optimize", str(repo / "digits"), "--int8", "--fp16", *FAST)
    assert both.returncode == 2 and "exclude each other" in both.stderr
    taken = inferd("optimize", str(repo / "cnn"), "--as-version", "1", *FAST)
    assert taken.returncode == 2 and "version 1 of cnn exists already" in taken.stderr
    missing = inferd("optimize", str(repo / "nope"), *FAST)
    assert missing.returncode == 2 and "is not a model folder" in missing.stderr


def test_openvino_model_int8_with_nncf(tmp_path: Path) -> None:
    pytest.importorskip("nncf")
    pytest.importorskip("openvino")
    folder = tmp_path / "models" / "cnn_ov"
    write_small_cnn(folder)
    (folder / "config.pbtxt").write_text('backend: "openvino"\n', encoding="utf-8")
    report = tmp_path / "ov.json"
    done = inferd(
        "optimize",
        str(folder),
        "--int8",
        "--calibration-samples",
        "8",
        "--check-samples",
        "32",
        "--input-range=-1:1",
        "--min-agreement",
        "0.8",
        "--report",
        str(report),
        *FAST,
    )
    assert done.returncode == 0, done.stderr
    doc = json.loads(report.read_text())
    assert doc["method"].startswith("int8 NNCF")
    assert doc["notes"]["calibration_rows"] == "8"
    assert (folder / "2" / "model.xml").is_file() and (folder / "2" / "model.bin").is_file()
