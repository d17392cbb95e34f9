"""A model's folder in the repository, for the dashboard: its files, versions and config text.

The listing comes from the repository itself (a local folder or S3), loaded or not. File
contents are read from the local folder, or for a remote repository from the local copy that
loading the model made (a remote file that was never fetched is not downloaded for a look).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from inferd.config.text import CONFIG_FILENAME
from inferd.core.errors import InvalidInput, NotFound, PayloadTooLarge, Unavailable
from inferd.repository.local import LocalStorage
from inferd.repository.manager import ModelManager
from inferd.repository.storage import ModelFiles, Stamp, Storage, check_relative

MAX_READ_BYTES = 64 * 1024 * 1024  # largest file the files API hands back
CONFIG_TEXT_BYTES = 1024 * 1024  # config.pbtxt shown inline up to this size
SAMPLE_FILENAME = "sample.json"


def check_name(name: str) -> str:
    if not name or name.startswith(".") or "/" in name or "\\" in name:
        raise InvalidInput(f"'{name}' is not a model name")
    return name


def local_folder(storage: Storage, name: str) -> Path | None:
    """Where a model's files can be read on this machine: the folder itself for a local
    repository, else the local copy a remote scheme keeps in its ``cache`` folder."""
    if isinstance(storage, LocalStorage):
        return storage.root / name
    cache = getattr(storage, "cache", None)
    return cache / name if isinstance(cache, Path) else None


def _read(storage: Storage, name: str, rel: str, stamp: Stamp) -> bytes:
    """One listed file's contents (blocking)."""
    size = stamp[0]
    if size > MAX_READ_BYTES:
        raise PayloadTooLarge(
            f"file '{rel}' of model '{name}' has {size} bytes; the files API hands back at "
            f"most {MAX_READ_BYTES}"
        )
    folder = local_folder(storage, name)
    path = folder / rel if folder is not None else None
    try:
        if path is not None and path.stat().st_size == size:
            return path.read_bytes()
    except OSError:
        pass
    if isinstance(storage, LocalStorage):
        raise NotFound(f"file '{rel}' of model '{name}' changed or vanished; list it again")
    raise Unavailable(
        f"file '{rel}' of model '{name}' is in {storage.uri} and has no local copy yet; it "
        "can be read once the model has been loaded"
    )


def _version_of(rel: str) -> int | None:
    head, sep, _ = rel.partition("/")
    return int(head) if sep and head.isdecimal() and int(head) > 0 else None


def describe_files(files: ModelFiles) -> dict[str, Any]:
    """Files, versions and total size of a model folder's listing."""
    entries: list[dict[str, Any]] = []
    versions: dict[int, dict[str, int]] = {}
    total = 0
    for rel, (size, _) in sorted(files.items()):
        version = _version_of(rel)
        entries.append({"path": rel, "bytes": size, "version": version})
        total += size
        if version is not None:
            found = versions.setdefault(version, {"files": 0, "bytes": 0})
            found["files"] += 1
            found["bytes"] += size
    return {
        "files": entries,
        "versions": [{"version": v, **versions[v]} for v in sorted(versions)],
        "total_bytes": total,
    }


async def list_model(manager: ModelManager, name: str) -> dict[str, Any]:
    """The listing of one model folder, with its config.pbtxt text when it can be read."""
    storage, files = await manager.catalog.find(check_name(name))
    doc: dict[str, Any] = {
        "name": name,
        "repository": storage.uri,
        "local": isinstance(storage, LocalStorage),
        **describe_files(files),
        "config_pbtxt": None,
        "config_note": "",
        "has_sample": SAMPLE_FILENAME in files,
    }
    stamp = files.get(CONFIG_FILENAME)
    if stamp is None:
        doc["config_note"] = "no config.pbtxt: the config is completed from the model file"
    elif stamp[0] > CONFIG_TEXT_BYTES:
        doc["config_note"] = f"config.pbtxt has {stamp[0]} bytes, too large to show"
    else:
        try:
            data = await asyncio.to_thread(_read, storage, name, CONFIG_FILENAME, stamp)
            doc["config_pbtxt"] = data.decode("utf-8", errors="replace")
        except (NotFound, Unavailable) as exc:
            doc["config_note"] = exc.message
    return doc


async def read_model_file(manager: ModelManager, name: str, rel: str) -> bytes:
    """The contents of one file of a model folder, which must be in its listing."""
    rel = check_relative(rel, "file path")
    storage, files = await manager.catalog.find(check_name(name))
    stamp = files.get(rel)
    if stamp is None:
        raise NotFound(f"model '{name}' has no file '{rel}'")
    return await asyncio.to_thread(_read, storage, name, rel, stamp)
