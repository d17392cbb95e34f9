"""Decoupled Python models with unmodified clients: 0..N responses per request, streamed over
gRPC ModelStreamInfer (tritonclient's start_stream / async_stream_infer) and as server-sent
events from Triton's generate extension (``/generate_stream``), ``/generate`` in JSON."""

from __future__ import annotations

import json
import queue
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
from tritonclient.utils import InferenceServerException

from tests.support import ServerProcess

CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "COUNT" data_type: TYPE_INT32 dims: [ 1 ] },
        { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] optional: true } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] },
         { name: "WORD" data_type: TYPE_STRING dims: [ 1 ] } ]
model_transaction_policy { decoupled: true }
"""
# Triton's "repeat" shape: two responses sent inside execute(), the rest and the final flag
# from a thread of the model's own after execute() returned.
MODEL = """
import threading

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            count = int(pb_utils.get_input_tensor_by_name(request, "COUNT").as_numpy()[0])
            text = pb_utils.get_input_tensor_by_name(request, "TEXT")
            word = text.as_numpy()[0] if text is not None else b"w"
            sender = request.get_response_sender()

            def send(i, sender=sender, word=word):
                sender.send(pb_utils.InferenceResponse([
                    pb_utils.Tensor("OUT", np.array([i], dtype=np.int32)),
                    pb_utils.Tensor("WORD", np.array([word + str(i).encode()], dtype=object)),
                ]))

            for i in range(min(2, count)):
                send(i)

            def rest(count=count, send=send, sender=sender):
                for i in range(2, count):
                    send(i)
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

            threading.Thread(target=rest).start()
        return None
"""


@pytest.fixture(scope="module", params=["native", "grpcio"])
def decoupled(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("decoupled") / "models"
    (root / "repeat" / "1").mkdir(parents=True)
    (root / "repeat" / "1" / "model.py").write_text(MODEL)
    (root / "repeat" / "config.pbtxt").write_text(f'name: "repeat"\n{CONFIG}')
    server = ServerProcess(root, extra_args=["--grpc-server", request.param]).start()
    yield server
    server.stop()


def _count(value: int) -> triton_grpc.InferInput:
    tensor = triton_grpc.InferInput("COUNT", [1], "INT32")
    tensor.set_data_from_numpy(np.array([value], dtype=np.int32))
    return tensor


def _stream(server: ServerProcess, counts: list[int], **options: Any) -> list[Any]:
    answers: queue.Queue[Any] = queue.Queue()
    client = triton_grpc.InferenceServerClient(server.grpc_address)
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        for i, count in enumerate(counts):
            client.async_stream_infer("repeat", [_count(count)], request_id=f"r{i}", **options)
        wanted = sum(counts) + (len(counts) if options else 0)
        got = [answers.get(timeout=30) for _ in range(wanted)]
    finally:
        client.stop_stream()
    assert all(error is None for _, error in got), [e for _, e in got if e]
    return [result for result, _ in got]


def test_grpc_stream_carries_every_response(decoupled: ServerProcess) -> None:
    got = _stream(decoupled, [5, 3])
    by_request: dict[str, list[int]] = {}
    for result in got:
        by_request.setdefault(result.get_response().id, []).append(int(result.as_numpy("OUT")[0]))
    assert by_request == {"r0": [0, 1, 2, 3, 4], "r1": [0, 1, 2]}
    assert got[0].as_numpy("WORD").tolist() == [b"w0"]


def test_grpc_empty_final_response_when_asked(decoupled: ServerProcess) -> None:
    got = _stream(decoupled, [5], enable_empty_final_response=True)
    finals = [r.get_response().parameters["triton_final_response"].bool_param for r in got]
    assert finals == [False] * 5 + [True]
    assert len(got[-1].get_response().outputs) == 0
    assert [int(r.as_numpy("OUT")[0]) for r in got[:5]] == [0, 1, 2, 3, 4]


def test_unary_infer_is_refused(decoupled: ServerProcess) -> None:
    client = triton_grpc.InferenceServerClient(decoupled.grpc_address)
    with pytest.raises(InferenceServerException, match="is decoupled"):
        client.infer("repeat", [_count(2)])
    r = httpx.post(
        f"{decoupled.http_url}/v2/models/repeat/infer",
        json={"inputs": [{"name": "COUNT", "shape": [1], "datatype": "INT32", "data": [2]}]},
        timeout=60,
    )
    assert r.status_code == 400 and "is decoupled" in r.json()["error"]


def test_generate_stream_sends_server_sent_events(decoupled: ServerProcess) -> None:
    url = f"{decoupled.http_url}/v2/models/repeat/generate_stream"
    with httpx.stream("POST", url, json={"COUNT": 5, "TEXT": "tok"}, timeout=30) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [
            json.loads(line.removeprefix("data: "))
            for line in response.iter_lines()
            if line.startswith("data: ")
        ]
    assert [e["OUT"] for e in events] == [0, 1, 2, 3, 4]
    assert [e["WORD"] for e in events] == ["tok0", "tok1", "tok2", "tok3", "tok4"]
    assert {(e["model_name"], e["model_version"]) for e in events} == {("repeat", "1")}


def test_generate_answers_one_response_in_json(decoupled: ServerProcess) -> None:
    url = f"{decoupled.http_url}/v2/models/repeat/generate"
    r = httpx.post(url, json={"COUNT": 1, "TEXT": "only"}, timeout=60)
    assert r.status_code == 200
    assert r.json() == {"model_name": "repeat", "model_version": "1", "OUT": 0, "WORD": "only0"}
    r = httpx.post(url, json={"COUNT": 3}, timeout=60)
    assert r.status_code == 400 and "generate_stream" in r.json()["error"]
    r = httpx.post(url, json={"NOPE": 1}, timeout=60)
    assert r.status_code == 400 and "NOPE" in r.json()["error"]
    with httpx.stream("POST", f"{url}_stream", json={"COUNT": "x"}, timeout=60) as response:
        assert response.status_code == 400


def test_grpc_aio_stream_infer(decoupled: ServerProcess) -> None:
    import asyncio

    import tritonclient.grpc.aio as grpc_aio

    async def run() -> list[int]:
        client = grpc_aio.InferenceServerClient(decoupled.grpc_address)
        count = grpc_aio.InferInput("COUNT", [1], "INT32")
        count.set_data_from_numpy(np.array([4], dtype=np.int32))

        async def requests() -> Any:
            yield {"model_name": "repeat", "inputs": [count], "request_id": "aio"}

        got = []
        try:
            async for result, error in client.stream_infer(requests()):
                assert error is None
                got.append(int(result.as_numpy("OUT")[0]))
                if len(got) == 4:
                    break
        finally:
            await client.close()
        return got

    assert asyncio.run(run()) == [0, 1, 2, 3]
