"""The runnable examples of the docs: fenced blocks marked with an HTML comment.

A marker is an HTML comment alone on the line right before a fenced block, both at the start
of their lines (so not inside a list item)::

    <!-- run -->                  run the block (bash or python) in the page's folder
    <!-- run file=PATH -->        write the block to PATH in the page's folder instead
    <!-- run server -->           the block is one `inferd serve ...` command: start it as the
                                  page's server (options: models=a,b: the demo models copied
                                  into the folder's ./models first; default half_plus_two,digits)
    <!-- output -->               the block is what the run block before it prints

Readers see none of this: an HTML comment does not render. ``tests/docs/test_examples.py``
runs every page's marked blocks in order; see the contributor page "Writing docs".
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

_BLOCK = re.compile(
    r"^<!--\s*(?P<kind>run|output)(?P<options>[^>]*?)\s*-->\n"
    r"(?P<fence>`{3,})(?P<lang>[\w-]*)[^\n]*\n(?P<body>.*?)^(?P=fence)\s*$",
    re.S | re.M,
)
_MARKER = re.compile(r"^<!--\s*(run|output)\b", re.M)


@dataclass
class Block:
    """One marked block of a page, in page order."""

    page: Path
    line: int
    kind: str  # run | file | server | output
    lang: str
    body: str
    options: dict[str, str] = field(default_factory=dict)
    expected: str | None = None  # the output block that follows a run block

    def __str__(self) -> str:
        return f"{self.page}:{self.line}"


def _options(text: str) -> tuple[str, dict[str, str]]:
    words = shlex.split(text)
    kind = "run"
    options: dict[str, str] = {}
    for word in words:
        if "=" in word:
            key, value = word.split("=", 1)
            options[key] = value
        elif word == "server":
            kind = "server"
        else:
            raise ValueError(f"unknown marker word '{word}'")
    if "file" in options:
        kind = "file"
    return kind, options


def blocks(page: Path) -> list[Block]:
    """The marked blocks of a page; a marker that is not right before a fence is an error."""
    text = page.read_text()
    found: list[Block] = []
    for match in _BLOCK.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        body = match.group("body")
        if match.group("kind") == "output":
            if not found or found[-1].kind != "run" or found[-1].expected is not None:
                raise ValueError(f"{page}:{line}: an output block must follow a run block")
            found[-1].expected = body
            continue
        kind, options = _options(match.group("options"))
        found.append(Block(page, line, kind, match.group("lang"), body, options))
    markers = len(_MARKER.findall(text))
    if markers != len(_BLOCK.findall(text)):
        raise ValueError(f"{page}: a marker is not right before a fenced block")
    return found


def _lines(text: str) -> str:
    """``text`` with the spaces that end its lines and the blank lines around it left out."""
    return "\n".join(line.rstrip() for line in text.strip("\n").splitlines()).strip("\n")


def matches(expected: str, printed: str) -> bool:
    """Whether ``printed`` is ``expected`` as the reader sees it: the same lines with the same
    spacing, only the spaces that end a line and the blank lines around the whole left out, and
    ``...`` standing for any text (a timestamp, an id, several lines)."""
    want, got = _lines(expected), _lines(printed)
    pattern = ".*?".join(re.escape(part) for part in want.split("..."))
    return re.fullmatch(pattern, got, re.S) is not None
