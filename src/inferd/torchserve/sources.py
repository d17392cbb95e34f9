"""Where a TorchServe registration's archive comes from: the model store, S3 or HTTP(S).

A registration's ``url`` is, as in TorchServe, a file name in the model store (``mnist.mar``,
or a ``no-archive`` folder; only its last path part counts), an ``s3://bucket/key``, or an
``http(s)://`` URL, which is fetched only when it matches one of the operator's
``--allowed-urls`` patterns. What the archive may run follows from where it came from
(``inferd.security.trust``): an archive of the model store that was there at start counts as present
at start, a later one or one from S3 as arrived in a repository, a download as sent through
the API. Everything here blocks: callers run it on a worker thread.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from inferd.backends.torchserve import archive
from inferd.repository.schemes import open_storage
from inferd.repository.storage import StorageError, StorageOptions
from inferd.security.trust import Origin
from inferd.torchserve.errors import TorchServeError

log = logging.getLogger("inferd.torchserve")

DOWNLOAD_TIMEOUT_S = 60.0
Stamp = tuple[tuple[str, int, int], ...]


def not_found(message: str) -> TorchServeError:
    return TorchServeError(404, "ModelNotFoundException", message)


@dataclass(frozen=True, slots=True)
class Source:
    """A registration's archive, on local disk: a ``.mar`` file or a folder."""

    url: str
    path: Path
    origin: Origin
    temporary: bool = False  # a download: removed once registered

    @property
    def default_name(self) -> str:
        """The model name when neither the call nor the manifest gives one."""
        name = self.path.name
        return name[: -len(archive.SUFFIX)] if name.endswith(archive.SUFFIX) else name

    def files(self) -> dict[str, bytes]:
        """What goes into the version folder: the ``.mar`` as one file, or the folder's files."""
        if self.path.is_file():
            name = self.path.name if self.path.name.endswith(archive.SUFFIX) else "model.mar"
            return {name: self.path.read_bytes()}
        found: dict[str, bytes] = {}
        for top, _, names in os.walk(self.path):
            for name in names:
                full = Path(top) / name
                found[full.relative_to(self.path).as_posix()] = full.read_bytes()
        return found

    def discard(self) -> None:
        if self.temporary:
            shutil.rmtree(self.path.parent, ignore_errors=True)


def _stamp(path: Path) -> Stamp:
    if path.is_file():
        st = path.stat()
        return (("", st.st_size, st.st_mtime_ns),)
    entries: list[tuple[str, int, int]] = []
    for top, _, names in os.walk(path):
        for name in names:
            full = Path(top) / name
            st = full.stat()
            entries.append((full.relative_to(path).as_posix(), st.st_size, st.st_mtime_ns))
    return tuple(sorted(entries))


class ModelStore:
    """The operator's folder of archives (``--model-store``) and the other places a
    registration may name."""

    def __init__(
        self,
        folder: Path | None,
        allowed_urls: list[str],
        options: StorageOptions,
        max_bytes: int,
    ) -> None:
        self.folder = folder
        self.allowed = [re.compile(p, re.IGNORECASE) for p in allowed_urls]
        self.options = options
        self.max_bytes = max_bytes
        # The archives present at start, and how they were then: those count as the
        # operator's own (present at start) as long as they stay so.
        self._at_start: dict[str, Stamp] = {}
        if folder is not None and folder.is_dir():
            for entry in folder.iterdir():
                if not entry.name.startswith(".") and archive.is_archive(entry):
                    self._at_start[entry.name] = _stamp(entry)

    def archives(self) -> list[str]:
        """Every archive of the model store (``--models all``)."""
        if self.folder is None or not self.folder.is_dir():
            return []
        return sorted(
            e.name
            for e in self.folder.iterdir()
            if not e.name.startswith(".") and archive.is_archive(e)
        )

    def resolve(self, url: str) -> Source:
        """The archive ``url`` names, fetched to local disk if it is remote."""
        if not url:
            raise not_found("empty url")
        scheme, sep, _ = url.partition("://")
        scheme = scheme.lower() if sep else ""
        if scheme in ("http", "https"):
            return self._download(url)
        if scheme == "s3":
            return self._from_s3(url)
        if ".." in url:
            raise not_found(f"Relative path is not allowed in url: {url}")
        if self.folder is None:
            raise not_found("Model store has not been configured.")
        name = PurePosixPath(url[len("file://") :] if scheme == "file" else url).name
        path = self.folder / name
        if not name or not path.exists():
            raise not_found(f"Model not found at: {url}")
        if not archive.is_archive(path):
            raise TorchServeError(
                400, "InvalidModelException", f"{url} is not a TorchServe model archive"
            )
        trusted = self._at_start.get(name) == _stamp(path)
        return Source(url, path, Origin.STARTUP if trusted else Origin.REPOSITORY)

    def _temporary(self, url: str) -> Path:
        folder = Path(tempfile.mkdtemp(prefix="inferd-mar-"))
        name = PurePosixPath(url.split("?", 1)[0]).name or "model.mar"
        return folder / name

    def _download(self, url: str) -> Source:
        if not any(p.fullmatch(url) for p in self.allowed):
            log.warning("not fetching %s: no --allowed-urls pattern matches it", url)
            raise not_found(f"Given URL {url} does not match any allowed URL(s)")
        path = self._temporary(url)
        try:
            with (
                urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT_S) as answer,
                open(path, "wb") as out,
            ):
                size = 0
                while chunk := answer.read(1 << 20):
                    size += len(chunk)
                    if size > self.max_bytes:
                        raise OSError(f"over {self.max_bytes} bytes (--max-upload-bytes)")
                    out.write(chunk)
        except (OSError, urllib.error.URLError, ValueError):
            shutil.rmtree(path.parent, ignore_errors=True)
            raise TorchServeError(
                400, "DownloadArchiveException", f"Failed to download archive from: {url}"
            ) from None
        return Source(url, path, Origin.API, temporary=True)

    def _from_s3(self, url: str) -> Source:
        parent, _, name = url.rpartition("/")
        if not name or parent.endswith(":/"):
            raise not_found(f"Model not found at: {url}")
        try:
            data = open_storage(parent, self.options).read(name)
        except StorageError as exc:
            raise TorchServeError(
                400, "DownloadArchiveException", f"Failed to download archive from: {url}"
            ) from exc
        if data is None:
            raise not_found(f"Model not found at: {url}")
        path = self._temporary(url)
        path.write_bytes(data)
        return Source(url, path, Origin.REPOSITORY, temporary=True)
