"""Where model folders come from: one small interface, one module per scheme.

A ``Storage`` lists the model folders of one repository with a stamp per file (size plus
modification time or ETag), so a poll can tell what changed, and hands back a local folder
for a model (a remote store copies the changed files into a local cache first). Every method
blocks: the manager calls them through ``asyncio.to_thread``. Each scheme is a module of its
own (``local``, ``s3``); ``schemes.open_storage`` picks one for a ``--model-repository`` value.
"""

from __future__ import annotations

import hashlib
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from inferd.errors import InferdError, InvalidInput, Unavailable

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


def version_files(files: ModelFiles) -> tuple[dict[int, ModelFiles], ModelFiles]:
    """Split a model's files into its numbered versions and the rest (config, warmup data)."""
    versions: dict[int, ModelFiles] = {}
    shared: ModelFiles = {}
    for rel, stamp in files.items():
        head, sep, tail = rel.partition("/")
        if sep and head.isdecimal() and int(head) > 0:
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
