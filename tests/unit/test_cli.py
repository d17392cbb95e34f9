"""``inferd serve``: configuration errors are one line and exit code 2; "listening" is logged
only once the port is bound."""

from __future__ import annotations

import argparse
import os
import platform
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import ServerProcess, free_port


def _serve(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "inferd", "serve", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_bad_flag_value_is_one_line_and_exit_2(tmp_path: Path) -> None:
    done = _serve("--model-repository", str(tmp_path), "--http-port", "eighty")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].startswith("inferd: invalid value for --http-port:")
    assert "Traceback" not in done.stderr


def test_missing_repository_and_bad_modes_exit_2() -> None:
    done = _serve()
    assert done.returncode == 2
    assert "--model-repository is required" in done.stderr
    done = _serve("--model-repository", "/tmp", "--model-control-mode", "sometimes")
    assert done.returncode == 2
    assert "--model-control-mode must be none, poll or explicit" in done.stderr
    done = _serve("--model-repository", "/tmp", "--log-format", "xml")
    assert done.returncode == 2 and "--log-format must be text or json" in done.stderr


def test_a_port_in_use_is_a_clear_error_and_nothing_claims_to_listen(tmp_path: Path) -> None:
    (tmp_path / "models").mkdir()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = _serve(
            "--model-repository",
            str(tmp_path / "models"),
            "--http-address",
            "127.0.0.1",
            "--http-port",
            str(port),
            "--grpc-port",
            str(free_port()),
        )
    assert done.returncode == 2
    assert f"cannot serve HTTP on 127.0.0.1:{port}" in done.stderr
    assert "listening: HTTP" not in done.stderr
    assert "Traceback" not in done.stderr


def test_listening_is_logged_after_the_bind(demo_repo: Path) -> None:
    # gRPC on its default address (tests/support.py binds it to loopback otherwise)
    server = ServerProcess(demo_repo, extra_args=["--grpc-address", "0.0.0.0"]).start()
    try:
        log = server.log()
        assert (
            f"listening: HTTP (KServe v2, TF Serving REST) on 127.0.0.1:{server.http_port}" in log
        )
        grpc_line = "listening: gRPC (KServe v2 / Triton, TF Serving) on 0.0.0.0"
        assert f"{grpc_line}:{server.grpc_port} (native server)" in log
    finally:
        server.stop()


def _parsers(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                yield from _parsers(child)


def test_help_prints_no_double_backticks() -> None:
    """Docstrings and help texts write ``x``; a terminal shows `x`."""
    from inferd.cli import build_parser

    found = list(_parsers(build_parser()))
    assert len(found) >= 8  # inferd and its subcommands
    for parser in found:
        text = parser.format_help()
        assert "``" not in text, parser.prog
    assert "The `inferd` command line" in found[0].format_help()
    done = subprocess.run(
        [sys.executable, "-m", "inferd", "--help"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and "``" not in done.stdout and "`inferd`" in done.stdout


MAPPED_PROBE = """
import ctypes, sys
from inferd import cli
if sys.argv[1] == "set":
    cli._large_blocks_mapped()
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]
libc.mallinfo2.restype = Info
libc.free(libc.malloc(1 << 20))  # glibc alone: the threshold rises past 1 MiB here
mapped = libc.mallinfo2().hblkhd
block = libc.malloc(1 << 20)
print(libc.mallinfo2().hblkhd - mapped >= 1 << 20)
"""


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc",
    reason="glibc's allocator",
)
def test_the_server_maps_large_blocks_of_their_own_and_keeps_the_operators_threshold() -> None:
    # A burst of large request bodies otherwise comes from the heap and leaves it large.
    def run(how: str, **env: str) -> str:
        found = subprocess.run(
            [sys.executable, "-c", MAPPED_PROBE, how],
            capture_output=True,
            text=True,
            env={**os.environ, **env},
            timeout=120,
            check=True,
        )
        return found.stdout.strip()

    assert run("glibc") == "False"
    assert run("set") == "True"
    assert run("set", GLIBC_TUNABLES="glibc.malloc.mmap_threshold=4194304") == "False"


def test_the_server_has_granians_allocator_give_freed_pages_back_unless_configured(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # jemalloc's default kept what a storm of requests took in an idle serving process.
    from inferd import cli

    monkeypatch.delenv("_RJEM_MALLOC_CONF", raising=False)
    cli._granian_gives_back()
    assert os.environ["_RJEM_MALLOC_CONF"] == "dirty_decay_ms:0,muzzy_decay_ms:0"
    monkeypatch.setenv("_RJEM_MALLOC_CONF", "narenas:2")
    cli._granian_gives_back()
    assert os.environ["_RJEM_MALLOC_CONF"] == "narenas:2"
