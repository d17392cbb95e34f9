"""A remote store's local cache kept within a size: the least recently fetched models go first.

A remote store (``s3``) copies each model it loads into a cache folder, one folder per model and
a manifest per model listing its files (``.manifests/<model>.json``, rewritten by every fetch,
so its modification time is the model's last fetch). With lazy serving a node may load, over
time, far more models than it keeps: ``trim`` removes the folders of the least recently fetched
models, never one named in ``keep`` (the loaded models and those loading), until the cache is
within ``max_bytes``. Blocking: run it on a worker thread.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

log = logging.getLogger("inferd.repository")


def _cached_bytes(manifest: Path) -> int:
    try:
        raw = json.loads(manifest.read_text())
        return sum(int(size) for size, _ in raw.values())
    except (OSError, ValueError, TypeError):
        return 0


def cache_bytes(cache: Path, manifests: Path) -> dict[str, tuple[float, int]]:
    """Each cached model: (last fetch, unix time; bytes)."""
    found: dict[str, tuple[float, int]] = {}
    for path in manifests.glob("*.json") if manifests.is_dir() else ():
        try:
            found[path.stem] = (path.stat().st_mtime, _cached_bytes(path))
        except OSError:
            continue
    return found


def trim(cache: Path, manifests: Path, max_bytes: int, keep: frozenset[str]) -> list[str]:
    """Remove the least recently fetched models not in ``keep`` until the cache holds at most
    ``max_bytes``; returns the models removed."""
    models = cache_bytes(cache, manifests)
    total = sum(size for _, size in models.values())
    removed: list[str] = []
    for name, (_, size) in sorted(models.items(), key=lambda item: item[1][0]):
        if total <= max_bytes:
            break
        if name in keep:
            continue
        (manifests / f"{name}.json").unlink(missing_ok=True)  # first: no half model is "cached"
        shutil.rmtree(cache / name, ignore_errors=True)
        total -= size
        removed.append(name)
    if removed:
        log.info(
            "model cache %s: removed %d model(s) (%s) to stay within %d MiB; %d MiB left",
            cache,
            len(removed),
            ", ".join(removed),
            max_bytes >> 20,
            total >> 20,
        )
    elif total > max_bytes:
        log.warning(
            "model cache %s holds %d MiB, over its %d MiB, all of it for loaded models",
            cache,
            total >> 20,
            max_bytes >> 20,
        )
    return removed
