"""Local folders as model repositories: models are loaded in place, stamped by size and mtime."""

from __future__ import annotations

import os
from pathlib import Path

from inferd.repository.storage import ModelFiles, StorageError, is_hidden


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
