"""``--model-name``: one model's folder as the whole repository, its files as version 1 or its
numbered version folders as they are; the settings it needs; what it refuses."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from inferd.app.flags import parse
from inferd.app.repository import single_model_storage
from inferd.core.errors import ConfigError, InvalidInput
from inferd.repository.layout import version_dirs
from inferd.repository.single import SingleModelStorage


def _flat(root: Path) -> Path:
    root.mkdir()
    (root / "model.joblib").write_bytes(b"model")
    (root / "labels.txt").write_text("a\nb\n")
    (root / "config.pbtxt").write_text('backend: "sklearn"\n')
    (root / ".hidden").write_text("x")
    return root


def test_a_folder_of_files_is_version_1(tmp_path: Path) -> None:
    storage = SingleModelStorage(_flat(tmp_path / "models"), "iris")
    files = storage.scan()["iris"]
    assert sorted(files) == ["1/labels.txt", "1/model.joblib", "config.pbtxt"]
    assert storage.scan_model("other") is None
    view = storage.fetch("iris", files)
    assert view.name == "iris"
    assert list(version_dirs(view)) == [1]
    assert (view / "1" / "model.joblib").read_bytes() == b"model"
    # the config and the files a config names, beside the version as in a model folder
    assert (view / "config.pbtxt").read_text() == 'backend: "sklearn"\n'
    assert (view / "labels.txt").read_text() == "a\nb\n"
    assert not (view / ".hidden").exists()
    (tmp_path / "models" / "model.joblib").write_bytes(b"new")
    assert (storage.fetch("iris", files) / "1" / "model.joblib").read_bytes() == b"new"


def test_version_folders_are_read_as_they_are(tmp_path: Path) -> None:
    root = tmp_path / "flowers"
    for version in ("0001", "0002"):  # TF Serving's names
        (root / version / "variables").mkdir(parents=True)
        (root / version / "saved_model.pb").write_bytes(version.encode())
    storage = SingleModelStorage(root, "flowers")
    files = storage.scan_model("flowers")
    assert files is not None
    assert sorted(files) == ["0001/saved_model.pb", "0002/saved_model.pb"]
    assert storage.fetch("flowers", files) == root
    assert list(version_dirs(root)) == [1, 2]


def test_routing_is_written_beside_the_model_and_uploads_are_refused(tmp_path: Path) -> None:
    storage = SingleModelStorage(_flat(tmp_path / "models"), "iris")
    storage.write("iris/routing.json", b"{}")
    assert (tmp_path / "models" / "routing.json").read_bytes() == b"{}"
    assert storage.read("iris/routing.json") == b"{}"
    assert "routing.json" in storage.scan()["iris"]  # the model's, not version 1's
    assert storage.read("other/routing.json") is None
    storage.remove("iris/routing.json")
    assert not (tmp_path / "models" / "routing.json").exists()
    with pytest.raises(InvalidInput, match="serves one model, 'iris'"):
        storage.write("other/routing.json", b"{}")
    with pytest.raises(InvalidInput, match="takes no uploads"):
        storage.staging_dir()
    with pytest.raises(InvalidInput, match="takes no uploads"):
        storage.put_model("other", tmp_path)


def test_the_settings_it_needs(tmp_path: Path) -> None:
    folder = str(tmp_path)
    storage = single_model_storage(
        parse(["--model-repository", folder, "--model-name", "m"], environ={})
    )
    assert isinstance(storage, SingleModelStorage)
    assert (storage.root, storage.name) == (tmp_path, "m")
    local = single_model_storage(
        parse([f"--model-repository=file://{folder}", "--model-name=m"], environ={})
    )
    assert isinstance(local, SingleModelStorage) and local.root == tmp_path
    wrong = {
        "exactly one --model-repository": ["--model-repository", folder] * 2,
        "a local folder, not 's3://b/p'": ["--model-repository", "s3://b/p"],
    }
    for message, args in wrong.items():
        with pytest.raises(ConfigError, match=re.escape(message)):
            single_model_storage(parse([*args, "--model-name", "m"], environ={}))
    with pytest.raises(ConfigError, match=re.escape("--model-name: model name '../m' must start")):
        single_model_storage(
            parse(["--model-repository", folder, "--model-name", "../m"], environ={})
        )
