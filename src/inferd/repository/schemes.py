"""The scheme table: a ``--model-repository`` value (a folder, ``file://`` or ``s3://``) to its
Storage."""

from __future__ import annotations

from pathlib import Path

from inferd.core.errors import ConfigError
from inferd.repository.local import LocalStorage
from inferd.repository.storage import Storage, StorageOptions


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
