"""TorchServe's inference API over real archives and handlers: bodies, errors, batching,
worker crashes and timeouts, metrics, versions placed in the repository by hand."""

from __future__ import annotations

import concurrent.futures
import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.e2e.torchserve_support import Ports, torchserve_store
from tests.support import ServerProcess

__all__ = ["torchserve_store"]

LINEAR_BODY = b'{\n  "y": [\n    2.0,\n    6.0\n  ]\n}'  # x = [1, 2, 3, 4], as TorchServe writes it
INPUT = b'{"x": [1, 2, 3, 4]}'


@pytest.fixture(scope="module")
def ports() -> Ports:
    return Ports()


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory, torchserve_store: Path) -> Path:
    """A model repository holding one archive placed by hand (version 1 of 'hand')."""
    root = tmp_path_factory.mktemp("ts-repo") / "models"
    (root / "hand" / "1").mkdir(parents=True)
    shutil.copy(torchserve_store / "linear.mar", root / "hand" / "1" / "linear.mar")
    return root


@pytest.fixture(scope="module")
def served(repository: Path, torchserve_store: Path, ports: Ports) -> Iterator[ServerProcess]:
    server = ServerProcess(
        repository,
        [
            "--model-store",
            str(torchserve_store),
            "--models",
            "linear=linear.mar",
            "echo=echo.mar",
            "batched=batched",
            "slow=slow.mar",
            "streaming=streaming.mar",
            "--model-control-mode",
            "poll",
            "--repository-poll-secs",
            "1",
            # versions copied in later run their handler too (inferd.security.trust)
            "--allow-python-models",
            "always",
            *ports.args(),
        ],
    ).start(timeout_s=120)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def client(served: ServerProcess, ports: Ports) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=ports.inference_url, timeout=60) as session:
        yield session


def error(response: httpx.Response) -> dict[str, object]:
    found: dict[str, object] = response.json()
    return found


def test_ping_and_the_api_description(client: httpx.Client) -> None:
    ping = client.get("/ping")
    assert ping.status_code == 200
    assert ping.text == '{\n  "status": "Healthy"\n}\n'
    described = client.options("/")
    assert described.status_code == 200
    doc = described.json()
    assert doc["openapi"] == "3.0.1"
    assert "/predictions/{model_name}/{model_version}" in doc["paths"]
    assert client.get("/api-description").json() == doc


def test_raw_body_as_curl_sends_it(client: httpx.Client) -> None:
    """``curl -T file`` is a PUT with no content type; the handler's JSON comes back as is."""
    answer = client.put("/predictions/linear", content=INPUT)
    assert answer.status_code == 200
    assert answer.content == LINEAR_BODY
    assert "content-type" not in answer.headers  # TorchServe sets none unless the handler does
    assert len(answer.headers["x-request-id"]) == 36  # a UUID, as TorchServe's


def test_json_body_and_versions(client: httpx.Client) -> None:
    headers = {"content-type": "application/json"}
    for path in ("/predictions/linear", "/predictions/linear/1.0", "/predictions/linear/1"):
        answer = client.post(path, content=INPUT, headers=headers)
        assert answer.status_code == 200, path
        assert answer.content == LINEAR_BODY


def test_multipart_form_and_text(client: httpx.Client) -> None:
    answer = client.post(
        "/predictions/echo",
        files={"data": ("in.json", INPUT, "application/octet-stream")},
        data={"other": "hello"},
    )
    assert answer.status_code == 200
    assert answer.json() == {
        "params": {"other": "bytearray", "data": "bytearray"},
        "values": {"other": "hello", "data": INPUT.decode()},
        "explain": "False",
        "url_path": "",
    }
    form = client.post("/predictions/echo/1.0/a/b", data={"a": "1", "b": "x y"})
    assert form.json()["values"] == {"a": "1", "b": "x y"}
    assert form.json()["url_path"] == "a/b"
    text = client.post("/predictions/echo", content=b"hi", headers={"content-type": "text/plain"})
    assert text.json()["params"] == {"body": "str"}
    parsed = client.post("/predictions/echo", json={"k": [1]})
    assert parsed.json()["values"] == {"body": {"k": [1]}}


def test_explanations(client: httpx.Client) -> None:
    answer = client.post("/explanations/linear", content=INPUT)
    assert answer.status_code == 200
    assert answer.json() == {"target": 0, "width": 4}
    echo = client.post("/explanations/echo", content=b"x")
    assert echo.json()["explain"] == "True"


def test_status_and_content_type_set_by_the_handler(client: httpx.Client) -> None:
    created = client.post(
        "/predictions/echo", content=b"created", headers={"content-type": "text/plain"}
    )
    assert created.status_code == 201
    csv = client.post("/predictions/echo", content=b"csv", headers={"content-type": "text/plain"})
    assert csv.status_code == 200
    assert csv.headers["content-type"] == "text/csv"
    assert csv.content == b"a,b\n1,2\n"


def test_errors_in_torchserve_shape(client: httpx.Client) -> None:
    missing = client.post("/predictions/nope", content=b"x")
    assert missing.status_code == 404
    assert error(missing) == {
        "code": 404,
        "type": "ModelNotFoundException",
        "message": "Model not found: nope",
    }
    version = client.post("/predictions/linear/9.0", content=b"x")
    assert version.status_code == 404
    assert error(version)["message"] == "Model version: 9.0 does not exist for model: linear"
    refused = client.post("/predictions/linear", json="fail")
    assert refused.status_code == 418
    assert error(refused) == {
        "code": 418,
        "type": "InternalServerException",
        "message": "the input says fail",
    }
    broken = client.post("/predictions/linear", json="crash")
    assert broken.status_code == 503
    assert error(broken) == {
        "code": 503,
        "type": "InternalServerException",
        "message": "Prediction failed",
    }
    route = client.get("/nothing/here")
    assert route.status_code == 404
    assert error(route)["type"] == "ResourceNotFoundException"
    assert client.put("/predictions/linear", content=INPUT).content == LINEAR_BODY


def _until_ok(client: httpx.Client, path: str, body: bytes, limit_s: float = 60) -> httpx.Response:
    deadline = time.monotonic() + limit_s
    while True:
        answer = client.post(path, content=body)
        if answer.status_code == 200 or time.monotonic() > deadline:
            return answer
        time.sleep(0.2)


def test_a_crashed_worker_is_restarted_and_others_serve_on(client: httpx.Client) -> None:
    died = client.post("/predictions/linear", json="exit")
    assert died.status_code == 500
    assert error(died) == {
        "code": 500,
        "type": "InternalServerException",
        "message": "Worker died.",
    }
    assert client.post("/predictions/echo", content=b"x").status_code == 200
    assert _until_ok(client, "/predictions/linear", INPUT).content == LINEAR_BODY


def test_response_timeout_ends_the_worker(client: httpx.Client) -> None:
    slow = client.post(
        "/predictions/slow", content=b"sleep", headers={"content-type": "application/x-raw"}
    )
    assert slow.status_code == 500
    assert error(slow)["message"] == "Worker died."
    assert _until_ok(client, "/predictions/slow", b"quick").text == "done"


def test_requests_are_batched_by_the_dynamic_batcher(client: httpx.Client) -> None:
    """Each request of a batch gets its own answer, never a neighbour's."""
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(
            pool.map(lambda i: client.post("/predictions/batched", content=b"%d" % i), range(24))
        )
    found = [a.json() for a in answers]
    assert all(a.status_code == 200 for a in answers)
    assert {f["greeting"] for f in found} == {"hello"}
    assert {f["batch_size"] for f in found} == {4}
    assert max(f["batch"] for f in found) > 1
    assert max(f["batch"] for f in found) <= 4
    assert [f["body"] for f in found] == [str(i) for i in range(24)]


def test_concurrent_requests_each_get_their_own_answer(client: httpx.Client) -> None:
    """Batch size 1: requests queue for the handler's worker and are handed over several at a
    time; every answer goes to its own request."""
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        answers = list(
            pool.map(
                lambda i: client.post(
                    "/predictions/echo", content=b"r%d" % i, headers={"content-type": "text/plain"}
                ),
                range(64),
            )
        )
    assert all(a.status_code == 200 for a in answers)
    assert [a.json()["values"] for a in answers] == [{"body": f"r{i}"} for i in range(64)]


def test_handler_metrics_reach_prometheus(served: ServerProcess, client: httpx.Client) -> None:
    client.put("/predictions/linear", content=INPUT)
    text = httpx.get(f"{served.http_url}/metrics", timeout=60).text
    rows = [line for line in text.splitlines() if line.startswith("LinearRows_total{")]
    assert rows and 'model="linear"' in rows[0] and 'ModelName="linear"' in rows[0]
    assert float(rows[0].rsplit(" ", 1)[1]) >= 1
    assert 'inferd_request_success_total{model="linear",version="1"}' in text


def test_the_v2_api_reaches_a_torchserve_model(served: ServerProcess) -> None:
    request = {
        "inputs": [{"name": "body", "shape": [1, 1], "datatype": "BYTES", "data": [INPUT.decode()]}]
    }
    answer = httpx.post(
        f"{served.http_url}/v2/models/linear/infer", json=request, timeout=60
    ).json()
    outputs = {o["name"]: o for o in answer["outputs"]}
    assert json.loads(outputs["prediction"]["data"][0]) == {"y": [2.0, 6.0]}
    assert outputs["meta"]["data"] == [""]


def test_an_archive_placed_in_the_repository_gets_versions(
    repository: Path, torchserve_store: Path, client: httpx.Client, ports: Ports
) -> None:
    assert client.put("/predictions/hand", content=INPUT).content == LINEAR_BODY
    (repository / "hand" / "2").mkdir()
    shutil.copy(torchserve_store / "linear_eager.mar", repository / "hand" / "2" / "eager.mar")
    answer = _until_ok(client, "/predictions/hand/2.0", INPUT)
    assert answer.content == LINEAR_BODY  # the eager model holds the same weights
    described = httpx.get(f"{ports.management_url}/models/hand", timeout=60).json()
    assert [d["modelVersion"] for d in described] == ["2.0"]  # the latest, as inferd routes
    assert described[0]["modelUrl"] == "eager.mar"
    assert described[0]["loadedAtStartup"] is True
    batched = httpx.get(f"{ports.management_url}/models/batched", timeout=60).json()[0]
    assert (batched["batchSize"], batched["maxBatchDelay"], batched["responseTimeout"]) == (
        4,
        300,
        30,
    )
    assert (batched["minWorkers"], batched["maxWorkers"]) == (1, 2)
    assert np.array([w["pid"] for w in batched["workers"]]).size == 1


def test_the_model_api_is_off_unless_enabled(ports: Ports, served: ServerProcess) -> None:
    """As TorchServe 0.12 without --enable-model-api: reads and scaling answer, registering
    and unregistering do not."""
    refused = httpx.post(f"{ports.management_url}/models?url=linear.mar", timeout=60)
    assert refused.status_code == 405
    assert refused.json() == {
        "code": 405,
        "type": "MethodNotAllowedException",
        "message": "Requested method is not allowed, please refer to API document.",
    }
    assert httpx.delete(f"{ports.management_url}/models/echo", timeout=60).status_code == 405
    assert httpx.get(f"{ports.management_url}/models/echo", timeout=60).status_code == 200


def test_a_streaming_handler_answers_in_chunks(client: httpx.Client) -> None:
    with client.stream("POST", "/predictions/streaming", content=b"go") as answer:
        assert answer.status_code == 200
        assert answer.headers.get("transfer-encoding") == "chunked"
        chunks = [chunk for chunk in answer.iter_raw() if chunk]
    assert b"".join(chunks) == b"part0 part1 part2 end"


def test_handler_workers_share_the_servers_session(
    served: ServerProcess, client: httpx.Client, ports: Ports
) -> None:
    """A handler's worker process has a process group of its own (a Ctrl-C at the terminal
    reaches the server, which stops its workers in order) in the server's session (a kernel
    that shares CPU time by session counts the server and its workers as one program)."""
    assert client.put("/predictions/linear", content=INPUT).content == LINEAR_BODY
    assert served.proc is not None
    described = httpx.get(f"{ports.management_url}/models/linear", timeout=60).json()
    pids = [w["pid"] for w in described[0]["workers"]]
    assert pids and all(isinstance(pid, int) and pid > 0 for pid in pids)
    for pid in pids:
        assert os.getsid(pid) == os.getsid(served.proc.pid)
        assert os.getpgid(pid) == pid != os.getpgid(served.proc.pid)
