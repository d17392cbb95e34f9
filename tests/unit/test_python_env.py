"""EXECUTION_ENV_PATH: an interpreter, an environment folder, a packed environment."""

from __future__ import annotations

import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from inferd.backends.python.env import interpreter_for
from inferd.core.errors import ConfigError


def _venv(where: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True)
    return where


def test_an_environment_folder_gives_its_python(tmp_path: Path) -> None:
    venv = _venv(tmp_path / "model" / "env")
    python = interpreter_for("$$TRITON_MODEL_DIRECTORY/env", tmp_path / "model")
    assert python == str(venv / "bin" / "python3")
    assert interpreter_for("env", tmp_path / "model") == python  # relative to the model
    assert interpreter_for(python, tmp_path) == python
    assert interpreter_for("", tmp_path) == ""


def test_a_packed_environment_is_unpacked_once(tmp_path: Path) -> None:
    venv = _venv(tmp_path / "env")
    archive = tmp_path / "model" / "env.tar.gz"
    archive.parent.mkdir()
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(venv, arcname="env")
    cache = tmp_path / "cache"
    python = interpreter_for("$$TRITON_MODEL_DIRECTORY/env.tar.gz", tmp_path / "model", cache)
    assert python.startswith(str(cache)) and python.endswith("env/bin/python3")
    out = subprocess.run([python, "-c", "import sys; print(sys.prefix)"], capture_output=True)
    assert out.stdout.decode().strip() == str(Path(python).parent.parent)
    again = interpreter_for("$$TRITON_MODEL_DIRECTORY/env.tar.gz", tmp_path / "model", cache)
    assert again == python


def test_paths_that_are_not_a_python(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="no bin/python3"):
        interpreter_for(str(tmp_path / "empty"), tmp_path)
    with pytest.raises(ConfigError, match="does not exist"):
        interpreter_for("missing", tmp_path)
    with pytest.raises(ConfigError, match="is not a Python interpreter"):
        interpreter_for("/bin/sh", tmp_path)
