"""docs/torchserve.md's marked examples, run in page order against a server the page starts.

The markers are the docs site's (``<!-- run -->``, ``<!-- run file=PATH -->``, ``<!-- run
server -->``, ``<!-- output -->``); this runs them with free ports in place of the page's
defaults (8080, 8081, 8085, 8086, 7070, 7071)."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.e2e.torchserve_support import Ports
from tests.support import free_port

PAGE = Path(__file__).resolve().parents[2] / "docs" / "torchserve.md"
_BLOCK = re.compile(
    r"^<!--\s*(?P<kind>run|output)(?P<options>[^>]*?)\s*-->\n"
    r"(?P<fence>`{3,})(?P<lang>[\w-]*)[^\n]*\n(?P<body>.*?)^(?P=fence)\s*$",
    re.S | re.M,
)


def _normal(text: str) -> str:
    return "".join(text.split())


def test_the_page_runs_as_written(tmp_path: Path) -> None:
    text = PAGE.read_text()
    assert len(re.findall(r"^<!--\s*(run|output)\b", text, re.M)) == len(_BLOCK.findall(text))
    ports = Ports()
    http, grpc = free_port(), free_port()
    swaps = {
        "localhost:8085": f"localhost:{ports.inference}",
        "localhost:8086": f"localhost:{ports.management}",
        "localhost:7070": f"localhost:{ports.grpc_inference}",
        "localhost:7071": f"localhost:{ports.grpc_management}",
        "localhost:8080": f"localhost:{http}",
        "localhost:8081": f"localhost:{grpc}",
    }
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}
    server: subprocess.Popen[bytes] | None = None
    printed = ""
    try:
        for match in _BLOCK.finditer(text):
            body, options = match.group("body"), match.group("options").split()
            line = text.count("\n", 0, match.start()) + 1
            if match.group("kind") == "output":
                assert _normal(printed) == _normal(body), f"line {line}: {printed!r}"
                continue
            if any(o.startswith("file=") for o in options):
                (tmp_path / options[0].split("=", 1)[1]).write_text(body)
                continue
            if "server" in options:
                command = shlex.split(body.replace("\\\n", " "))
                assert command[:2] == ["inferd", "serve"], f"line {line}"
                args = [*command[2:], "--http-address", "127.0.0.1", "--grpc-address", "127.0.0.1"]
                args += ["--http-port", str(http), "--grpc-port", str(grpc), *ports.args()]
                with open(tmp_path / "server.log", "wb") as log:
                    server = subprocess.Popen(
                        [sys.executable, "-m", "inferd", "serve", *args],
                        cwd=tmp_path,
                        env=env,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                    )
                _wait(f"http://127.0.0.1:{http}/v2/health/ready", server, tmp_path)
                continue
            for old, new in swaps.items():
                body = body.replace(old, new)
            if match.group("lang") == "python":
                script = tmp_path / f"block_{line}.py"
                script.write_text(body)
                command = [sys.executable, str(script)]
            else:
                command = ["bash", "-e", "-o", "pipefail", "-c", body]
            done = subprocess.run(
                command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
            )
            assert done.returncode == 0, f"line {line}: {done.stderr}"
            printed = done.stdout
    finally:
        if server is not None:
            server.send_signal(signal.SIGINT)  # stop at once (SIGTERM would drain first)
            server.wait(timeout=60)


def _wait(url: str, server: subprocess.Popen[bytes], folder: Path) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert server.poll() is None, (folder / "server.log").read_text()
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError((folder / "server.log").read_text())
