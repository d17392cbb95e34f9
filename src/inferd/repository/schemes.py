"""The scheme table: a ``--model-repository`` value (a folder, ``file://`` or ``s3://``) to its
Storage; and the check at start that every folder among them can be read."""

from __future__ import annotations

from pathlib import Path

from inferd.core.errors import ConfigError
from inferd.repository.local import LocalStorage
from inferd.repository.storage import Storage, StorageError, StorageOptions


def local_folder(uri: str) -> Path | None:
    """The folder a ``--model-repository`` value names (None: a remote scheme)."""
    scheme, sep, _ = uri.partition("://")
    if not sep:
        return Path(uri)
    return Path(uri[len("file://") :]) if scheme == "file" else None


def open_storage(uri: str, options: StorageOptions) -> Storage:
    """The storage for a ``--model-repository`` value: a folder or ``s3://bucket/prefix``."""
    folder = local_folder(uri)
    if folder is not None:
        return LocalStorage(folder)
    scheme = uri.partition("://")[0]
    if scheme == "s3":
        from inferd.repository.s3 import S3Storage

        return S3Storage(uri, options)
    raise ConfigError(
        f"model repository '{uri}': unknown scheme '{scheme}://' (use a folder or s3://)"
    )


def check_folders(uris: list[str]) -> None:
    """ConfigError naming the repositories that are local folders and cannot be read (the
    remote ones are not asked here: one that does not answer at start serves its cache)."""
    unread: list[str] = []
    for uri in uris:
        folder = local_folder(uri)
        if folder is None:
            continue
        try:
            LocalStorage(folder).check()
        except StorageError as exc:
            unread.append(exc.message)
    if unread:
        raise ConfigError(not_started(unread))


def not_started(reasons: list[str]) -> str:
    """The error of a server that exits at start because these repositories cannot be read."""
    return "; ".join(reasons) + " (--exit-on-error=false starts without it)"
