"""A remote store's model cache kept within a size: least recently fetched first, loaded kept."""

from __future__ import annotations

import json
import os
from pathlib import Path

from inferd.repository.cache_bound import CacheBound


def cached(cache: Path, name: str, size: int, fetched_unix_s: float) -> None:
    (cache / name / "1").mkdir(parents=True)
    (cache / name / "1" / "model.onnx").write_bytes(b"\0" * size)
    manifest = cache / ".manifests" / f"{name}.json"
    manifest.parent.mkdir(exist_ok=True)
    manifest.write_text(json.dumps({"1/model.onnx": [size, "etag"]}))
    os.utime(manifest, (fetched_unix_s, fetched_unix_s))


def test_the_least_recently_fetched_models_go_first_and_loaded_ones_stay(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    for age, name in enumerate(["d", "c", "b", "a"]):  # a: fetched longest ago
        cached(cache, name, 100, 1_000_000 - age * 10)
    bound = CacheBound(cache, cache / ".manifests", 250)
    assert bound.cached_bytes() == 400
    assert bound.trim(frozenset({"a"})) == ["b", "c"]  # 'a' is loaded: kept
    assert sorted(p.name for p in cache.iterdir() if not p.name.startswith(".")) == ["a", "d"]
    assert sorted(p.stem for p in (cache / ".manifests").iterdir()) == ["a", "d"]
    assert bound.cached_bytes() == 200
    # A fetch makes a model the most recent; what no longer fits goes, oldest first.
    cached(cache, "e", 100, 2_000_000)
    bound.fetched("e", 100)
    bound.fetched("a", 100)
    assert bound.trim(frozenset()) == ["d"]
    assert bound.cached_bytes() == 200 <= bound.max_bytes


def test_loaded_models_over_the_bound_stay(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cached(cache, "a", 300, 1_000_000)
    bound = CacheBound(cache, cache / ".manifests", 250)
    assert bound.trim(frozenset({"a"})) == []
    assert (cache / "a" / "1" / "model.onnx").exists()
