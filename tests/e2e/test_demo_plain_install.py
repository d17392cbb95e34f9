"""``inferd demo-models`` then ``inferd serve`` from a plain install (no ``inferd[demo]``): the
command writes what it can, names the extra for the rest and exits 0, and the server becomes
ready. scikit-learn, Pillow and TensorFlow are hidden from both processes by a sitecustomize
module (a fresh venv would take minutes)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx

from tests.support import ServerProcess

HIDE = """import sys
for name in ("sklearn", "PIL", "tensorflow"):
    sys.modules[name] = None  # import fails; importlib.util.find_spec answers None
"""


def test_demo_models_from_a_plain_install_lead_to_a_ready_server(tmp_path: Path) -> None:
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text(HIDE)
    path = os.pathsep.join(p for p in (str(hide), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": path}
    probe = [sys.executable, "-c", "import sklearn"]
    assert subprocess.run(probe, env=env, capture_output=True).returncode == 1
    models = tmp_path / "models"
    done = subprocess.run(
        [sys.executable, "-m", "inferd", "demo-models", str(models)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"demo repository {models}: half_plus_two, resnet50"
    root = Path(__file__).resolve().parents[2]  # the checkout the server runs from
    assert f"not written: digits (needs scikit-learn: pip install -e '{root}[demo]')" in done.stderr
    assert "resnet_preprocess, resnet_postprocess, resnet (needs Pillow" in done.stderr
    assert sorted(p.name for p in models.iterdir()) == ["half_plus_two", "resnet50"]
    server = ServerProcess(models, env={"PYTHONPATH": path}).start(timeout_s=120)
    try:
        index = httpx.post(f"{server.http_url}/v2/repository/index", timeout=60).json()
        assert {(m["name"], m["state"]) for m in index} == {
            ("half_plus_two", "READY"),
            ("resnet50", "READY"),
        }
        body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 1], "data": [1.0]}]}
        answer = httpx.post(
            f"{server.http_url}/v2/models/half_plus_two/infer", json=body, timeout=60
        )
        assert answer.json()["outputs"][0]["data"] == [2.5]
    finally:
        server.stop()
