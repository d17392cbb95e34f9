"""``s3://bucket/prefix`` repositories: AWS S3, MinIO, QingStor or any S3-compatible store.

Listing gives each object's size and ETag, which stamp the files; ``fetch`` copies a model's
changed objects into a local cache folder (atomically, file by file) and removes the ones the
store no longer has, so a poll only downloads what changed. Credentials come from the
``--s3-*`` settings or boto3's usual sources (``AWS_ACCESS_KEY_ID``... variables, profiles).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import boto3
import botocore.exceptions
from botocore.config import Config

from inferd.errors import ConfigError, InferdError
from inferd.repository.storage import (
    ModelFiles,
    StorageError,
    StorageOptions,
    check_relative,
    is_hidden,
)

log = logging.getLogger("inferd.repository")

CONNECT_TIMEOUT_S = 5
READ_TIMEOUT_S = 60
MAX_ATTEMPTS = 2  # a poll retries on its own schedule; do not stall it on a dead store
_MANIFESTS = ".manifests"

# botocore logs every request at DEBUG: keep it quiet unless asked for explicitly.
for _name in ("botocore", "boto3", "s3transfer", "urllib3"):
    if logging.getLogger(_name).level == logging.NOTSET:
        logging.getLogger(_name).setLevel(logging.WARNING)


def parse_uri(uri: str) -> tuple[str, str]:
    """``s3://bucket/some/prefix`` -> (``bucket``, ``some/prefix/``)."""
    rest = uri[len("s3://") :]
    bucket, _, prefix = rest.partition("/")
    if not bucket:
        raise ConfigError(f"model repository '{uri}': no bucket name (s3://BUCKET/prefix)")
    prefix = prefix.strip("/")
    return bucket, f"{prefix}/" if prefix else ""


class S3Storage:
    """A model repository under one bucket and prefix, cached locally model by model."""

    def __init__(self, uri: str, options: StorageOptions) -> None:
        self.uri = uri.rstrip("/")
        self.bucket, self.prefix = parse_uri(uri)
        self.cache = options.cache_for(self.uri)
        style = options.s3_addressing_style or "auto"
        if style not in ("auto", "path", "virtual"):
            raise ConfigError(f"--s3-addressing-style must be auto, path or virtual, not '{style}'")
        if style == "auto" and options.s3_endpoint_url:
            style = "path"  # MinIO and most self-hosted stores want path-style URLs
        config = Config(
            connect_timeout=CONNECT_TIMEOUT_S,
            read_timeout=READ_TIMEOUT_S,
            retries={"max_attempts": MAX_ATTEMPTS, "mode": "standard"},
            s3={"addressing_style": style},
        )
        self._client: Any = boto3.session.Session().client(
            "s3",
            endpoint_url=options.s3_endpoint_url or None,
            aws_access_key_id=options.s3_access_key_id or None,
            aws_secret_access_key=options.s3_secret_access_key or None,
            region_name=options.s3_region or None,
            config=config,
        )

    def _error(self, exc: Exception) -> StorageError:
        if isinstance(exc, botocore.exceptions.ClientError):
            error = exc.response.get("Error", {})
            detail = f"{error.get('Code', '?')}: {error.get('Message', '')}".rstrip(": ")
        else:
            detail = f"{exc}"
        return StorageError(f"model repository '{self.uri}' is unreachable: {detail}")

    def _list(self, prefix: str) -> list[dict[str, Any]]:
        objects: list[dict[str, Any]] = []
        try:
            pages = self._client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=prefix
            )
            for page in pages:
                objects.extend(page.get("Contents", ()))
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as exc:
            raise self._error(exc) from None
        return objects

    def scan(self) -> dict[str, ModelFiles]:
        found: dict[str, ModelFiles] = {}
        for obj in self._list(self.prefix):
            entry = self._entry(obj["Key"][len(self.prefix) :])
            if entry is not None:
                name, rel = entry
                found.setdefault(name, {})[rel] = (int(obj["Size"]), _etag(obj))
        return dict(sorted(found.items()))

    def scan_model(self, name: str) -> ModelFiles | None:
        files: ModelFiles = {}
        for obj in self._list(f"{self.prefix}{name}/"):
            entry = self._entry(obj["Key"][len(self.prefix) :])
            if entry is not None and entry[0] == name:
                files[entry[1]] = (int(obj["Size"]), _etag(obj))
        return files or None

    @staticmethod
    def _entry(rel_key: str) -> tuple[str, str] | None:
        """(model, path in the model) of an object key, or None for keys to skip."""
        name, sep, rel = rel_key.partition("/")
        if not sep or not rel or rel.endswith("/") or is_hidden(name):
            return None  # a file beside the models, a "folder" marker, or a hidden name
        if any(is_hidden(part) for part in rel.split("/")):
            return None
        try:
            return name, check_relative(rel, "object key")
        except InferdError:
            log.warning("skipping S3 object '%s': not a safe relative path", rel_key)
            return None

    def cached(self) -> dict[str, ModelFiles]:
        """The models a previous run left complete in the cache (every file its manifest lists,
        of the listed size): what a node can serve while the store does not answer."""
        found: dict[str, ModelFiles] = {}
        manifests = self.cache / _MANIFESTS
        for path in sorted(manifests.glob("*.json")) if manifests.is_dir() else ():
            files = _read_manifest(path)
            name = path.stem
            if files and all(_size(self.cache / name / rel) == st[0] for rel, st in files.items()):
                found[name] = files
        return found

    def fetch(self, name: str, files: ModelFiles) -> Path:
        """Copy the model's changed objects into the cache; returns the cached folder."""
        folder = self.cache / name
        manifest_path = self.cache / _MANIFESTS / f"{name}.json"
        manifest = _read_manifest(manifest_path)
        fetched = fetched_bytes = 0
        for rel, stamp in sorted(files.items()):
            target = folder / rel
            if manifest.get(rel) == stamp and _size(target) == stamp[0]:
                continue
            self._download(f"{self.prefix}{name}/{rel}", target)
            manifest[rel] = stamp
            fetched += 1
            fetched_bytes += stamp[0]
            _write_manifest(manifest_path, manifest)  # a crash keeps what was fetched
        removed = _remove_extra(folder, set(files))
        manifest = {rel: stamp for rel, stamp in manifest.items() if rel in files}
        _write_manifest(manifest_path, manifest)
        log.info(
            "model '%s' from %s: fetched %d file(s) (%d bytes), %d unchanged, %d removed",
            name,
            self.uri,
            fetched,
            fetched_bytes,
            len(files) - fetched,
            removed,
        )
        return folder

    def _download(self, key: str, target: Path) -> None:
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.is_dir():
            shutil.rmtree(target)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".fetch-")
        os.close(fd)
        try:
            self._client.download_file(self.bucket, key, tmp)
            os.replace(tmp, target)
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as exc:
            raise self._error(exc) from None
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)


def _etag(obj: dict[str, Any]) -> str:
    return str(obj.get("ETag", "")).strip('"')


def _size(path: Path) -> int:
    try:
        return path.stat().st_size if path.is_file() else -1
    except OSError:
        return -1


def _read_manifest(path: Path) -> dict[str, tuple[int, str]]:
    try:
        raw = json.loads(path.read_text())
        return {rel: (int(size), str(tag)) for rel, (size, tag) in raw.items()}
    except (OSError, ValueError, TypeError):
        return {}


def _write_manifest(path: Path, manifest: dict[str, tuple[int, str]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({rel: list(stamp) for rel, stamp in sorted(manifest.items())}))
    os.replace(tmp, path)


def _remove_extra(folder: Path, keep: set[str]) -> int:
    """Delete cached files the store no longer has, then empty folders; returns files removed."""
    removed = 0
    if not folder.is_dir():
        return 0
    for top, dirs, names in os.walk(folder, topdown=False):
        for name in names:
            path = Path(top) / name
            if path.relative_to(folder).as_posix() not in keep:
                path.unlink()
                removed += 1
        for d in dirs:
            sub = Path(top) / d
            if sub.is_dir() and not any(sub.iterdir()):
                sub.rmdir()
    return removed
