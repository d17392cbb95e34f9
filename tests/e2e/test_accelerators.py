"""Accelerators by config (Triton's syntax) on a real server: the ONNX Runtime providers in use,
OpenVINO through inferd's OpenVINO backend, and a load error naming the field for unknown ones."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.support import ServerProcess

CONFIGS = {
    "digits_openvino": (
        "optimization { execution_accelerators {\n"
        '  cpu_execution_accelerator [ { name: "openvino" } ]\n} }\n'
    ),
    "digits_graph": "optimization { graph { level: 1 } }\n",
    "digits_tensorrt": (
        "optimization { execution_accelerators {\n"
        '  gpu_execution_accelerator [ { name: "tensorrt" } ]\n} }\n'
    ),
    "digits_bad": (
        "optimization { execution_accelerators {\n"
        '  cpu_execution_accelerator [ { name: "quantum" } ]\n} }\n'
    ),
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, demo_repo: Path) -> Iterator[ServerProcess]:
    pytest.importorskip("openvino")
    root = tmp_path_factory.mktemp("accelerators") / "models"
    for name, extra in CONFIGS.items():
        shutil.copytree(demo_repo / "digits", root / name)
        config = (root / name / "config.pbtxt").read_text().replace('"digits"', f'"{name}"')
        (root / name / "config.pbtxt").write_text(config + extra)
    # digits_bad fails to load on purpose: readiness is not strict
    proc = ServerProcess(root, extra_args=["--strict-readiness=false"]).start()
    yield proc
    proc.stop()


def _labels(server: ServerProcess, model: str, x: np.ndarray) -> list[int]:
    body = {
        "inputs": [
            {
                "name": "input",
                "shape": list(x.shape),
                "datatype": "FP32",
                "data": x.ravel().tolist(),
            }
        ],
        "outputs": [{"name": "label"}],
    }
    response = httpx.post(f"{server.http_url}/v2/models/{model}/infer", json=body, timeout=30)
    assert response.status_code == 200, response.text
    return [int(v) for v in response.json()["outputs"][0]["data"]]


def test_accelerated_models_serve_the_same_answers(server: ServerProcess, demo_repo: Path) -> None:
    sample = json.loads((demo_repo / "digits" / "sample.json").read_text())
    x = np.array(sample["inputs"], dtype=np.float32)
    answers = {name: _labels(server, name, x) for name in CONFIGS if name != "digits_bad"}
    assert answers["digits_openvino"] == answers["digits_graph"] == answers["digits_tensorrt"]
    assert np.mean(np.array(answers["digits_graph"]) == np.array(sample["labels"])) >= 0.85


def test_providers_in_use_are_logged(server: ServerProcess) -> None:
    log = server.log()
    assert "model 'digits_graph': onnxruntime providers CPUExecutionProvider" in log
    assert "model 'digits_openvino': cpu_execution_accelerator openvino" in log
    assert "model 'digits_openvino': onnxruntime providers" not in log
    # a GPU accelerator does not apply to a CPU instance: plain CPU provider
    assert "model 'digits_tensorrt': onnxruntime providers CPUExecutionProvider" in log


def test_unknown_accelerator_is_a_load_error_naming_the_field(server: ServerProcess) -> None:
    entries = httpx.post(f"{server.http_url}/v2/repository/index", json={}, timeout=60).json()
    bad = next(e for e in entries if e["name"] == "digits_bad")
    assert bad["state"] == "UNAVAILABLE"
    assert "optimization.execution_accelerators.cpu_execution_accelerator" in bad["reason"]
    assert "unknown accelerator 'quantum'" in bad["reason"]
    ready = {e["name"] for e in entries if e["state"] == "READY"}
    assert ready == {"digits_openvino", "digits_graph", "digits_tensorrt"}
