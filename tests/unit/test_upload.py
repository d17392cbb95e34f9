"""Uploads: archive extraction refuses unsafe entries and oversize archives, installs atomically."""

from __future__ import annotations

import errno
import io
import stat
import tarfile
import zipfile
from collections.abc import Sequence
from pathlib import Path

import pytest

from inferd.core.errors import InvalidInput, PayloadTooLarge
from inferd.repository import upload

CONFIG = b'name: "m"\n'


def _tar(entries: Sequence[tarfile.TarInfo | tuple[str, bytes]], mode: str = "w:gz") -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode=mode) as tar:  # type: ignore[call-overload]
        for entry in entries:
            if isinstance(entry, tarfile.TarInfo):
                tar.addfile(entry)
            else:
                name, data = entry
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _zip(entries: list[tuple[str, bytes]], link: str = "") -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in entries:
            archive.writestr(name, data)
        if link:
            info = zipfile.ZipInfo(link)
            info.external_attr = (stat.S_IFLNK | 0o777) << 16
            archive.writestr(info, "/etc/passwd")
    return buffer.getvalue()


def _special(name: str, kind: bytes, linkname: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = linkname
    return info


GOOD = [("config.pbtxt", CONFIG), ("1/model.onnx", b"onnx")]


def test_tar_gz_and_zip_extract_the_model(tmp_path: Path) -> None:
    for i, data in enumerate((_tar(GOOD), _tar(GOOD, "w"), _zip(GOOD))):
        staging = upload.new_staging(tmp_path)
        staged = upload.stage_archive(data, staging, "m", 1 << 20)
        assert staged == staging / "m", i
        assert (staged / "1" / "model.onnx").read_bytes() == b"onnx"
        assert (staged / "config.pbtxt").read_bytes() == CONFIG


def test_a_single_top_level_folder_is_the_model(tmp_path: Path) -> None:
    data = _tar([("./resnet/config.pbtxt", CONFIG), ("./resnet/1/model.onnx", b"x")])
    staged = upload.stage_archive(data, upload.new_staging(tmp_path), "m", 1 << 20)
    assert sorted(p.relative_to(staged).as_posix() for p in staged.rglob("*")) == [
        "1",
        "1/model.onnx",
        "config.pbtxt",
    ]


@pytest.mark.parametrize(
    ("entries", "fragment"),
    [
        ([("../evil", b"x")], "leaves its folder"),
        ([("1/../../evil", b"x")], "leaves its folder"),
        ([("/etc/evil", b"x")], "absolute path"),
        ([_special("1/link", tarfile.SYMTYPE, "/etc/passwd")], "is a link"),
        ([_special("1/hard", tarfile.LNKTYPE, "config.pbtxt")], "is a link"),
        ([_special("1/dev", tarfile.CHRTYPE)], "device or FIFO"),
        ([_special("1/fifo", tarfile.FIFOTYPE)], "device or FIFO"),
    ],
)
def test_unsafe_tar_entries_are_refused(
    tmp_path: Path, entries: list[tarfile.TarInfo | tuple[str, bytes]], fragment: str
) -> None:
    dest = tmp_path / "dest"
    dest.mkdir()
    with pytest.raises(InvalidInput) as info:
        upload.extract_archive(_tar([*GOOD, *entries]), dest, 1 << 20)
    assert fragment in info.value.message
    assert not (tmp_path / "evil").exists()


def test_unsafe_zip_entries_are_refused(tmp_path: Path) -> None:
    for data, fragment in (
        (_zip([*GOOD, ("../evil", b"x")]), "leaves its folder"),
        (_zip([*GOOD, ("/abs", b"x")]), "absolute path"),
        (_zip(GOOD, link="1/link"), "is a link"),
    ):
        dest = upload.new_staging(tmp_path)
        with pytest.raises(InvalidInput) as info:
            upload.extract_archive(data, dest, 1 << 20)
        assert fragment in info.value.message
    assert not (tmp_path / "evil").exists()


def test_size_limits_count_the_archive_and_what_it_extracts_to(tmp_path: Path) -> None:
    big = [("config.pbtxt", CONFIG), ("1/model.onnx", b"\0" * 100_000)]
    data = _tar(big)
    assert len(data) < 10_000  # zeros compress: only the extracted size is over the limit
    with pytest.raises(PayloadTooLarge) as info:
        upload.extract_archive(data, upload.new_staging(tmp_path), 50_000)
    assert "extracts to more than 50000 bytes" in info.value.message
    with pytest.raises(PayloadTooLarge) as info:
        upload.extract_archive(data, upload.new_staging(tmp_path), 100)
    assert "over the limit of 100" in info.value.message


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        (b"not an archive at all", "not a .tar.gz, .tar or .zip"),
        (b"\x1f\x8b\x08\x00garbage", "archive is corrupt"),
    ],
)
def test_garbage_is_refused(tmp_path: Path, data: bytes, fragment: str) -> None:
    with pytest.raises(InvalidInput) as info:
        upload.extract_archive(data, upload.new_staging(tmp_path), 1 << 20)
    assert fragment in info.value.message


def test_the_model_is_validated_before_it_is_written(tmp_path: Path) -> None:
    cases = [
        ([("config.pbtxt", CONFIG)], "has no version folder"),
        ([("config.pbtxt", b"name: 'm'\nno_such_field: 1\n"), ("1/a", b"x")], "no_such_field"),
        ([("config.pbtxt", b'name: "other"\n'), ("1/a", b"x")], "does not match"),
    ]
    for entries, fragment in cases:
        with pytest.raises(InvalidInput) as info:
            upload.stage_archive(_tar(entries), upload.new_staging(tmp_path), "m", 1 << 20)
        assert fragment in info.value.message


def test_install_swaps_and_restore_undoes(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    (root / "m" / "1").mkdir(parents=True)
    (root / "m" / "1" / "model.onnx").write_bytes(b"old")
    staging = upload.new_staging(root)
    staged = upload.stage_archive(_tar(GOOD), staging, "m", 1 << 20)
    previous = upload.install(staged, root / "m")
    assert (root / "m" / "1" / "model.onnx").read_bytes() == b"onnx"
    assert previous is not None and (previous / "1" / "model.onnx").read_bytes() == b"old"
    upload.restore(root / "m", previous, staging)
    assert (root / "m" / "1" / "model.onnx").read_bytes() == b"old"
    upload.remove_tree(staging)
    assert sorted(p.name for p in root.iterdir()) == ["m"]


def test_model_names_must_be_safe_folder_names() -> None:
    assert upload.check_model_name("resnet-50_v1.2") == "resnet-50_v1.2"
    for bad in ("..", ".hidden", "a/b", "", "a b"):
        with pytest.raises(InvalidInput):
            upload.check_model_name(bad)


def test_write_files_refuses_paths_outside(tmp_path: Path) -> None:
    upload.write_files({"1/model.onnx": b"x"}, tmp_path / "m", 100)
    assert (tmp_path / "m" / "1" / "model.onnx").read_bytes() == b"x"
    for bad in ("../x", "/x", "1//x"):
        with pytest.raises(InvalidInput):
            upload.write_files({bad: b"x"}, tmp_path / "m", 100)
    with pytest.raises(PayloadTooLarge):
        upload.write_files({"1/big": b"x" * 101}, tmp_path / "m", 100)


def test_only_the_clients_oserrors_become_400s() -> None:
    too_long = OSError(errno.ENAMETOOLONG, "File name too long", "/x/" + "a" * 300)
    refused = upload.client_path_error(too_long, "file parameter 'file:x'")
    assert isinstance(refused, InvalidInput)
    assert refused.message == (
        "file parameter 'file:x': a file or folder name is too long (at most 255 bytes each)"
    )
    full = OSError(errno.ENOSPC, "No space left on device")
    with pytest.raises(OSError) as raised:
        upload.client_path_error(full, "file parameter 'file:x'")  # the server's trouble: a 500
    assert raised.value is full
