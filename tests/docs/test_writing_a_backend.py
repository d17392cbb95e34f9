"""The page "Writing a backend": its package, installed as pip installs it, served by a real
server that finds it through its entry point, answers as the page shows."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import httpx

from tests.support import ServerProcess, docs_block

PAGE = Path(__file__).resolve().parents[2] / "docs" / "backends" / "writing.md"
FILES = (
    "inferd-polynomial/pyproject.toml",
    "inferd-polynomial/inferd_polynomial.py",
    "models/poly/config.pbtxt",
    "models/poly/1/coefficients.txt",
)


def _fenced(lang: str) -> list[str]:
    text = PAGE.read_text()
    return re.findall(rf"^```{lang}\n(.*?)^```$", text, re.S | re.M)


def test_the_pages_backend_is_installed_and_serves(tmp_path: Path) -> None:
    for path in FILES:
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(docs_block(PAGE, path))
    # pip install ./inferd-polynomial, as the page says, into a folder of its own (offline:
    # the build uses the setuptools already installed; the suite's environment is untouched)
    site = tmp_path / "site"
    offline = ("--quiet", "--no-deps", "--no-index", "--no-build-isolation")
    package = str(tmp_path / "inferd-polynomial")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", *offline, "--target", str(site), package],
        check=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert list(site.glob("inferd_polynomial-0.1.0.dist-info/entry_points.txt"))
    path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH")) if p)
    server = ServerProcess(tmp_path / "models", env={"PYTHONPATH": path}).start()
    try:
        (request,) = re.findall(r"-d '(.*)'", _fenced("bash")[-1])
        (shown,) = _fenced("json")
        with httpx.Client(base_url=server.http_url, timeout=60) as client:
            answer = client.post("/v2/models/poly/infer", content=request)
            assert answer.status_code == 200, answer.text
            assert answer.json() == json.loads(shown)
            assert answer.json()["outputs"][0]["data"] == [1.0, 6.0, 17.0]
            config = client.get("/v2/models/poly/config").json()
            assert config["backend"] == "polynomial" and config["max_batch_size"] > 0
    finally:
        server.stop()
