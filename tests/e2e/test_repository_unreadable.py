"""A model repository folder that cannot be read stops ``inferd serve`` at start (exit code 2,
the path named), as Triton's ``--exit-on-error`` (on by default) does: a typo in a path must not
give a server that passes readiness with no model. ``--exit-on-error=false`` starts without it.
(An s3:// repository that does not answer at start serves its cache: test_s3_offline_start.py.)
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

import inferd
from tests.e2e.lifecycle_support import states
from tests.echo_support import BATCHED as ECHO
from tests.support import ServerProcess, wait_for

LAYOUTS = {"one process": ["--http-workers", "1"], "default layout": ["--http-workers", "3"]}


def _exit_of(server: ServerProcess) -> tuple[int | None, str]:
    """Start a server that should not start: its exit code and its output."""
    with pytest.raises(RuntimeError, match="inferd exited with"):
        server.start(timeout_s=120)
    assert server.proc is not None
    return server.proc.returncode, server.log()


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_repository_that_does_not_exist_stops_the_server(tmp_path: Path, layout: str) -> None:
    missing = tmp_path / "nope"
    code, output = _exit_of(ServerProcess(missing, extra_args=LAYOUTS[layout]))
    assert code == 2
    assert f"inferd: model repository '{missing}' is not a directory: no such path" in output
    assert "listening" not in output and "server ready" not in output


def test_a_file_given_as_the_repository_stops_the_server(tmp_path: Path) -> None:
    file = tmp_path / "models.txt"
    file.write_text("not a folder")
    code, output = _exit_of(ServerProcess(file, extra_args=LAYOUTS["default layout"]))
    assert code == 2
    assert f"model repository '{file}' is not a directory" in output


def test_one_unreadable_repository_of_two_stops_the_server(tmp_path: Path) -> None:
    good = tmp_path / "good"
    (good / "echo" / "1").mkdir(parents=True)
    (good / "echo" / "config.pbtxt").write_text(ECHO)
    missing = tmp_path / "typo"
    args = [*LAYOUTS["default layout"], "--model-repository", str(missing)]
    code, output = _exit_of(ServerProcess(good, extra_args=args))
    assert code == 2
    assert f"model repository '{missing}' is not a directory" in output
    assert f"'{good}'" not in output.split("inferd: model repository", 1)[1]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_exit_on_error_false_starts_without_it(tmp_path: Path, layout: str) -> None:
    missing = tmp_path / "later"
    args = [*LAYOUTS[layout], "--exit-on-error=false", "--model-control-mode", "poll"]
    args += ["--repository-poll-secs", "1"]
    server = ServerProcess(missing, extra_args=args).start()
    try:
        assert f"model repository '{missing}' is not a directory" in server.log()
        ready = httpx.get(f"{server.http_url}/v2/health/ready", timeout=30)
        assert ready.status_code == 200
        index = httpx.post(f"{server.http_url}/v2/repository/index", json={}, timeout=30)
        assert index.json() == []
        (missing / "echo" / "1").mkdir(parents=True)  # the folder appears: a poll loads it
        (missing / "echo" / "config.pbtxt").write_text(ECHO)
        wait_for(lambda: states(server, "echo") == {"1": "READY"}, "the model of the new folder")
    finally:
        server.stop()


def test_the_python_server_raises_naming_the_folder(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(inferd.ConfigError) as info:
        inferd.Server(model_repository=str(missing)).open()
    assert f"model repository '{missing}' is not a directory: no such path" in info.value.message
    with inferd.Server(model_repository=str(missing), exit_on_error=False) as server:
        assert server.ready and server.models() == []
