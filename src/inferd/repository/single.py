"""One model's folder as the whole repository (``--model-name``): the layout KServe's storage
initializer gives a single model in ``/mnt/models``, and TF Serving's ``--model_base_path``.

The folder holds numbered version folders (``1/model.onnx``; TF Serving's ``0001/``), or the
model's files themselves (``model.joblib``, as KServe's scikit-learn server takes it), which are
then version 1. It is read in place; a folder of files is seen through a view, a folder whose
``1`` and other entries link to it, so the rest of the repository code sees a model folder.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import weakref
from pathlib import Path

from inferd.core.errors import InvalidInput
from inferd.repository.layout import version_dirs
from inferd.repository.local import LocalStorage, folder_files
from inferd.repository.storage import ModelFiles, StorageError, is_hidden

# Files of a folder of files that stay beside the version (they are the model's, not its
# version's): the config, and the routing the admin API writes.
SHARED = frozenset({"config.pbtxt", "routing.json"})


class SingleModelStorage:
    """A local folder holding one model, named ``name``."""

    def __init__(self, root: Path, name: str) -> None:
        self.root = root
        self.name = name
        self.uri = str(root)
        self._local = LocalStorage(root)  # reads and writes of the model's own files
        self._views = Path(tempfile.mkdtemp(prefix="inferd-model-"))
        weakref.finalize(self, shutil.rmtree, self._views, ignore_errors=True)

    def _versioned(self) -> bool:
        try:
            return bool(version_dirs(self.root))
        except OSError as exc:
            raise StorageError(f"cannot read model folder '{self.root}': {exc}") from None

    def scan(self) -> dict[str, ModelFiles]:
        files = self.scan_model(self.name)
        return {self.name: files} if files else {}

    def scan_model(self, name: str) -> ModelFiles | None:
        if name != self.name:
            return None
        if not self.root.is_dir():
            raise StorageError(f"model folder '{self.root}' is not a directory")
        try:
            files = folder_files(self.root)
        except OSError as exc:
            raise StorageError(f"cannot read model folder '{self.root}': {exc}") from None
        if self._versioned():
            return files
        return {rel if rel in SHARED else f"1/{rel}": stamp for rel, stamp in files.items()}

    def fetch(self, name: str, files: ModelFiles) -> Path:
        if self._versioned():
            return self.root
        # A fresh view each load: 1 -> the folder, and every entry of the folder beside it
        # (the config, the files a config names: labels, warmup data).
        view = self._views / f"{len(os.listdir(self._views))}" / name
        try:
            view.mkdir(parents=True)
            (view / "1").symlink_to(self.root.resolve(), target_is_directory=True)
            for entry in self.root.iterdir():
                if not is_hidden(entry.name) and entry.name != "1":
                    (view / entry.name).symlink_to(entry.resolve())
        except OSError as exc:
            raise StorageError(f"cannot read model folder '{self.root}': {exc}") from None
        return view

    def _rel(self, rel: str) -> str | None:
        """A repository path (``name/file``) as a path in the folder; None: another model's."""
        head, _, tail = rel.partition("/")
        return tail if head == self.name and tail else None

    def read(self, rel: str) -> bytes | None:
        inside = self._rel(rel)
        return None if inside is None else self._local.read(inside)

    def write(self, rel: str, data: bytes) -> None:
        self._local.write(self._inside(rel), data)

    def remove(self, rel: str) -> None:
        inside = self._rel(rel)
        if inside is not None:
            self._local.remove(inside)

    def _inside(self, rel: str) -> str:
        inside = self._rel(rel)
        if inside is None:
            raise InvalidInput(f"this server serves one model, '{self.name}' (--model-name)")
        return inside

    def _no_uploads(self) -> InvalidInput:
        return InvalidInput(
            f"this server serves one model, '{self.name}', from its folder (--model-name): "
            "it takes no uploads"
        )

    def staging_dir(self) -> Path:
        raise self._no_uploads()

    def put_model(self, name: str, folder: Path) -> ModelFiles:
        raise self._no_uploads()
