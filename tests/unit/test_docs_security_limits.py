"""docs/security/limits.md: every flag it names exists, and every limit or timeout flag of the
server is in it (its marked command runs with the other docs examples, tests/docs)."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from inferd.app.settings import Settings

PAGE = Path(__file__).resolve().parents[2] / "docs" / "security" / "limits.md"
LIMIT_WORDS = ("timeout", "keepalive", "ping", "inflight", "rate", "concurrent", "max_header")
NOT_CLIENT_FACING = {"--drain-timeout-s"}  # how long a stopping server lets calls finish


def test_every_limit_flag_is_documented_and_every_documented_flag_exists() -> None:
    text = PAGE.read_text()
    flags = {"--" + f.name.replace("_", "-") for f in dataclasses.fields(Settings)}
    named = set(re.findall(r"`(--[a-z0-9-]+)", text))
    assert named <= flags, named - flags
    limits = {
        "--" + f.name.replace("_", "-")
        for f in dataclasses.fields(Settings)
        if any(word in f.name for word in LIMIT_WORDS)
    } - NOT_CLIENT_FACING
    assert limits <= named, limits - named
