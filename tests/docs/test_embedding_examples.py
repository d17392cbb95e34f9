"""docs/embedding.md runs as written: each fenced block after a ``<!-- run -->`` marker is run
in order in one folder (bash and python blocks as scripts, ``<!-- run file=PATH -->`` blocks
written to PATH), and an ``<!-- output -->`` block is what the run block before it prints
(whitespace aside, ``...`` for any text). The page's first block writes the demo repository
with ``inferd demo-models``."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "embedding.md"
BLOCK_TIMEOUT_S = 180
_BLOCK = re.compile(
    r"^<!--\s*(?P<kind>run|output)(?P<options>[^>]*?)\s*-->\n"
    r"(?P<fence>`{3,})(?P<lang>[\w-]*)[^\n]*\n(?P<body>.*?)^(?P=fence)\s*$",
    re.S | re.M,
)
_MARKER = re.compile(r"^<!--\s*(run|output)\b", re.M)


@dataclass
class Block:
    line: int
    lang: str
    body: str
    file: str = ""  # write the block here instead of running it
    expected: str | None = None


def _blocks(text: str) -> list[Block]:
    found: list[Block] = []
    for match in _BLOCK.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        if match.group("kind") == "output":
            assert found and found[-1].expected is None, f"line {line}: output of what?"
            found[-1].expected = match.group("body")
            continue
        options = dict(word.split("=", 1) for word in match.group("options").split())
        assert set(options) <= {"file"}, f"line {line}: unknown marker options {options}"
        found.append(Block(line, match.group("lang"), match.group("body"), options.get("file", "")))
    assert len(_MARKER.findall(text)) == len(_BLOCK.findall(text)), "a marker without a block"
    return found


def _matches(expected: str, printed: str) -> bool:
    want, got = "".join(expected.split()), "".join(printed.split())
    pattern = ".*?".join(re.escape(part) for part in want.split("..."))
    return re.fullmatch(pattern, got, re.S) is not None


def test_the_page_marks_its_examples() -> None:
    blocks = _blocks(PAGE.read_text())
    assert blocks[0].lang == "bash" and blocks[0].body.startswith("inferd demo-models models")
    assert sum(b.lang == "python" and not b.file for b in blocks) >= 6
    assert any(b.expected is not None for b in blocks)


def test_every_example_runs_as_written(tmp_path: Path) -> None:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    for block in _blocks(PAGE.read_text()):
        if block.file:
            path = tmp_path / block.file
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(block.body)
            continue
        if block.lang == "python":
            script = tmp_path / f"_example_{block.line}.py"
            script.write_text(block.body)
            command = [sys.executable, str(script)]
        else:
            assert block.lang == "bash", f"line {block.line}: cannot run '{block.lang}'"
            command = ["bash", "-e", "-o", "pipefail", "-c", block.body]
        done = subprocess.run(
            command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=BLOCK_TIMEOUT_S
        )
        where = f"line {block.line}:\n{block.body}\n--- stdout\n{done.stdout}"
        where += f"\n--- stderr\n{done.stderr}"
        assert done.returncode == 0, f"exit {done.returncode} at {where}"
        if block.expected is not None:
            assert _matches(block.expected, done.stdout), f"expected\n{block.expected}\nat {where}"
