"""Config ``parameters`` a backend does not use are ignored with a warning naming them, as
Triton's backends ignore them; a config field inferd does not implement still fails by name."""

from __future__ import annotations

import shutil
from pathlib import Path

import httpx

from tests.e2e.lifecycle_support import index
from tests.support import ServerProcess

# Triton's examples and QA models set execute_delay_ms on their models' configs.
DELAYED = """platform: "onnxruntime_onnx"
parameters [
  { key: "execute_delay_ms" value: { string_value: "2000" } },
  { key: "intra_op_thread_cont" value: { string_value: "1" } }
]
"""
X = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 1], "data": [1.0]}]}


def test_unknown_parameters_are_ignored_and_fields_still_fail(
    tmp_path: Path, demo_repo: Path
) -> None:
    root = tmp_path / "models"
    for name, config in (("delayed", DELAYED), ("operations", "model_operations { }\n")):
        shutil.copytree(demo_repo / "half_plus_two", root / name)
        (root / name / "config.pbtxt").write_text(config)
    server = ServerProcess(root, extra_args=["--strict-readiness=false"]).start()
    try:
        answer = httpx.post(f"{server.http_url}/v2/models/delayed/infer", json=X, timeout=30)
        assert answer.json()["outputs"][0]["data"] == [2.5]
        (failed,) = [e for e in index(server) if e["name"] == "operations"]
        assert failed["state"] == "UNAVAILABLE"
        assert 'no field named "model_operations"' in failed["reason"]
    finally:
        server.stop()
    log = server.log()
    warning = (
        "model 'delayed': the onnxruntime backend ignores parameter(s) execute_delay_ms, "
        "intra_op_thread_cont (did you mean intra_op_thread_count?); it reads: "
    )
    assert log.count(warning) == 1, log
