"""Uploads: PUT /v2/repository/models/{m} with a .tar.gz or .zip, and ``inferd repo push``.

A good archive is written into the repository and serves; a bad one answers 4xx naming the
problem and leaves the repository exactly as it was. Uploads that replace a model under traffic
fail no request, in the layout ``inferd serve`` runs (frontends beside the model host).
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.lifecycle_support import (
    HALF_PLUS_THREE,
    HALF_PLUS_TWO,
    HPT,
    HTTP,
    Traffic,
    infer,
    numbered_onnx,
    right_for_version,
    states,
    version_archive,
    write_version,
)
from tests.support import ServerProcess, wait_for

MAX_UPLOAD_BYTES = 100_000


@pytest.fixture(scope="module")
def uploads(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, Path]]:
    root = tmp_path_factory.mktemp("upload") / "models"
    write_version(root / HPT, 1)
    args = ["--model-control-mode", "explicit", "--load-model", "*"]
    server = ServerProcess(root, extra_args=[*args, "--max-upload-bytes", str(MAX_UPLOAD_BYTES)])
    server.start()
    yield server, root
    server.stop()


def _tar(files: dict[str, bytes], links: dict[str, str] | None = None, prefix: str = "") -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(prefix + name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for name, target in (links or {}).items():
            info = tarfile.TarInfo(prefix + name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
    return buffer.getvalue()


def _zip(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return buffer.getvalue()


def _put(server: ServerProcess, name: str, body: bytes) -> tuple[int, object]:
    r = HTTP.put(f"{server.http_url}/v2/repository/models/{name}", content=body)
    return r.status_code, r.json()


def _tree(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*"))


def test_a_tar_gz_upload_serves(uploads: tuple[ServerProcess, Path]) -> None:
    server, root = uploads
    status, doc = _put(server, "tarred", _tar({"1/model.onnx": HALF_PLUS_THREE}))
    assert status == 200, doc
    assert doc == [{"name": "tarred", "version": "1", "state": "READY", "reason": ""}]
    assert infer(server, "tarred", [1.0]).json()["outputs"][0]["data"] == [3.5]
    assert (root / "tarred" / "1" / "model.onnx").read_bytes() == HALF_PLUS_THREE


def test_a_zip_with_a_top_folder_replaces_the_model(uploads: tuple[ServerProcess, Path]) -> None:
    server, root = uploads
    files = {
        "mymodel/config.pbtxt": b"version_policy { all {} }\nmax_batch_size: 2\n",
        "mymodel/1/model.onnx": HALF_PLUS_TWO,
        "mymodel/2/model.onnx": HALF_PLUS_THREE,
    }
    status, doc = _put(server, "zipped", _zip(files))
    assert status == 200, doc
    assert states(server, "zipped") == {"1": "READY", "2": "READY"}
    status, doc = _put(server, "zipped", _zip({"1/model.onnx": HALF_PLUS_THREE}))
    assert status == 200, doc
    # PUT replaces the whole folder; the server records what it received.
    assert _tree(root / "zipped") == [".inferd-provenance.json", "1", "1/model.onnx"]
    assert infer(server, "zipped", [1.0]).json()["outputs"][0]["data"] == [3.5]
    assert states(server, "zipped") == {"1": "READY"}


def test_repo_push_packs_and_uploads_a_folder(
    uploads: tuple[ServerProcess, Path], tmp_path: Path
) -> None:
    server, root = uploads
    folder = tmp_path / "local_model"
    write_version(folder, 1, HALF_PLUS_THREE)
    write_version(folder, 2)
    command = [
        sys.executable,
        "-m",
        "inferd",
        "repo",
        "push",
        str(folder),
        "--url",
        server.http_url,
    ]
    done = subprocess.run(
        [*command, "--name", "pushed"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert '"state": "READY"' in done.stdout
    assert infer(server, "pushed", [1.0]).json()["model_version"] == "2"
    expected = [".inferd-provenance.json", "1", "1/model.onnx", "2", "2/model.onnx"]
    assert _tree(root / "pushed") == expected
    missing = subprocess.run(
        [sys.executable, "-m", "inferd", "repo", "push", str(tmp_path / "nope")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert missing.returncode == 2 and "is not a folder" in missing.stderr


GOOD = {"1/model.onnx": HALF_PLUS_TWO}


@pytest.mark.parametrize(
    ("name", "body", "status", "fragment"),
    [
        ("evil", _tar({**GOOD, "../escape": b"x"}), 400, "leaves its folder ('..')"),
        ("evil", _tar({**GOOD, "/tmp/escape": b"x"}), 400, "absolute path '…/escape'"),
        ("evil", _tar(GOOD, links={"1/link": "/etc/passwd"}), 400, "is a link"),
        ("evil", os.urandom(MAX_UPLOAD_BYTES + 1), 413, "--max-upload-bytes"),
        ("evil", _tar({"1/big": b"\0" * (MAX_UPLOAD_BYTES + 1)}), 413, "extracts to more than"),
        ("evil", b"plain text", 400, "not a .tar.gz, .tar or .zip archive"),
        ("evil", _tar({"1": b"x", **GOOD}), 400, "a file and a folder at the same path"),
        ("evil", _tar({"config.pbtxt": b"max_batch_size: x\n", **GOOD}), 400, "config.pbtxt"),
        ("evil", _tar({"config.pbtxt": b"max_batch_size: 1\n"}), 400, "has no version folder"),
        ("evil", _tar({"config.pbtxt": b"name: 'x'\n", **GOOD}), 400, "does not match"),
        ("evil", _tar({"1/model.onnx": b"not onnx"}), 400, "did not load"),
        ("evil", _tar({"1/" + "a" * 300: b"x", **GOOD}), 400, "a file or folder name is too long"),
        (".hidden", _tar(GOOD), 400, "model name '.hidden'"),
        (HPT, _tar({"1/model.onnx": b"not onnx"}), 400, "the repository was left as it was"),
    ],
)
def test_bad_uploads_are_4xx_and_write_nothing(
    uploads: tuple[ServerProcess, Path], name: str, body: bytes, status: int, fragment: str
) -> None:
    server, root = uploads
    before = _tree(root)
    got, doc = _put(server, name, body)
    assert got == status, doc
    assert isinstance(doc, dict) and fragment in doc["error"]
    # Paths are redacted: not the repository's, nor the staging folder's (.upload-*).
    assert str(root.parent) not in doc["error"] and ".upload-" not in doc["error"]
    assert _tree(root) == before
    assert not (root.parent / "escape").exists() and not Path("/tmp/escape").exists()
    assert states(server, "evil") == {}
    assert infer(server, HPT, [1.0]).json()["outputs"][0]["data"] == [2.5]


SWAP_UPLOADS = 15
SWAP_EVERY_S = 0.3  # how often an upload starts: the pace of the load, not a bound


def test_uploads_that_replace_the_only_version_fail_no_request(tmp_path: Path) -> None:
    """An upload loop replaces a model's only version (folder 1, then 2, then 3...) while 8
    clients infer naming no version, with frontends beside the model host: each request goes
    to a version that serves (a frontend that routed one to a version the host has just
    retired routes it again), and every answer is the one its version computes."""
    root = tmp_path / "models"
    write_version(root / "swap", 1, numbered_onnx(1))
    args = ["--model-control-mode", "explicit", "--load-model", "swap", "--http-workers", "3"]
    server = ServerProcess(root, extra_args=args).start()
    try:
        traffic = Traffic(server, ["swap"], clients=8, check=right_for_version).start()
        before = wait_for(lambda: sum(traffic.answers.values()), "the clients' first answers")
        for version in range(2, SWAP_UPLOADS + 2):
            started = time.monotonic()
            status, doc = _put(server, "swap", version_archive(version))
            assert status == 200, doc
            time.sleep(max(0.0, SWAP_EVERY_S - (time.monotonic() - started)))
        during = sum(traffic.answers.values()) - before
        answers = traffic.stop()
        last = infer(server, "swap", [1.0]).json()  # the upload answered once every worker has it
        assert last["model_version"] == str(SWAP_UPLOADS + 1), last
        assert last["outputs"][0]["data"] == [0.5 + SWAP_UPLOADS + 1]
    finally:
        server.stop()
    assert dict(answers) == {200: answers[200]}, traffic.failures
    assert traffic.wrong == 0, traffic.failures
    assert during >= SWAP_UPLOADS  # the clients were answered all along the uploads
