"""Writing models into a local repository: safe archive extraction, validation, atomic install.

An upload is extracted into a hidden staging folder beside its target (``.upload-*``, which
the repository scan ignores), checked (paths, file kinds, size, config, versions), and only
then renamed into place; the folder it replaces moves aside until the new model has loaded,
so a failed upload can be undone and never leaves anything half-written. A streamed upload is
first written to a file in the staging folder as it arrives (``spool``). Every other function
blocks: callers run them through ``asyncio.to_thread``.
"""

from __future__ import annotations

import asyncio
import errno
import io
import os
import re
import shutil
import stat
import tarfile
import uuid
import zipfile
import zlib
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import IO

from inferd.core.errors import ConfigError, InvalidInput, PayloadTooLarge
from inferd.repository.config import read_config
from inferd.repository.layout import version_dirs
from inferd.repository.storage import check_relative

MAX_MEMBERS = 100_000  # files and folders in one archive
_CHUNK_BYTES = 1 << 20
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*\Z")
STAGING_PREFIX = ".upload-"
ARCHIVE_FILE = "archive"  # a streamed upload, in its staging folder
SPOOL_BYTES = 4 << 20  # a streamed upload is written in pieces of about this size


# OSErrors that a path sent by the client causes, and what to tell it (a 400, never a 500);
# any other OSError (a full disk, permissions) is the server's own trouble.
_CLIENT_ERRNOS = {
    errno.ENAMETOOLONG: "a file or folder name is too long (at most 255 bytes each)",
    errno.EISDIR: "a file and a folder at the same path",
    errno.ENOTDIR: "a file and a folder at the same path",
    errno.EEXIST: "a file and a folder at the same path",
    errno.ELOOP: "too many levels of folders or links",
    errno.EINVAL: "a file name the file system does not take",
    errno.EILSEQ: "a file name the file system does not take",
}


def client_path_error(exc: OSError, what: str) -> InvalidInput:
    """The 400 for an OSError that ``what`` (a path the client sent) caused; re-raises
    ``exc`` when the client is not the cause."""
    problem = _CLIENT_ERRNOS.get(exc.errno or 0)
    if problem is None:
        raise exc
    return InvalidInput(f"{what}: {problem}")


def shorten(text: str, keep: int = 80) -> str:
    """A name as an error message repeats it: at most ``keep`` characters, and its length."""
    return text if len(text) <= keep else f"{text[:keep]}... ({len(text)} characters)"


def check_model_name(name: str) -> str:
    """A model name that is also a safe folder name."""
    if not _NAME.match(name) or len(name) > 255:
        raise InvalidInput(
            f"model name '{name}' must start with a letter, digit or '_' and hold only letters, "
            "digits, '_', '.', '-'"
        )
    return name


def archive_kind(data: bytes) -> str:
    """``zip`` or ``tar`` (plain, gzip, bzip2 or xz), from the first bytes (262 suffice)."""
    if data[:4] in (b"PK\x03\x04", b"PK\x05\x06"):
        return "zip"
    if data[:2] == b"\x1f\x8b" or data[:3] == b"BZh" or data[:6] == b"\xfd7zXZ\x00":
        return "tar"
    if data[257:262] == b"ustar":
        return "tar"
    raise InvalidInput("the body is not a .tar.gz, .tar or .zip archive")


class _Budget:
    """Counts extracted bytes and entries against the limits."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.used_bytes = 0
        self.members = 0

    def member(self) -> None:
        self.members += 1
        if self.members > MAX_MEMBERS:
            raise InvalidInput(f"the archive has more than {MAX_MEMBERS} entries")

    def take(self, size: int, name: str) -> None:
        self.used_bytes += size
        if self.used_bytes > self.max_bytes:
            raise PayloadTooLarge(
                f"the archive extracts to more than {self.max_bytes} bytes (at '{name}'; "
                "--max-upload-bytes)"
            )


def _member_path(raw: str) -> str | None:
    """The cleaned relative path of an archive entry; None for the archive's root itself."""
    name = raw
    while name.startswith("./"):
        name = name[2:]
    name = name.rstrip("/")
    if name in ("", "."):
        return None
    return check_relative(name, f"archive entry '{raw}'")


def _copy(src: IO[bytes], target: Path, budget: _Budget, name: str) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target, "wb") as dst:
        while chunk := src.read(_CHUNK_BYTES):
            budget.take(len(chunk), name)
            dst.write(chunk)


def _open_tar(data: bytes | Path) -> tarfile.TarFile:
    if isinstance(data, Path):
        return tarfile.open(name=data, mode="r:*")
    return tarfile.open(fileobj=io.BytesIO(data), mode="r:*")


def _extract_tar(data: bytes | Path, dest: Path, budget: _Budget) -> None:
    with _open_tar(data) as tar:
        for member in tar:
            budget.member()
            rel = _member_path(member.name)
            if member.issym() or member.islnk():
                raise InvalidInput(
                    f"archive entry '{member.name}' is a link; links are not allowed"
                )
            if member.isdev() or member.isfifo():
                raise InvalidInput(f"archive entry '{member.name}' is a device or FIFO file")
            if rel is None:
                continue
            if member.isdir():
                (dest / rel).mkdir(parents=True, exist_ok=True)
                continue
            if not member.isfile():
                raise InvalidInput(f"archive entry '{member.name}' is not a regular file")
            src = tar.extractfile(member)
            if src is None:
                raise InvalidInput(f"archive entry '{member.name}' has no data")
            with src:
                _copy(src, dest / rel, budget, member.name)


def _extract_zip(data: bytes | Path, dest: Path, budget: _Budget) -> None:
    with zipfile.ZipFile(data if isinstance(data, Path) else io.BytesIO(data)) as archive:
        for info in archive.infolist():
            budget.member()
            mode = info.external_attr >> 16
            if stat.S_ISLNK(mode):
                raise InvalidInput(
                    f"archive entry '{info.filename}' is a link; links are not allowed"
                )
            if (
                stat.S_ISCHR(mode)
                or stat.S_ISBLK(mode)
                or stat.S_ISFIFO(mode)
                or stat.S_ISSOCK(mode)
            ):
                raise InvalidInput(f"archive entry '{info.filename}' is a device or FIFO file")
            rel = _member_path(info.filename)
            if rel is None:
                continue
            if info.is_dir():
                (dest / rel).mkdir(parents=True, exist_ok=True)
                continue
            with archive.open(info) as src:
                _copy(src, dest / rel, budget, info.filename)


def extract_archive(data: bytes | Path, dest: Path, max_bytes: int) -> None:
    """Extract a model archive (its bytes, or a file holding it) into the empty folder
    ``dest``; any unsafe entry is an error."""
    size = data.stat().st_size if isinstance(data, Path) else len(data)
    if size > max_bytes:
        raise PayloadTooLarge(
            f"the archive has {size} bytes, over the limit of {max_bytes} (--max-upload-bytes)"
        )
    if isinstance(data, Path):
        with open(data, "rb") as f:
            kind = archive_kind(f.read(512))
    else:
        kind = archive_kind(data)
    budget = _Budget(max_bytes)
    try:
        if kind == "zip":
            _extract_zip(data, dest, budget)
        else:
            _extract_tar(data, dest, budget)
    except (tarfile.TarError, zipfile.BadZipFile, EOFError, zlib.error) as exc:
        raise InvalidInput(f"the {kind} archive is corrupt: {exc}") from None
    except OSError as exc:
        entry = os.path.relpath(exc.filename, dest) if isinstance(exc.filename, str) else ""
        raise client_path_error(exc, f"archive entry '{shorten(entry)}'") from None


async def spool(chunks: AsyncIterator[bytes], path: Path) -> int:
    """Write a streamed body to ``path`` as it arrives, a few MiB at a time on a worker
    thread (the only async function here); returns the bytes written."""
    total = 0
    with open(path, "wb") as f:  # opening is quick; writes go to a thread
        pending: list[bytes] = []
        held = 0
        async for chunk in chunks:
            pending.append(chunk)
            held += len(chunk)
            if held >= SPOOL_BYTES:
                await asyncio.to_thread(f.writelines, pending)
                total += held
                pending, held = [], 0
        if pending:
            await asyncio.to_thread(f.writelines, pending)
            total += held
    if total == 0:
        raise InvalidInput("the body is empty: send a .tar.gz or .zip of the model folder")
    return total


def write_files(files: Mapping[str, bytes], dest: Path, max_bytes: int) -> None:
    """Write ``{relative path: contents}`` (the load call's ``file:`` parameters) into ``dest``."""
    budget = _Budget(max_bytes)
    for raw, content in files.items():
        rel = check_relative(raw, f"file parameter 'file:{raw}'")
        budget.take(len(content), raw)
        target = dest / rel
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(content)
        except OSError as exc:
            raise client_path_error(exc, f"file parameter 'file:{shorten(raw)}'") from None


def model_root(extracted: Path) -> Path:
    """The model folder in an extracted archive: its root, or its one top-level folder when
    the archive was made from the folder itself (``tar czf m.tgz m``)."""
    entries = [e for e in extracted.iterdir() if not e.name.startswith(".")]
    if len(entries) == 1 and entries[0].is_dir() and not entries[0].name.isdecimal():
        return entries[0]
    return extracted


def validate_model(folder: Path, name: str) -> None:
    """The checks an uploaded model passes before it is written: config and versions."""
    try:
        read_config(folder)
    except ConfigError as exc:
        raise InvalidInput(f"model '{name}': {exc.message}") from None
    if not version_dirs(folder):
        raise InvalidInput(
            f"model '{name}' has no version folder (expected 1/<model file> in the upload)"
        )


def new_staging(root: Path) -> Path:
    """A fresh hidden folder in the repository (same file system, so renames are atomic)."""
    staging = root / f"{STAGING_PREFIX}{uuid.uuid4().hex[:12]}"
    staging.mkdir()
    return staging


def stage_archive(data: bytes | Path, staging: Path, name: str, max_bytes: int) -> Path:
    """Extract and validate an upload; returns the model folder, named ``name``, in staging."""
    extracted = staging / "extracted"
    extracted.mkdir()
    extract_archive(data, extracted, max_bytes)
    folder = model_root(extracted)
    staged = staging / name
    folder.rename(staged)
    validate_model(staged, name)
    return staged


def install(staged: Path, target: Path) -> Path | None:
    """Rename the staged folder into place; the folder it replaces moves into staging."""
    previous: Path | None = None
    if target.exists() or target.is_symlink():
        previous = staged.parent / "previous"
        os.rename(target, previous)
    os.rename(staged, target)
    return previous


def restore(target: Path, previous: Path | None, staging: Path) -> None:
    """Undo ``install``: the new folder goes back to staging, the previous one into place."""
    os.rename(target, staging / "failed")
    if previous is not None:
        os.rename(previous, target)


def remove_tree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
