"""A backend from an installed distribution that fails to load fails only the models that
select it, with an error naming the distribution: the server keeps serving the others."""

from __future__ import annotations

import os
from pathlib import Path

import httpx

from tests.e2e.lifecycle_support import HTTP, states
from tests.echo_support import BATCHED as ECHO
from tests.support import ServerProcess


def _broken_distribution(site: Path) -> None:
    """What pip leaves of a distribution whose module ends the interpreter when imported."""
    info = site / "broken_backend-2.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-backend\nVersion: 2.0\n")
    (info / "entry_points.txt").write_text("[inferd.backends]\nbroken = broken_backend:Backend\n")
    (site / "broken_backend.py").write_text("import sys\n\nsys.exit('libbroken is missing')\n")


def test_a_backend_that_fails_to_import_fails_only_its_models(tmp_path: Path) -> None:
    root = tmp_path / "models"
    (root / "good" / "1").mkdir(parents=True)
    (root / "good" / "config.pbtxt").write_text(ECHO)
    (root / "bad" / "1").mkdir(parents=True)
    (root / "bad" / "config.pbtxt").write_text('backend: "broken"\n')
    site = tmp_path / "site"
    _broken_distribution(site)
    path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH")) if p)
    args = ["--model-control-mode", "explicit", "--load-model", "good"]
    server = ServerProcess(root, extra_args=args, env={"PYTHONPATH": path}).start()
    try:
        r = HTTP.post(f"{server.http_url}/v2/repository/models/bad/load", timeout=60)
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert "backend 'broken'" in error and "broken-backend 2.0" in error, error
        assert "SystemExit: libbroken is missing" in error, error
        body = {"inputs": [{"name": "INPUT0", "shape": [1, 2], "datatype": "FP32"}]}
        body["inputs"][0]["data"] = [1.0, 2.0]
        answer = httpx.post(f"{server.http_url}/v2/models/good/infer", json=body, timeout=60)
        assert answer.status_code == 200, answer.text
        assert answer.json()["outputs"][0]["data"] == [1.0, 2.0]
        assert states(server, "good") == {"1": "READY"}
        assert server.proc is not None and server.proc.poll() is None
    finally:
        server.stop()
