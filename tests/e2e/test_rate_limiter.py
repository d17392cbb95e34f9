"""Triton's rate limiter through real sockets, in the default layout (a model host and two
frontends): Python models that share a resource never execute at once, an ask beyond what
exists fails the load naming the resource, priorities share the turns, and the limiter is off
by default. The models record what runs at once in files (a counter under ``flock``), so
nothing here depends on timing."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support import ServerProcess, wait_for

WORKERS = ["--http-workers", "3"]

# Each execution: count itself in (under an exclusive lock), note the most running at once and
# its turn, hold for a while (until another model runs beside it, with a "barrier" file), out.
MODEL = """
import fcntl
import json
import os
import time

import triton_python_backend_utils as pb_utils


def _update(folder, change, name=""):
    with open(os.path.join(folder, "lock"), "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        path = os.path.join(folder, "state.json")
        state = {"running": 0, "most": 0}
        if os.path.exists(path):
            with open(path) as f:
                state = json.load(f)
        state["running"] += change
        state["most"] = max(state["most"], state["running"])
        with open(path, "w") as f:
            json.dump(state, f)
        if name:
            with open(os.path.join(folder, "turns"), "a") as f:
                f.write(name + "\\n")
        return state["running"]


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.name = config["name"]
        self.folder = config["parameters"]["folder"]["string_value"]

    def execute(self, requests):
        _update(self.folder, 1, self.name)
        barrier = os.path.exists(os.path.join(self.folder, "barrier"))
        deadline = time.monotonic() + (10 if barrier else 0.05)
        while time.monotonic() < deadline:
            if barrier and _update(self.folder, 0) >= 2:
                break
            time.sleep(0.005)
        _update(self.folder, -1)
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "x").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("y", x + 1)]))
        return responses
"""


def _config(name: str, folder: Path, limiter: str) -> str:
    return f"""
name: "{name}"
backend: "python"
input [ {{ name: "x" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "y" data_type: TYPE_FP32 dims: [ 1 ] }} ]
instance_group [ {{ count: 2 kind: KIND_CPU {limiter} }} ]
parameters {{ key: "folder" value: {{ string_value: "{folder}" }} }}
"""


R1_4 = 'rate_limiter { resources [ { name: "R1" count: 4 } ] }'
MODELS = {
    "a": R1_4,
    "b": R1_4,
    "greedy": 'rate_limiter { resources [ { name: "R1" count: 8 } ] }',
    "p1": 'rate_limiter { resources [ { name: "P" global: true count: 1 } ] priority: 1 }',
    "p2": 'rate_limiter { resources [ { name: "P" global: true count: 1 } ] priority: 2 }',
}


def _repository(root: Path) -> Path:
    repo = root / "models"
    for name, limiter in MODELS.items():
        folder = root / "state" / ("p" if name.startswith("p") else "ab")
        folder.mkdir(parents=True, exist_ok=True)
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "1" / "model.py").write_text(MODEL)
        (repo / name / "config.pbtxt").write_text(_config(name, folder, limiter))
    return repo


def _serve(root: Path, *flags: str) -> ServerProcess:
    repo = _repository(root)
    args = ["--model-control-mode", "explicit", *WORKERS, *flags]
    for name in ("a", "b", "p1", "p2"):
        args += ["--load-model", name]
    return ServerProcess(repo, args).start(timeout_s=180)


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    server = _serve(
        tmp_path_factory.mktemp("limited"), "--rate-limit", "execution_count",
        "--rate-limit-resource", "R1:4",
    )  # fmt: skip
    yield server
    server.stop()


def _infer(server: ServerProcess, model: str, value: float = 1.0) -> float:
    body = {"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [value]}]}
    r = httpx.post(f"{server.http_url}/v2/models/{model}/infer", json=body, timeout=120)
    assert r.status_code == 200, r.text
    result: float = r.json()["outputs"][0]["data"][0]
    return result


def _hammer(server: ServerProcess, models: list[str], clients: int, each: int) -> list[float]:
    """``clients`` threads per model, each sending ``each`` requests one after another."""
    results: list[float] = []
    lock = threading.Lock()

    def client(model: str) -> None:
        for i in range(each):
            y = _infer(server, model, float(i))
            with lock:
                results.append(y - i)

    threads = [threading.Thread(target=client, args=(m,)) for m in models for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def _state(server: ServerProcess, group: str) -> str:
    return (server.repository.parent / "state" / group / "state.json").read_text()


def test_models_sharing_a_resource_never_execute_at_once(limited: ServerProcess) -> None:
    results = _hammer(limited, ["a", "b"], clients=4, each=6)
    assert results == [1.0] * 48
    assert '"most": 1' in _state(limited, "ab")  # four instances, one execution at a time
    turns = (limited.repository.parent / "state" / "ab" / "turns").read_text().split()
    assert sorted(set(turns)) == ["a", "b"] and len(turns) == 48
    # Triton's statistics count the wait as queue time; the metric has it alone.
    stats = httpx.get(f"{limited.http_url}/v2/models/a/stats", timeout=30).json()
    inference = stats["model_stats"][0]["inference_stats"]
    assert inference["success"]["count"] == 24 and inference["queue"]["ns"] > 0
    metrics = httpx.get(f"{limited.http_url}/metrics", timeout=30).text
    waits = re.search(
        r'inferd_rate_limiter_wait_duration_seconds_count\{model="a",version="1"\} (\S+)', metrics
    )
    assert waits is not None and float(waits.group(1)) == 24
    assert 'inferd_rate_limiter_resource_count{device="0",resource="R1"} 4.0' in metrics
    assert 'inferd_rate_limiter_resource_in_use{device="0",resource="R1"} 0.0' in metrics


def test_an_ask_beyond_what_exists_fails_the_load_naming_it(limited: ServerProcess) -> None:
    r = httpx.post(f"{limited.http_url}/v2/repository/models/greedy/load", timeout=120)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert 'resource "R1"' in error and "limited to 4" in error and "is 8" in error
    index = httpx.post(f"{limited.http_url}/v2/repository/index", timeout=30).json()
    greedy = next(e for e in index if e["name"] == "greedy")
    assert greedy.get("state") != "READY"
    assert _infer(limited, "a") == 2.0  # the others keep serving


def test_priority_two_gets_half_the_turns_of_priority_one(limited: ServerProcess) -> None:
    """p1 and p2 (two instances each) share one copy of a global resource; every instance
    always has a request waiting, so the turns follow the priorities."""
    _hammer(limited, ["p1", "p2"], clients=10, each=9)  # many waiting: none runs dry
    assert '"most": 1' in _state(limited, "p")
    turns = (limited.repository.parent / "state" / "p" / "turns").read_text().split()
    assert len(turns) == 180
    window = turns[10:100]  # both models have requests waiting throughout this stretch
    ones, twos = window.count("p1"), window.count("p2")
    assert 1.4 <= ones / twos <= 2.8, (ones, twos)  # 2 exactly, in Triton's round robin


def test_the_limiter_is_off_by_default(tmp_path: Path) -> None:
    server = _serve(tmp_path)
    try:
        (tmp_path / "state" / "ab" / "barrier").write_text("")  # hold until both run at once
        assert _hammer(server, ["a", "b"], clients=1, each=1) == [1.0, 1.0]
        wait_for(lambda: '"most": 2' in _state(server, "ab") or None, "a and b at once")
        r = httpx.post(f"{server.http_url}/v2/repository/models/greedy/load", timeout=120)
        assert r.status_code == 200, r.text  # rate_limiter is ignored when the limiter is off
        assert "inferd_rate_limiter" not in httpx.get(f"{server.http_url}/metrics", timeout=60).text
    finally:
        server.stop()
