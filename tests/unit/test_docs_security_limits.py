"""docs/security-limits.md: its marked command runs as written, every flag it names exists,
and every limit or timeout flag of the server is in it."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

from inferd.settings import Settings

PAGE = Path(__file__).resolve().parents[2] / "docs" / "security-limits.md"
LIMIT_WORDS = ("timeout", "keepalive", "ping", "inflight", "rate", "concurrent", "max_header")
NOT_CLIENT_FACING = {"--drain-timeout-s"}  # how long a stopping server lets calls finish


def _block(marker: str) -> str:
    text = PAGE.read_text()
    after = text[text.index(f"<!-- test: {marker} -->") :]
    found = re.search(r"```bash\n(.*?)```", after, re.S)
    assert found is not None
    return found.group(1)


def test_the_marked_command_lists_the_limit_flags() -> None:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    done = subprocess.run(
        ["bash", "-c", _block("security-limits-help")],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    for flag in ("--grpc-keepalive-time", "--grpc-idle-timeout-s", "--http-min-body-rate-bytes"):
        assert flag in done.stdout


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
