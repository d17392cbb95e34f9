"""TorchServe archives, settings, request bodies and error answers, without a server."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest

from inferd.backends.torchserve import archive
from inferd.backends.torchserve.settings import VersionSettings, resolve
from inferd.backends.work import InstanceFailed
from inferd.core.errors import ConfigError, ModelFailed, NotFound, Unauthenticated
from inferd.torchserve import forms
from inferd.torchserve.errors import TorchServeError, answer, model_not_found

MANIFEST = {
    "runtime": "python",
    "model": {
        "modelName": "mnist",
        "modelVersion": "2.0",
        "handler": "mnist_handler.py",
        "serializedFile": "mnist.pt",
        "configFile": "model-config.yaml",
    },
}


def _mar(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return path


def test_a_zip_archive_is_read_and_unpacked(tmp_path: Path) -> None:
    version = tmp_path / "1"
    version.mkdir()
    mar = _mar(
        version / "mnist.mar",
        {
            archive.MANIFEST: json.dumps(MANIFEST).encode(),
            "model-config.yaml": b"batchSize: 8\nmaxBatchDelay: 5\nminWorkers: 2\nmaxWorkers: 3\n",
            "mnist_handler.py": b"def handle(data, context):\n    return data\n",
        },
    )
    assert archive.find_archive(version) == mar
    manifest = archive.read_manifest(mar)
    assert (manifest.model_name, manifest.model_version, manifest.handler) == (
        "mnist",
        "2.0",
        "mnist_handler.py",
    )
    settings = resolve(manifest, archive.read_model_yaml(mar, manifest), {}, "test")
    assert (settings.batch_size, settings.max_batch_delay) == (8, 5)
    assert (settings.min_workers, settings.max_workers) == (2, 3)
    assert settings.loaded_at_startup is True  # placed by hand: the repository's from the start
    folder = archive.unpacked(mar, tmp_path / "cache")
    assert (folder / "mnist_handler.py").read_bytes().startswith(b"def handle")
    assert archive.unpacked(mar, tmp_path / "cache") == folder  # once per archive version


def test_an_unpacked_archive_is_used_in_place(tmp_path: Path) -> None:
    (tmp_path / "MAR-INF").mkdir()
    (tmp_path / archive.MANIFEST).write_text(json.dumps(MANIFEST))
    assert archive.find_archive(tmp_path) == tmp_path
    assert archive.unpacked(tmp_path) == tmp_path
    assert archive.is_archive(tmp_path)


def test_registration_settings_win_over_the_archive_but_timeouts(tmp_path: Path) -> None:
    manifest = archive.Manifest.parse(json.dumps(MANIFEST).encode(), "test")
    yaml = {"batchSize": 8, "responseTimeout": 30}
    registration = {"batch_size": 2, "response_timeout": 5, "min_workers": 3, "url": "m.mar"}
    settings = resolve(manifest, yaml, registration, "test")
    assert settings.batch_size == 2
    assert settings.response_timeout == 30  # model-config.yaml's wins, as in TorchServe
    assert (settings.min_workers, settings.max_workers) == (3, 3)
    assert settings.loaded_at_startup is False
    assert VersionSettings.from_parameters(settings.parameters()) == settings


def test_members_that_leave_the_archive_are_refused(tmp_path: Path) -> None:
    mar = _mar(tmp_path / "evil.mar", {archive.MANIFEST: b"{}", "../escape.py": b"x"})
    with pytest.raises(ConfigError, match="would leave the archive"):
        archive.unpacked(mar, tmp_path / "cache")
    assert not (tmp_path / "escape.py").exists()


def test_a_folder_without_an_archive_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="holds no TorchServe archive"):
        archive.find_archive(tmp_path)
    _mar(tmp_path / "a.mar", {archive.MANIFEST: b"{}"})
    _mar(tmp_path / "b.mar", {archive.MANIFEST: b"{}"})
    with pytest.raises(ConfigError, match="several TorchServe archives"):
        archive.find_archive(tmp_path)


def test_bodies_become_parameters_as_torchserve_reads_them() -> None:
    assert forms.parameters(b"{}", "application/json; charset=utf-8") == (
        [b"{}"],
        ["body"],
        ["application/json"],
    )
    assert forms.parameters(b"a=1&b=x+y%21&c", "application/x-www-form-urlencoded") == (
        [b"1", b"x y!"],
        ["a", "b"],
        ["", ""],
    )
    body = (
        b"--XX\r\n"
        b'Content-Disposition: form-data; name="data"; filename="in.bin"\r\n'
        b"Content-Type: image/png\r\n\r\n"
        b"\x89PNG\r\n"
        b"--XX\r\n"
        b'Content-Disposition: form-data; name="note"\r\n\r\n'
        b"hello\r\n"
        b"--XX--\r\n"
    )
    assert forms.parameters(body, "multipart/form-data; boundary=XX") == (
        [b"\x89PNG", b"hello"],
        ["data", "note"],
        ["image/png", ""],
    )
    with pytest.raises(TorchServeError, match="no boundary"):
        forms.parameters(body, "multipart/form-data")


def test_errors_are_answered_in_torchserve_words() -> None:
    assert answer(model_not_found("m")).as_json() == {
        "code": 404,
        "type": "ModelNotFoundException",
        "message": "Model not found: m",
    }
    assert answer(ModelFailed("bad", 418)).as_json()["code"] == 418
    assert answer(ModelFailed("big", 413)).status == 507  # as TorchServe remaps it
    assert answer(InstanceFailed("the worker died")).message == "Worker died."
    assert answer(Unauthenticated("no token")).kind == "InvalidKeyException"
    assert answer(NotFound("no route")).kind == "ResourceNotFoundException"
    assert model_not_found("m").code.value == "NOT_FOUND"
    assert answer(model_not_found("m")).grpc_message() == (
        "Model not found: m\norg.pytorch.serve.archive.model.ModelNotFoundException"
    )
