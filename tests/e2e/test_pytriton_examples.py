"""PyTriton's own examples (tests/pytriton_examples, kept as fetched but for their imports) run
on inferd.pytriton as written: each server.py serves on PyTriton's default ports and its
client.py calls it, in a network namespace of their own so those ports are free."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUNNER = ROOT / "tests" / "pytriton_examples" / "run_example.py"
TIMEOUT_S = 300


def _namespaces_work() -> bool:
    try:
        done = subprocess.run(
            ["unshare", "-n", "sh", "-c", "ip link set lo up"], capture_output=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


pytestmark = pytest.mark.skipif(
    not _namespaces_work(), reason="needs a network namespace (unshare -n) for ports 8000/8001"
)


def _run(example: str) -> str:
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}"}
    done = subprocess.run(
        [
            "unshare",
            "-n",
            "sh",
            "-c",
            f'ip link set lo up && exec "$0" "$1" {example}',
            sys.executable,
            str(RUNNER),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=TIMEOUT_S,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    return output


def _logged(output: str, label: str) -> object:
    match = re.search(rf"client: {label}: (.+)$", output, re.MULTILINE)
    assert match, f"no '{label}' in the client's output:\n{output}"
    return ast.literal_eval(match.group(1))


def test_add_sub_python_runs_as_written() -> None:
    output = _run("add_sub_python")
    assert _logged(output, "add") == [[2.0], [2.0]]
    assert _logged(output, "sub") == [[0.0], [0.0]]


def test_identity_python_runs_as_written() -> None:
    output = _run("identity_python")
    sent = _logged(output, "INPUT_1")
    assert _logged(output, "OUTPUT_1") == sent
    assert _logged(output, "OUTPUT_2") == [[b"\xff\x00\x00\x00"]] * 4


def test_add_sub_python_with_optional_runs_as_written() -> None:
    output = _run("add_sub_python_with_optional")
    adds = [ast.literal_eval(m) for m in re.findall(r"client: add: (.+)$", output, re.M)]
    subs = [ast.literal_eval(m) for m in re.findall(r"client: sub: (.+)$", output, re.M)]
    # a = b = 1; t defaults to 2 (fill_optionals), w to 1; the client then sends w=3, t=5, both.
    assert adds == [[[4.0]] * 2, [[6.0]] * 2, [[7.0]] * 2, [[9.0]] * 2]
    assert subs == [[[2.0]] * 2, [[4.0]] * 2, [[5.0]] * 2, [[7.0]] * 2]
