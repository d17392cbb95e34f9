"""Where model folders come from: one small interface, one module per scheme.

A ``Storage`` lists the model folders of one repository with a stamp per file (size plus
modification time or ETag), so a poll can tell what changed, and hands back a local folder
for a model (a remote store copies the changed files into a local cache first). Every method
blocks: the manager calls them through ``asyncio.to_thread``. ``local`` lives here and
``s3://`` in ``inferd.repository.s3``.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from inferd.errors import ConfigError, InferdError, InvalidInput, Unavailable

# One file's stamp: (size in bytes, tag); the tag is the mtime in ns locally, the ETag on S3.
Stamp = tuple[int, str]
# A model folder's files: path relative to the folder ("1/model.onnx") -> stamp.
ModelFiles = dict[str, Stamp]


class StorageError(Unavailable):
    """The repository cannot be read (store unreachable, permission denied, ...)."""


class Storage(Protocol):
    uri: str  # as given on the command line, for messages

    def scan(self) -> dict[str, ModelFiles]:
        """Every model folder of the repository and its files (StorageError if unreadable)."""
        ...

    def scan_model(self, name: str) -> ModelFiles | None:
        """One model folder's files; None when the repository has no such folder."""
        ...

    def fetch(self, name: str, files: ModelFiles) -> Path:
        """A local folder holding the model's ``files`` (copied first if the store is remote)."""
        ...


@dataclass(frozen=True, slots=True)
class StorageOptions:
    """Settings shared by the remote schemes."""

    cache_dir: str = ""  # "" : a folder under the system's temp dir, one per repository
    s3_endpoint_url: str = ""
    s3_access_key_id: str = ""
    s3_secret_access_key: str = ""
    s3_region: str = ""
    s3_addressing_style: str = "auto"

    def cache_for(self, uri: str) -> Path:
        """The local cache folder of one remote repository."""
        if self.cache_dir:
            root = Path(self.cache_dir)
        else:
            root = Path(tempfile.gettempdir()) / "inferd-model-cache"
        key = hashlib.sha256(f"{self.s3_endpoint_url}|{uri}".encode()).hexdigest()[:16]
        return root / key


def is_hidden(name: str) -> bool:
    return name.startswith(".")


def open_storage(uri: str, options: StorageOptions) -> Storage:
    """The storage for a ``--model-repository`` value: a folder or ``s3://bucket/prefix``."""
    scheme, sep, _ = uri.partition("://")
    if not sep:
        return LocalStorage(Path(uri))
    if scheme == "s3":
        from inferd.repository.s3 import S3Storage

        return S3Storage(uri, options)
    if scheme == "file":
        return LocalStorage(Path(uri[len("file://") :]))
    raise ConfigError(
        f"model repository '{uri}': unknown scheme '{scheme}://' (use a folder or s3://)"
    )


class LocalStorage:
    """A folder on local disk; models are loaded in place."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.uri = str(root)

    def scan(self) -> dict[str, ModelFiles]:
        if not self.root.is_dir():
            raise StorageError(f"model repository '{self.root}' is not a directory")
        try:
            entries = sorted(self.root.iterdir())
            return {e.name: _walk(e) for e in entries if not is_hidden(e.name) and e.is_dir()}
        except OSError as exc:
            raise StorageError(f"cannot read model repository '{self.root}': {exc}") from None

    def scan_model(self, name: str) -> ModelFiles | None:
        folder = self.root / name
        if not folder.is_dir():
            if not self.root.is_dir():
                raise StorageError(f"model repository '{self.root}' is not a directory")
            return None
        try:
            return _walk(folder)
        except OSError as exc:
            raise StorageError(f"cannot read model folder '{folder}': {exc}") from None

    def fetch(self, name: str, files: ModelFiles) -> Path:
        return self.root / name


def _walk(folder: Path) -> ModelFiles:
    """Stamps of every file under ``folder`` (hidden names skipped; links followed)."""
    files: ModelFiles = {}
    for top, dirs, names in os.walk(folder, followlinks=True):
        dirs[:] = sorted(d for d in dirs if not is_hidden(d))
        rel_top = os.path.relpath(top, folder)
        for name in sorted(names):
            if is_hidden(name):
                continue
            path = os.path.join(top, name)
            try:
                st = os.stat(path)
            except FileNotFoundError:  # removed while we looked, or a dangling link
                continue
            rel = name if rel_top == "." else f"{rel_top}/{name}".replace(os.sep, "/")
            files[rel] = (st.st_size, str(st.st_mtime_ns))
    return files


def version_files(files: ModelFiles) -> tuple[dict[int, ModelFiles], ModelFiles]:
    """Split a model's files into its numbered versions and the rest (config, warmup data)."""
    versions: dict[int, ModelFiles] = {}
    shared: ModelFiles = {}
    for rel, stamp in files.items():
        head, sep, tail = rel.partition("/")
        if sep and head.isdigit() and int(head) > 0:
            versions.setdefault(int(head), {})[tail] = stamp
        else:
            shared[rel] = stamp
    return versions, shared


def check_relative(rel: str, where: str) -> str:
    """A relative path that stays inside its folder, or InvalidInput naming it."""
    parts = rel.replace("\\", "/").split("/")
    if rel.startswith(("/", "\\")) or (len(rel) > 1 and rel[1] == ":"):
        raise InvalidInput(f"{where}: absolute path '{rel}' is not allowed")
    if any(p == ".." for p in parts):
        raise InvalidInput(f"{where}: path '{rel}' leaves its folder ('..')")
    if not rel or any(p in ("", ".") for p in parts):
        raise InvalidInput(f"{where}: path '{rel}' is empty or has an empty part")
    return "/".join(parts)


def describe(exc: BaseException) -> str:
    return exc.message if isinstance(exc, InferdError) else f"{type(exc).__name__}: {exc}"
