"""docs/many-models.md runs as written: its marked blocks (``<!-- run -->``, ``<!-- run
server -->``, ``<!-- output -->``, the docs site's markers) in order, against the page's own
server on the demo models, each run block's output compared with the block that follows it."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from inferd.demo.models import write_demo_repository
from tests.support import ServerProcess

PAGE = Path(__file__).resolve().parents[2] / "docs" / "many-models.md"
_BLOCK = re.compile(
    r"^<!--\s*(?P<kind>run|output)(?P<options>[^>]*?)\s*-->\n"
    r"(?P<fence>`{3,})(?P<lang>[\w-]*)[^\n]*\n(?P<body>.*?)^(?P=fence)\s*$",
    re.S | re.M,
)


def _blocks() -> list[tuple[str, str, str, str | None]]:
    """(kind, options, language, body, expected output) of each marked block, in order."""
    found: list[list[str | None]] = []
    for match in _BLOCK.finditer(PAGE.read_text()):
        if match.group("kind") == "output":
            found[-1][3] = match.group("body")
        else:
            found.append([match.group("options").strip(), match.group("lang"), match["body"], None])
    return [(str(o), str(lang), str(body), out) for o, lang, body, out in found]


def _serve_flags(body: str) -> list[str]:
    words = shlex.split(" ".join(line.removesuffix("\\") for line in body.splitlines()))
    assert words[:4] == ["inferd", "serve", "--model-repository", "./models"]
    return words[4:]


def test_the_page_runs_as_written(tmp_path: Path) -> None:
    blocks = _blocks()
    assert [o for o, *_ in blocks].count("server models=half_plus_two,digits") == 1
    write_demo_repository(tmp_path / "models", models=["half_plus_two", "digits"])
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    server: ServerProcess | None = None
    try:
        for number, (options, lang, body, expected) in enumerate(blocks):
            if options.startswith("server"):
                server = ServerProcess(tmp_path / "models", _serve_flags(body)).start()
                continue
            assert server is not None
            text = body.replace("localhost:8080", server.http_address)
            text = text.replace("localhost:8081", server.grpc_address)
            if lang == "python":
                script = tmp_path / f"block{number}.py"
                script.write_text(text)
                command = [sys.executable, str(script)]
            else:
                command = ["bash", "-e", "-o", "pipefail", "-c", text]
            done = subprocess.run(
                command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
            )
            assert done.returncode == 0, f"{text}\n{done.stdout}\n{done.stderr}\n{server.log()}"
            if expected is not None:
                assert done.stdout == expected, f"{text}\n{done.stdout}"
    finally:
        if server is not None:
            server.stop()
