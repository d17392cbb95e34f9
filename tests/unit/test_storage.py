"""Storage schemes: listing, fetching and writing (small files, whole model folders), for local
folders and for S3 against a real endpoint on loopback (moto_server)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from inferd.core.errors import InvalidInput
from inferd.repository.local import LocalStorage
from inferd.repository.s3 import S3Storage, _fresh
from inferd.repository.storage import WRITING_MARKER, Storage, StorageError, StorageOptions
from tests.e2e.s3_support import CREDENTIALS, MotoServer


@pytest.fixture(scope="module")
def moto() -> Iterator[MotoServer]:
    server = MotoServer().start()
    yield server
    server.stop()


def _s3(moto: MotoServer, tmp_path: Path, bucket: str) -> S3Storage:
    moto.client().create_bucket(Bucket=bucket)
    options = StorageOptions(
        cache_dir=str(tmp_path / "cache"),
        s3_endpoint_url=moto.url,
        s3_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
        s3_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        s3_region="us-east-1",
    )
    return S3Storage(f"s3://{bucket}/team", options)


@pytest.fixture(params=["local", "s3"])
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> Storage:
    if request.param == "local":
        (tmp_path / "repo").mkdir()
        return LocalStorage(tmp_path / "repo")
    moto: MotoServer = request.getfixturevalue("moto")
    return _s3(moto, tmp_path, f"b{abs(hash(str(tmp_path))) % 10**8}")


def _folder(root: Path, files: dict[str, bytes]) -> Path:
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return root


def test_small_files_are_written_read_and_removed(storage: Storage) -> None:
    assert storage.read("m/routing.json") is None
    storage.write("m/routing.json", b'{"labels": {}}')
    assert storage.read("m/routing.json") == b'{"labels": {}}'
    storage.write("m/routing.json", b"{}")
    assert storage.read("m/routing.json") == b"{}"
    assert set(storage.scan()["m"]) == {"routing.json"}
    storage.remove("m/routing.json")
    storage.remove("m/routing.json")  # absent: nothing happens
    assert storage.read("m/routing.json") is None
    with pytest.raises(InvalidInput, match="leaves its folder"):
        storage.write("../escape", b"x")


def test_put_model_replaces_the_whole_folder(storage: Storage, tmp_path: Path) -> None:
    first = _folder(tmp_path / "first", {"config.pbtxt": b"a", "1/model.onnx": b"one"})
    files = storage.put_model("m", first)
    assert set(files) == {"config.pbtxt", "1/model.onnx"}
    assert storage.scan_model("m") == files
    second = _folder(tmp_path / "second", {"2/model.onnx": b"two!", "1/model.onnx": b"uno"})
    files = storage.put_model("m", second)
    assert set(files) == {"1/model.onnx", "2/model.onnx"}  # config.pbtxt went with the old
    assert storage.scan() == {"m": files}
    folder = storage.fetch("m", files)
    assert (folder / "2" / "model.onnx").read_bytes() == b"two!"
    assert (folder / "1" / "model.onnx").read_bytes() == b"uno"
    assert not (folder / "config.pbtxt").exists()
    assert storage.staging_dir().is_dir()


def test_local_put_model_is_a_rename_in_place(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path / "repo")
    (tmp_path / "repo").mkdir()
    staged = _folder(storage.staging_dir() / ".upload-x" / "m", {"1/model.onnx": b"one"})
    files = storage.put_model("m", staged)
    assert not staged.exists()
    assert sorted(p.name for p in (tmp_path / "repo").iterdir()) == [".upload-x", "m"]
    assert files == storage.scan_model("m")


def test_an_unwritable_local_repository_is_a_storage_error(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path / "missing")
    (tmp_path / "missing").write_text("a file, not a folder")
    with pytest.raises(StorageError, match="cannot write"):
        storage.write("m/routing.json", b"{}")


def test_s3_uploads_fill_the_cache_and_fetch_downloads_nothing(
    moto: MotoServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    storage = _s3(moto, tmp_path, "cached")
    files = storage.put_model("m", _folder(tmp_path / "m", {"1/model.onnx": b"one"}))
    with caplog.at_level("INFO", logger="inferd.repository"):
        storage.fetch("m", files)
    assert "fetched 0 file(s) (0 bytes), 1 unchanged" in caplog.text
    keys = [o["Key"] for o in moto.client().list_objects_v2(Bucket="cached")["Contents"]]
    assert keys == ["team/m/1/model.onnx"]  # the writing marker is gone


def test_s3_a_writing_marker_is_listed_while_fresh(moto: MotoServer, tmp_path: Path) -> None:
    storage = _s3(moto, tmp_path, "marked")
    s3: Any = moto.client()
    s3.put_object(Bucket="marked", Key="team/m/1/model.onnx", Body=b"one")
    s3.put_object(Bucket="marked", Key=f"team/m/{WRITING_MARKER}", Body=b"")
    listed = storage.scan()["m"]
    assert set(listed) == {"1/model.onnx", WRITING_MARKER}
    assert storage.scan_model("m") == listed
    folder = storage.fetch("m", listed)
    assert sorted(p.name for p in folder.rglob("*")) == ["1", "model.onnx"]
    old = datetime.now(UTC) - timedelta(hours=1)
    assert _fresh({"Key": "k", "LastModified": datetime.now(UTC)})
    assert not _fresh({"Key": "k", "LastModified": old})


def test_s3_an_unreachable_store_is_a_storage_error(tmp_path: Path) -> None:
    options = StorageOptions(
        cache_dir=str(tmp_path),
        s3_endpoint_url="http://127.0.0.1:9",  # nothing listens on the discard port
        s3_access_key_id="x",
        s3_secret_access_key="y",
        s3_region="us-east-1",
    )
    storage = S3Storage("s3://nowhere", options)
    for call in (storage.scan, lambda: storage.write("m/r.json", b"{}")):
        with pytest.raises(StorageError, match="is unreachable"):
            call()
