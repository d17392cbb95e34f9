"""Local folders as model repositories: models are loaded in place, stamped by size and mtime.

Writes are atomic as readers see them: a file is written aside and renamed over the old one,
and a model folder put by an upload is renamed into place (the old one moved aside first).
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import uuid
from pathlib import Path

from inferd.repository.storage import (
    PROVENANCE_FILE,
    ModelFiles,
    StorageError,
    check_relative,
    is_hidden,
)
from inferd.repository.upload import STAGING_PREFIX, install, remove_tree


class LocalStorage:
    """A folder on local disk; models are loaded in place."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.uri = str(root)

    def check(self) -> None:
        """StorageError unless the folder is there and can be listed."""
        if not self.root.is_dir():
            raise StorageError(self._not_a_folder())
        try:
            with os.scandir(self.root):
                pass
        except OSError as exc:
            raise StorageError(f"cannot read model repository '{self.root}': {exc}") from None

    def scan(self) -> dict[str, ModelFiles]:
        if not self.root.is_dir():
            raise StorageError(self._not_a_folder())
        try:
            entries = sorted(self.root.iterdir())
            return {
                e.name: folder_files(e) for e in entries if not is_hidden(e.name) and e.is_dir()
            }
        except OSError as exc:
            raise StorageError(f"cannot read model repository '{self.root}': {exc}") from None

    def scan_model(self, name: str) -> ModelFiles | None:
        folder = self.root / name
        try:
            found = folder.is_dir()
        except OSError as exc:  # a name no folder here can have (too long): no such model
            if exc.errno != errno.ENAMETOOLONG:
                raise StorageError(f"cannot read model folder '{folder}': {exc}") from None
            found = False
        if not found:
            if not self.root.is_dir():
                raise StorageError(self._not_a_folder())
            return None
        try:
            return folder_files(folder)
        except OSError as exc:
            raise StorageError(f"cannot read model folder '{folder}': {exc}") from None

    def _not_a_folder(self) -> str:
        try:
            there = self.root.exists()
        except OSError:
            there = True
        why = "is not a directory" if there else "is not a directory: no such path"
        return f"model repository '{self.root}' {why}"

    def fetch(self, name: str, files: ModelFiles) -> Path:
        return self.root / name

    def _path(self, rel: str) -> Path:
        return self.root / check_relative(rel, f"file in model repository '{self.root}'")

    def read(self, rel: str) -> bytes | None:
        path = self._path(rel)
        try:
            return path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StorageError(f"cannot read '{path}': {exc}") from None

    def write(self, rel: str, data: bytes) -> None:
        path = self._path(rel)
        aside = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            aside.write_bytes(data)
            os.replace(aside, path)
        except OSError as exc:
            with contextlib.suppress(OSError):
                aside.unlink(missing_ok=True)
            raise StorageError(f"cannot write '{path}': {exc}") from None

    def remove(self, rel: str) -> None:
        """Remove a file, and the folders of the repository it leaves empty (a folder of the
        store is a model or a version: an empty one must not stay behind)."""
        path = self._path(rel)
        try:
            path.unlink(missing_ok=True)
        except OSError as exc:
            raise StorageError(f"cannot remove '{path}': {exc}") from None
        folder = path.parent
        while folder != self.root and self.root in folder.parents:
            try:
                folder.rmdir()
            except OSError:
                break  # not empty (or gone): what is above it is not empty either
            folder = folder.parent

    def staging_dir(self) -> Path:
        return self.root

    def put_model(self, name: str, folder: Path) -> ModelFiles:
        target = self._path(name)
        staging = self.root / f"{STAGING_PREFIX}{uuid.uuid4().hex[:12]}"
        try:
            staging.mkdir()
            staged = staging / name
            try:
                os.rename(folder, staged)
            except OSError as exc:
                if exc.errno != errno.EXDEV:
                    raise
                shutil.copytree(folder, staged)  # staged on another file system
            install(staged, target)  # the old folder moves into staging, then goes
            return folder_files(target)
        except OSError as exc:
            raise StorageError(f"cannot write model folder '{target}': {exc}") from None
        finally:
            remove_tree(staging)


def folder_files(folder: Path) -> ModelFiles:
    """Stamps of every file under ``folder`` (hidden names skipped, but the provenance record
    at the top; links followed)."""
    files: ModelFiles = {}
    for top, dirs, names in os.walk(folder, followlinks=True):
        dirs[:] = sorted(d for d in dirs if not is_hidden(d))
        rel_top = os.path.relpath(top, folder)
        for name in sorted(names):
            if is_hidden(name) and not (rel_top == "." and name == PROVENANCE_FILE):
                continue
            path = os.path.join(top, name)
            try:
                st = os.stat(path)
            except FileNotFoundError:  # removed while we looked, or a dangling link
                continue
            rel = name if rel_top == "." else f"{rel_top}/{name}".replace(os.sep, "/")
            files[rel] = (st.st_size, str(st.st_mtime_ns))
    return files
