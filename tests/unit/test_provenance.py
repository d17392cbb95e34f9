"""The record of files that arrived through the network, and how the code policy reads it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from inferd.core.errors import ConfigError
from inferd.repository.local import LocalStorage
from inferd.repository.provenance import added, network_files, record
from inferd.repository.storage import PROVENANCE_FILE
from inferd.security.trust import (
    Capability,
    CodeNotAllowed,
    CodePolicy,
    Grant,
    Grants,
    Origin,
    allowed,
    granted,
    require,
)


def _model(root: Path) -> Path:
    folder = root / "m"
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "model.py").write_text("print('hi')\n")
    (folder / "1" / "model.joblib").write_bytes(b"pickle")
    (folder / "config.pbtxt").write_text('backend: "python"\n')
    return folder


def test_every_file_is_recorded_and_matches_until_changed(tmp_path: Path) -> None:
    folder = _model(tmp_path)
    (folder / PROVENANCE_FILE).write_text('{"format": 1, "files": {}}')  # a forged one
    assert record(folder, "an upload") == 3
    doc = json.loads((folder / PROVENANCE_FILE).read_text())
    assert doc["source"] == "an upload"
    assert sorted(doc["files"]) == ["1/model.joblib", "1/model.py", "config.pbtxt"]
    assert network_files(folder) == {"1/model.joblib", "1/model.py", "config.pbtxt"}
    # Same contents, another time (a copy, a touch): still the network's.
    os.utime(folder / "1" / "model.py", ns=(1, 1))
    # Other contents of the same size, and of another size: the operator's.
    (folder / "1" / "model.joblib").write_bytes(b"PICKLE")
    (folder / "config.pbtxt").write_text('backend: "sklearn"\n')
    assert network_files(folder) == {"1/model.py"}
    (folder / "1" / "model.py").unlink()
    assert network_files(folder) == frozenset()


def test_no_record_is_no_network_file_and_a_broken_one_loads_nothing(tmp_path: Path) -> None:
    folder = _model(tmp_path)
    assert network_files(folder) == frozenset()
    (folder / PROVENANCE_FILE).write_text("{not json")
    with pytest.raises(ConfigError, match="delete it"):
        network_files(folder)
    (folder / PROVENANCE_FILE).write_text('{"files": {"../x": {"size": 1}}}')
    with pytest.raises(ConfigError, match="not a file record"):
        network_files(folder)


def test_the_record_is_listed_with_the_models_files(tmp_path: Path) -> None:
    folder = _model(tmp_path)
    (folder / ".hidden").write_text("x")
    (folder / "1" / PROVENANCE_FILE).write_text("{}")  # only the one at the top counts
    record(folder, "an upload")
    files = LocalStorage(tmp_path).scan_model("m")
    assert files is not None
    assert sorted(files) == [PROVENANCE_FILE, "1/model.joblib", "1/model.py", "config.pbtxt"]


def _grants(policy: CodePolicy, origin: Origin, folder: Path) -> Grants:
    pickle = os.path.realpath(folder / "1" / "model.joblib")
    return policy.grants(origin, {pickle: "1/model.joblib"}, ("1/model.joblib",))


def test_a_file_of_the_network_needs_what_code_sent_through_the_api_needs(tmp_path: Path) -> None:
    always = CodePolicy(Grant.ALWAYS, Grant.ALWAYS, Grant.ALWAYS)
    own = tmp_path / "1" / "own.joblib"
    sent = tmp_path / "1" / "model.joblib"
    with granted(_grants(always, Origin.STARTUP, tmp_path)):
        require(Capability.PICKLE, "own.joblib is a pickle", [own])  # the operator's file
        assert not allowed(Capability.UNSAFE_OPS)  # any file of the model: one is the network's
        with pytest.raises(CodeNotAllowed) as info:
            require(Capability.PICKLE, "model.joblib is a pickle", [sent])
    message = info.value.message
    assert "'1/model.joblib' was sent through the repository API" in message
    assert "--allow-pickle always and an --admin-token" in message
    with granted(_grants(always, Origin.STARTUP, tmp_path)), pytest.raises(CodeNotAllowed) as info:
        require(Capability.PYTHON_MODELS, "model.py is a Python model")
    assert "a file of the model (which its code may read or import)" in info.value.message
    admins = CodePolicy(Grant.ALWAYS, Grant.ALWAYS, Grant.ALWAYS, admin_token=True)
    grants = Grants.from_plain(_grants(admins, Origin.REPOSITORY, tmp_path).plain())
    # As a worker process gets them:
    assert grants.network == {os.path.realpath(sent): "1/model.joblib"}
    with granted(grants):
        require(Capability.PICKLE, "model.joblib is a pickle", [sent])
        require(Capability.PYTHON_MODELS, "model.py is a Python model")


def test_files_written_one_by_one_are_added_and_judged_by_contents(tmp_path: Path) -> None:
    folder = _model(tmp_path)
    record(folder, "an upload")
    (folder / "2").mkdir()
    (folder / "2" / "model.mar").write_bytes(b"archive")
    existing = (folder / PROVENANCE_FILE).read_bytes()
    data = added(existing, {"2/model.mar": b"archive"}, "a TorchServe registration")
    (folder / PROVENANCE_FILE).write_bytes(data)
    assert "2/model.mar" in network_files(folder) and "1/model.py" in network_files(folder)
    (folder / "2" / "model.mar").write_bytes(b"ARCHIVE")
    assert "2/model.mar" not in network_files(folder)
    with pytest.raises(ConfigError):
        added(b"[]", {"x": b""}, "a TorchServe registration")
