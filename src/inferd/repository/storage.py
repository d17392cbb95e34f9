"""Where model folders come from: one small interface, one module per scheme.

A ``Storage`` lists the model folders of one repository with a stamp per file (size plus
modification time or ETag), so a poll can tell what changed, and hands back a local folder
for a model (a remote store copies the changed files into a local cache first). It also
writes: small files beside a model's config (``routing.json``) and whole model folders
(uploads), so every replica reading the same store sees the same models and routing. Every
method blocks: the control plane calls them on worker threads, never on the request path.
Each scheme is a module of its own (``local``, ``s3``); ``schemes.open_storage`` picks one.
"""

from __future__ import annotations

import hashlib
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from inferd.core.errors import InferdError, InvalidInput, Unavailable

# One file's stamp: (size in bytes, tag); the tag is the mtime in ns locally, the ETag on S3.
Stamp = tuple[int, str]
# A model folder's files: path relative to the folder ("1/model.onnx") -> stamp.
ModelFiles = dict[str, Stamp]
# A model folder holding this file is being written by another server (an upload to a store
# that cannot rename folders): readers leave the model as it is until the file goes away.
WRITING_MARKER = ".inferd-writing"
# The record of the model's files the server received from the network
# (``inferd.repository.provenance``): a hidden name, yet listed and copied like the model's files.
PROVENANCE_FILE = ".inferd-provenance.json"


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

    def read(self, rel: str) -> bytes | None:
        """A small file of the repository (``model/routing.json``); None when it is absent."""
        ...

    def write(self, rel: str, data: bytes) -> None:
        """Write a small file of the repository in one step (readers see old or new)."""
        ...

    def remove(self, rel: str) -> None:
        """Remove one file of the repository (nothing happens when it is absent)."""
        ...

    def staging_dir(self) -> Path:
        """A local folder where a model is staged before ``put_model`` (on the same file
        system as the repository when it is local, so putting it is a rename)."""
        ...

    def put_model(self, name: str, folder: Path) -> ModelFiles:
        """Replace the model folder ``name`` with the local ``folder`` (which it may move);
        returns the model's files as the repository now stamps them."""
        ...


@dataclass(frozen=True, slots=True)
class StorageOptions:
    """Settings shared by the remote schemes."""

    cache_dir: str = ""  # "" : a folder under the system's temp dir, one per repository
    cache_max_bytes: int = 0  # lazy serving: the cache is trimmed to this size (0: no bound)
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


def is_listed(rel: str) -> bool:
    """Whether a path in a model folder is one of the model's files: no hidden part, or the
    provenance record at the folder's top."""
    return rel == PROVENANCE_FILE or not any(is_hidden(p) for p in rel.split("/"))


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
