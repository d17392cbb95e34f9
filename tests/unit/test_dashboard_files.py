"""A model folder's listing for the dashboard, read through the manager from a local folder."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from inferd.core.errors import InvalidInput, NotFound
from inferd.dashboard.files import describe_files, list_model, read_model_file
from inferd.plane.registry import Registry
from inferd.repository.manager import ModelManager


def test_describe_files_groups_versions() -> None:
    doc = describe_files({"2/model.onnx": (30, "b"), "config.pbtxt": (5, "c"), "1/a": (7, "a")})
    assert doc["files"] == [
        {"path": "1/a", "bytes": 7, "version": 1},
        {"path": "2/model.onnx", "bytes": 30, "version": 2},
        {"path": "config.pbtxt", "bytes": 5, "version": None},
    ]
    assert doc["versions"] == [
        {"version": 1, "files": 1, "bytes": 7},
        {"version": 2, "files": 1, "bytes": 30},
    ]
    assert doc["total_bytes"] == 42


def test_listing_and_reading_a_local_model(tmp_path: Path) -> None:
    model = tmp_path / "m"
    (model / "1").mkdir(parents=True)
    (model / "1" / "model.onnx").write_bytes(b"onnx")
    (model / "config.pbtxt").write_text('name: "m"\n')
    (model / ".hidden").write_text("secret")
    manager = ModelManager([tmp_path], Registry())
    doc = asyncio.run(list_model(manager, "m"))
    assert doc["config_pbtxt"] == 'name: "m"\n' and doc["has_sample"] is False
    assert [f["path"] for f in doc["files"]] == ["1/model.onnx", "config.pbtxt"]
    assert asyncio.run(read_model_file(manager, "m", "1/model.onnx")) == b"onnx"
    with pytest.raises(NotFound, match=r"model 'm' has no file '\.hidden'"):
        asyncio.run(read_model_file(manager, "m", ".hidden"))
    with pytest.raises(InvalidInput, match=r"leaves its folder"):
        asyncio.run(read_model_file(manager, "m", "../m/config.pbtxt"))
    with pytest.raises(InvalidInput, match="is not a model name"):
        asyncio.run(list_model(manager, ".."))
    (model / "config.pbtxt").unlink()
    assert asyncio.run(list_model(manager, "m"))["config_note"].startswith("no config.pbtxt")
