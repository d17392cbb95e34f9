"""A remote store's local cache kept within a size: the least recently fetched models go first.

A remote store (``s3``) copies each model it loads into a cache folder, one folder per model and
a manifest per model listing its files (``.manifests/<model>.json``). With lazy serving a node
may load, over time, far more models than it keeps: ``CacheBound.trim`` removes the folders of
the least recently fetched models, never one named in ``keep`` (the loaded models and those
loading), until the cache is within ``max_bytes``. What the cache holds is read from the
manifests once (their modification times are the last fetches of a previous run), then kept
in memory as fetches report it. Blocking: the store calls it on worker threads.
"""

from __future__ import annotations

import json
import logging
import shutil
import threading
import time
from pathlib import Path

log = logging.getLogger("inferd.repository")


def _manifest_bytes(manifest: Path) -> int:
    try:
        raw = json.loads(manifest.read_text())
        return sum(int(size) for size, _ in raw.values())
    except (OSError, ValueError, TypeError):
        return 0


class CacheBound:
    def __init__(self, cache: Path, manifests: Path, max_bytes: int) -> None:
        self.cache = cache
        self.manifests = manifests
        self.max_bytes = max_bytes
        self._models: dict[str, tuple[float, int]] | None = None  # name -> (last fetch, bytes)
        self._lock = threading.Lock()

    def _known(self) -> dict[str, tuple[float, int]]:
        if self._models is None:
            found: dict[str, tuple[float, int]] = {}
            for path in self.manifests.glob("*.json") if self.manifests.is_dir() else ():
                try:
                    found[path.stem] = (path.stat().st_mtime, _manifest_bytes(path))
                except OSError:
                    continue
            self._models = found
        return self._models

    def fetched(self, name: str, size: int) -> None:
        """A model's files are in the cache now (``size`` bytes in all)."""
        with self._lock:
            self._known()[name] = (time.time(), size)

    def cached_bytes(self) -> int:
        with self._lock:
            return sum(size for _, size in self._known().values())

    def trim(self, keep: frozenset[str]) -> list[str]:
        """Remove the least recently fetched models not in ``keep`` until the cache holds at
        most ``max_bytes``; returns the models removed."""
        with self._lock:
            models = self._known()
            total = sum(size for _, size in models.values())
            removed: list[str] = []
            for name, (_, size) in sorted(models.items(), key=lambda item: item[1][0]):
                if total <= self.max_bytes:
                    break
                if name in keep:
                    continue
                # The manifest first: a model half removed is never taken as cached.
                (self.manifests / f"{name}.json").unlink(missing_ok=True)
                shutil.rmtree(self.cache / name, ignore_errors=True)
                del models[name]
                total -= size
                removed.append(name)
        if removed:
            log.info(
                "model cache %s: removed %d model(s) (%s) to stay within %d MiB; %d MiB left",
                self.cache,
                len(removed),
                ", ".join(removed),
                self.max_bytes >> 20,
                total >> 20,
            )
        elif total > self.max_bytes:
            log.warning(
                "model cache %s holds %d MiB, over its %d MiB, all of it for loaded models",
                self.cache,
                total >> 20,
                self.max_bytes >> 20,
            )
        return removed
