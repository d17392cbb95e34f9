"""Poll mode: versions and models added, changed or removed in the repository follow on their
own, and a version swap under continuous load fails no request."""

from __future__ import annotations

import asyncio
import io
import shutil
import tarfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.e2e.lifecycle_support import (
    HALF_PLUS_THREE,
    HPT,
    HTTP,
    index,
    infer,
    remove_version,
    states,
    write_version,
    x_body,
)
from tests.support import ServerProcess, wait_for

CLIENTS = 4


@pytest.fixture(scope="module")
def polled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, Path]]:
    root = tmp_path_factory.mktemp("poll") / "models"
    write_version(root / HPT, 1)
    write_version(root / "swap", 1)
    args = ["--model-control-mode", "poll", "--repository-poll-secs", "1"]
    server = ServerProcess(root, extra_args=args).start()
    yield server, root
    server.stop()


def _version_of(server: ServerProcess, model: str) -> str:
    r = infer(server, model, [1.0])
    return str(r.json().get("model_version", "")) if r.status_code == 200 else ""


def test_poll_adds_a_new_version_and_drops_a_removed_one(
    polled: tuple[ServerProcess, Path],
) -> None:
    server, root = polled
    assert states(server, HPT) == {"1": "READY"}
    write_version(root / HPT, 2, HALF_PLUS_THREE)
    wait_for(lambda: _version_of(server, HPT) == "2", "version 2 to serve")
    assert infer(server, HPT, [1.0]).json()["outputs"][0]["data"] == [3.5]
    # The default policy serves the latest version: 1 was retired, its folder is still there.
    wait_for(lambda: states(server, HPT) == {"1": "UNAVAILABLE", "2": "READY"}, "1 retired")
    status = HTTP.get(f"{server.http_url}/v1/models/{HPT}").json()["model_version_status"]
    assert [(s["version"], s["state"]) for s in status] == [("2", "AVAILABLE"), ("1", "END")]
    remove_version(root / HPT, 1)
    wait_for(lambda: states(server, HPT) == {"2": "READY"}, "version 1 to leave the index")
    assert "polling the model repository every 1 s" in server.log()


def test_poll_loads_new_models_and_unloads_removed_ones(polled: tuple[ServerProcess, Path]) -> None:
    server, root = polled
    write_version(root / "fresh", 1, HALF_PLUS_THREE)
    wait_for(lambda: states(server, "fresh") == {"1": "READY"}, "the new model")
    assert infer(server, "fresh", [2.0]).json()["outputs"][0]["data"] == [4.0]
    aside = root / ".fresh-gone"
    (root / "fresh").rename(aside)
    shutil.rmtree(aside)
    wait_for(lambda: "fresh" not in {e["name"] for e in index(server)}, "the model to go")
    r = infer(server, "fresh", [2.0])
    assert r.status_code == 404 and "unknown model: 'fresh' is not" in r.json()["error"]


def test_a_changed_config_reloads_the_model(polled: tuple[ServerProcess, Path]) -> None:
    server, root = polled
    config_url = f"{server.http_url}/v2/models/{HPT}/config"
    assert HTTP.get(config_url).json()["max_batch_size"] == 64
    (root / HPT / "config.pbtxt").write_text(f'name: "{HPT}"\nmax_batch_size: 4\n')
    wait_for(lambda: HTTP.get(config_url).json()["max_batch_size"] == 4, "the new config")
    (root / HPT / "config.pbtxt").write_text(f'name: "{HPT}"\nmax_batch_size: -3\n')
    wait_for(lambda: "reload failed" in server.log(), "the failed reload")
    assert HTTP.get(config_url).json()["max_batch_size"] == 4  # the last good one serves on
    assert infer(server, HPT, [1.0]).status_code == 200
    (root / HPT / "config.pbtxt").unlink()
    wait_for(lambda: HTTP.get(config_url).json()["max_batch_size"] == 64, "the default config")


async def _hammer(
    server: ServerProcess, stop: asyncio.Event, seen: list[list[tuple[int, str]]]
) -> None:
    async def one(log: list[tuple[int, str]]) -> None:
        async with httpx.AsyncClient(base_url=server.http_url, timeout=30) as client:
            value = 0.0
            while not stop.is_set():
                value += 1.0
                r = await client.post("/v2/models/swap/infer", json=x_body([value]))
                doc = r.json()
                version = doc.get("model_version", doc.get("error", ""))
                log.append((r.status_code, str(version)))

    await asyncio.gather(*(one(log) for log in seen))


def test_no_request_fails_while_versions_swap(polled: tuple[ServerProcess, Path]) -> None:
    server, root = polled
    seen: list[list[tuple[int, str]]] = [[] for _ in range(CLIENTS)]

    async def run() -> None:
        stop = asyncio.Event()
        load = asyncio.create_task(_hammer(server, stop, seen))

        async def until(what: str, check: object) -> None:
            for _ in range(300):
                if callable(check) and check():
                    return
                await asyncio.sleep(0.1)
            raise AssertionError(f"timed out waiting for {what}")

        def served(version: str) -> bool:
            return all(log and log[-1][1] == version for log in seen)

        await until("the first answers", lambda: served("1"))
        write_version(root / "swap", 2)
        await until("version 2 everywhere", lambda: served("2"))
        remove_version(root / "swap", 1)
        write_version(root / "swap", 3)
        await until("version 3 everywhere", lambda: served("3"))
        remove_version(root / "swap", 2)
        await asyncio.to_thread(
            wait_for, lambda: states(server, "swap") == {"3": "READY"}, "2 to leave the index"
        )
        stop.set()
        await load

    asyncio.run(run())
    answers = [a for log in seen for a in log]
    assert len(answers) > 100
    failures = [a for a in answers if a[0] != 200]
    assert failures == []
    for log in seen:  # each client moved forward only: 1 ... 2 ... 3
        versions = [int(v) for _, v in log]
        assert versions == sorted(versions)
        assert versions[0] == 1 and versions[-1] == 3


def test_an_upload_in_poll_mode_is_written_and_served(polled: tuple[ServerProcess, Path]) -> None:
    server, root = polled
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        info = tarfile.TarInfo("1/model.onnx")
        info.size = len(HALF_PLUS_THREE)
        tar.addfile(info, io.BytesIO(HALF_PLUS_THREE))
    r = HTTP.put(f"{server.http_url}/v2/repository/models/pushed", content=buffer.getvalue())
    assert r.status_code == 200, r.text
    assert (root / "pushed" / "1" / "model.onnx").read_bytes() == HALF_PLUS_THREE
    assert infer(server, "pushed", [1.0]).json()["outputs"][0]["data"] == [3.5]
    r = HTTP.post(f"{server.http_url}/v2/repository/models/pushed/unload")
    assert r.status_code == 400 and "mode is 'poll'" in r.json()["error"]
