"""Which Python runs a model's workers: the config parameter ``EXECUTION_ENV_PATH``.

As in Triton, the value may start with ``$$TRITON_MODEL_DIRECTORY`` (the model's folder) and
may name a packed environment (``.tar.gz``, ``.tgz``, ``.tar``, as conda-pack makes them),
unpacked once into a cache folder. It may also name an environment folder (a venv, a conda
env: its ``bin/python3``) or an interpreter. A relative path is relative to the model's folder.
"""

from __future__ import annotations

import hashlib
import os
import re
import tarfile
import tempfile
import threading
from pathlib import Path

from inferd.core.errors import ConfigError

ENV_PARAMETER = "EXECUTION_ENV_PATH"
MODEL_DIRECTORY = "$$TRITON_MODEL_DIRECTORY"
ARCHIVES = (".tar.gz", ".tgz", ".tar")
_PYTHON_NAME = re.compile(r"python[0-9.]*$")
_unpacking = threading.Lock()


def interpreter_for(value: str, model_dir: Path, cache_dir: Path | None = None) -> str:
    """The interpreter a model's ``EXECUTION_ENV_PATH`` names ("" for the server's own)."""
    if not value:
        return ""
    path = Path(value.replace(MODEL_DIRECTORY, str(model_dir)))
    if not path.is_absolute():
        path = model_dir / path
    if path.name.endswith(ARCHIVES) and path.is_file():
        path = _root(_unpacked(path, cache_dir or Path(tempfile.gettempdir()) / "inferd-envs"))
    if path.is_dir():
        for name in ("bin/python3", "bin/python"):
            if (path / name).is_file():
                return str(path / name)
        raise ConfigError(f"{ENV_PARAMETER} {value}: no bin/python3 in {path}")
    if not path.is_file():
        raise ConfigError(f"{ENV_PARAMETER} {value}: {path} does not exist")
    if not _PYTHON_NAME.match(path.name) or not os.access(path, os.X_OK):
        raise ConfigError(f"{ENV_PARAMETER} {value}: {path} is not a Python interpreter")
    return str(path)


def _unpacked(archive: Path, cache_dir: Path) -> Path:
    """The archive's content in ``cache_dir``, unpacked once per archive path and version."""
    stat = archive.stat()
    key = hashlib.sha256(f"{archive.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    target = cache_dir / key.hexdigest()[:16]
    with _unpacking:
        if (target / ".unpacked").exists():
            return target
        target.mkdir(parents=True, exist_ok=True)
        try:
            with tarfile.open(archive) as tar:
                tar.extractall(target, filter="tar")
        except (OSError, tarfile.TarError) as exc:
            raise ConfigError(f"{ENV_PARAMETER}: cannot unpack {archive}: {exc}") from None
        (target / ".unpacked").touch()
    return target


def _root(path: Path) -> Path:
    """An unpacked environment's root: the folder itself, or its one top-level folder."""
    if (path / "bin").is_dir():
        return path
    folders = [p for p in path.iterdir() if p.is_dir()]
    return folders[0] if len(folders) == 1 else path
