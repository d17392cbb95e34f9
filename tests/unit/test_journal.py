"""The workers' journal stays short: what a replacement worker replays has the same effect."""

from __future__ import annotations

import multiprocessing
from pathlib import Path
from typing import Any

from inferd.workers.journal import Journal, compact


def _register(name: str, key: str = "/k") -> dict[str, Any]:
    return {"op": "shm_register", "name": name, "key": key, "offset": 0, "byte_size": 64}


def _load(name: str, config: str | None = None) -> dict[str, Any]:
    return {"op": "load", "name": name, "config": config, "files": {}}


def _trace(changes: dict[str, Any], model: str = "") -> dict[str, Any]:
    return {"op": "trace_settings", "name": "trace settings", "changes": changes, "model": model}


def test_a_region_registered_then_unregistered_leaves_nothing() -> None:
    entries = [_register("a"), _register("b"), {"op": "shm_unregister", "name": "a"}]
    assert compact(entries) == [_register("b")]
    assert compact([*entries, {"op": "shm_unregister", "name": ""}]) == []
    assert compact([{"op": "shm_unregister", "name": "never"}]) == []


def test_a_client_registering_per_session_does_not_grow_the_journal() -> None:
    entries: list[dict[str, Any]] = [_load("m")]
    for i in range(1000):
        entries = compact([*entries, _register(f"session-{i}")])
        entries = compact([*entries, {"op": "shm_unregister", "name": f"session-{i}"}])
    assert entries == [_load("m")]


def test_settings_fold_key_by_key() -> None:
    logs = [
        {"op": "log_settings", "name": "log settings", "changes": {"log_info": False}},
        {"op": "log_settings", "name": "log settings", "changes": {"log_verbose_level": 1}},
        {"op": "log_settings", "name": "log settings", "changes": {"log_info": True}},
    ]
    assert compact(logs) == [
        {
            "op": "log_settings",
            "name": "log settings",
            "changes": {"log_info": True, "log_verbose_level": 1},
        }
    ]
    folded = compact([_trace({"trace_rate": "10"}), _load("m"), _trace({"trace_rate": None})])
    assert folded == [_load("m"), _trace({"trace_rate": None})]


def test_a_models_trace_settings_stay_after_the_load_they_need() -> None:
    entries = [_load("m"), _trace({"trace_rate": "5"}, "m"), _trace({"trace_count": "2"}, "m")]
    assert compact(entries) == [_load("m"), _trace({"trace_rate": "5", "trace_count": "2"}, "m")]
    reloaded = [_load("m"), _trace({"trace_rate": "5"}, "m"), _load("m", "{}")]
    assert compact(reloaded) == reloaded  # the settings were made on the first load
    assert compact([*reloaded, _trace({"trace_rate": "6"}, "m")]) == [
        *reloaded,
        _trace({"trace_rate": "6"}, "m"),
    ]


def test_a_model_change_replaces_the_last_one_only_when_nothing_depends_on_it() -> None:
    unload = {"op": "unload", "name": "m", "dependents": False}
    assert compact([_load("m"), _register("r"), _load("m", "{}"), unload]) == [
        _register("r"),
        unload,
    ]
    # an ensemble loaded in between may have needed the first form of "m": both stay
    kept = [_load("m"), _load("ensemble"), _load("m", "{}")]
    assert compact(kept) == kept
    routing = {"op": "routing", "name": "m", "doc": {}}
    assert compact([_load("m"), routing, _load("m", "{}")]) == [
        _load("m"),
        routing,
        _load("m", "{}"),
    ]


def _append_many(path: str, worker: int) -> None:
    journal = Journal(Path(path))
    for i in range(50):
        journal.append(_register(f"w{worker}-{i}"))


def test_appends_from_several_processes_all_land(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    context = multiprocessing.get_context("spawn")
    workers = [context.Process(target=_append_many, args=(str(path), w)) for w in range(3)]
    for process in workers:
        process.start()
    for process in workers:
        process.join(60)
        assert process.exitcode == 0
    names = {entry["name"] for entry in Journal(path).entries()}
    assert names == {f"w{w}-{i}" for w in range(3) for i in range(50)}
    journal = Journal(path)
    journal.append({"op": "shm_unregister", "name": ""})
    assert journal.entries() == []
    assert Journal(tmp_path / "none.jsonl").entries() == []
