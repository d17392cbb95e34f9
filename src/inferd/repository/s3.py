"""``s3://bucket/prefix`` repositories: AWS S3, MinIO, QingStor or any S3-compatible store.

Listing gives each object's size and ETag, which stamp the files; ``fetch`` copies a model's
changed objects into a local cache folder (atomically, file by file) and removes the ones the
store no longer has, so a poll only downloads what changed. ``put_model`` uploads a model
folder under a ``.inferd-writing`` marker object, which tells other servers to leave the model
alone until every object is in place (S3 cannot rename a folder). With lazy serving the cache
is kept within ``--model-cache-max-bytes`` (``cache_bound``). Every call has short
timeouts. Credentials come from the ``--s3-*`` settings or boto3's usual sources
(``AWS_ACCESS_KEY_ID``... variables, profiles).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import boto3
import botocore.exceptions
from botocore.config import Config

from inferd.core.errors import ConfigError, InferdError
from inferd.repository.cache_bound import CacheBound
from inferd.repository.storage import (
    PROVENANCE_FILE,
    ModelFiles,
    StorageError,
    StorageOptions,
    check_relative,
    is_hidden,
    is_listed,
)
from inferd.repository.storage import WRITING_MARKER as _WRITING

log = logging.getLogger("inferd.repository")

# Short: a store that hangs must not hold a poll, a load or a routing change for long (a poll
# retries on its own schedule). The read timeout bounds each wait for bytes, not a download.
CONNECT_TIMEOUT_S = 3
READ_TIMEOUT_S = 10
MAX_ATTEMPTS = 2
WRITING_STALE_S = 600.0  # a writing marker older than this was left by a writer that died
_MANIFESTS = ".manifests"
_STAGING = ".staging"

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
        # Lazy serving: the cache within a size, least recently fetched models removed first.
        self.bound = (
            CacheBound(self.cache, self.cache / _MANIFESTS, options.cache_max_bytes)
            if options.cache_max_bytes
            else None
        )
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
            entry = self._entry(obj)
            if entry is not None:
                name, rel = entry
                found.setdefault(name, {})[rel] = (int(obj["Size"]), _etag(obj))
        return dict(sorted(found.items()))

    def scan_model(self, name: str) -> ModelFiles | None:
        files: ModelFiles = {}
        for obj in self._list(f"{self.prefix}{name}/"):
            entry = self._entry(obj)
            if entry is not None and entry[0] == name:
                files[entry[1]] = (int(obj["Size"]), _etag(obj))
        return files or None

    def _entry(self, obj: dict[str, Any]) -> tuple[str, str] | None:
        """(model, path in the model) of a listed object, or None for keys to skip; a fresh
        writing marker is listed as the model's file ``WRITING_MARKER``."""
        rel_key = obj["Key"][len(self.prefix) :]
        name, sep, rel = rel_key.partition("/")
        if not sep or not rel or rel.endswith("/") or is_hidden(name):
            return None  # a file beside the models, a "folder" marker, or a hidden name
        if rel == _WRITING:
            return (name, rel) if _fresh(obj) else None
        if not is_listed(rel):
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
        files = {rel: stamp for rel, stamp in files.items() if rel != _WRITING}
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
        if self.bound is not None:
            self.bound.fetched(name, sum(size for size, _ in manifest.values()))
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

    def trim_cache(self, keep: frozenset[str]) -> list[str]:
        """Keep the cache within ``--model-cache-max-bytes``, but for the models in ``keep``."""
        return self.bound.trim(keep) if self.bound is not None else []

    def read(self, rel: str) -> bytes | None:
        key = self.prefix + check_relative(rel, f"file in model repository '{self.uri}'")
        try:
            body = self._client.get_object(Bucket=self.bucket, Key=key)["Body"]
            data: bytes = body.read()
            return data
        except botocore.exceptions.ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                return None
            raise self._error(exc) from None
        except botocore.exceptions.BotoCoreError as exc:
            raise self._error(exc) from None

    def write(self, rel: str, data: bytes) -> None:
        key = self.prefix + check_relative(rel, f"file in model repository '{self.uri}'")
        try:
            self._client.put_object(Bucket=self.bucket, Key=key, Body=data)
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as exc:
            raise self._error(exc) from None

    def remove(self, rel: str) -> None:
        key = self.prefix + check_relative(rel, f"file in model repository '{self.uri}'")
        try:
            self._client.delete_object(Bucket=self.bucket, Key=key)
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as exc:
            raise self._error(exc) from None

    def staging_dir(self) -> Path:
        staging = self.cache / _STAGING
        staging.mkdir(parents=True, exist_ok=True)
        return staging

    def put_model(self, name: str, folder: Path) -> ModelFiles:
        """Upload ``folder`` as model ``name`` under a writing marker: the new objects first
        (version folders before the config), then the old ones that are not in it are
        deleted, then the marker; the cache is filled from ``folder``, not downloaded."""
        prefix = f"{self.prefix}{check_relative(name, 'model name')}/"
        local = _local_files(folder)
        try:
            self._client.put_object(Bucket=self.bucket, Key=prefix + _WRITING, Body=b"")
            # The provenance record first: no reader sees a file of the network without it.
            for rel in sorted(local, key=lambda r: (r != PROVENANCE_FILE, "/" not in r, r)):
                self._client.upload_file(str(folder / rel), self.bucket, prefix + rel)
            for obj in self._list(prefix):
                rel = obj["Key"][len(prefix) :]
                if rel not in local and rel != _WRITING:
                    self._client.delete_object(Bucket=self.bucket, Key=obj["Key"])
            self._client.delete_object(Bucket=self.bucket, Key=prefix + _WRITING)
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as exc:
            raise self._error(exc) from None
        files = self.scan_model(name) or {}
        self._seed_cache(name, folder, files)
        log.info("model '%s' written to %s: %d file(s)", name, self.uri, len(files))
        return files

    def _seed_cache(self, name: str, folder: Path, files: ModelFiles) -> None:
        """Put the uploaded files into the cache as if fetched, so no poll downloads them."""
        target = self.cache / name
        manifest_path = self.cache / _MANIFESTS / f"{name}.json"
        manifest = _read_manifest(manifest_path)
        for rel, stamp in files.items():
            source = folder / rel
            if _size(source) != stamp[0]:
                continue  # changed in the store meanwhile: the next fetch downloads it
            path = target / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            aside = path.with_name(f".fetch-{uuid.uuid4().hex[:8]}")
            shutil.copyfile(source, aside)
            os.replace(aside, path)
            manifest[rel] = stamp
        _remove_extra(target, set(files))
        manifest = {rel: stamp for rel, stamp in manifest.items() if rel in files}
        _write_manifest(manifest_path, manifest)
        if self.bound is not None:
            self.bound.fetched(name, sum(size for size, _ in manifest.values()))

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


def _fresh(obj: dict[str, Any]) -> bool:
    """Whether a writing marker is recent enough to be a writer at work."""
    modified = obj.get("LastModified")
    if not isinstance(modified, datetime):
        return True
    age_s = (datetime.now(UTC) - modified).total_seconds()
    if age_s < WRITING_STALE_S:
        return True
    log.warning("ignoring '%s': a writer left it %.0f s ago", obj["Key"], age_s)
    return False


def _local_files(folder: Path) -> dict[str, Path]:
    """The files under a local model folder, by relative path (hidden names skipped, but the
    provenance record)."""
    found: dict[str, Path] = {}
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder).as_posix()
        if path.is_file() and is_listed(rel):
            found[rel] = path
    return found


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
