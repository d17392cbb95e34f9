"""``inferd.Server.infer`` on the caller's thread: a model that neither batches nor needs the
loop runs there, counted, cached and failing as over HTTP on the same server; a batching model
still batches the calls of several threads; an unload waits for a call running on the caller's
thread."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

import inferd
from inferd.core.errors import InternalError, InvalidInput
from tests.support import free_port, wait_for

TIMEOUT_S = 60.0
IN = [("A", np.float32, (-1,))]
OUT = [("B", np.float32, (-1,))]


class Recorder:
    """A function that doubles its input and records, per execution, the thread it ran on and
    how many requests it got; it fails on a negative input, and waits at ``gate``."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []  # (thread ident, requests)
        self.lock = threading.Lock()
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()

    def __call__(self, requests: Sequence[Mapping[str, np.ndarray]]) -> list[dict[str, Any]]:
        with self.lock:
            self.calls.append((threading.get_ident(), len(requests)))
        self.entered.set()
        assert self.gate.wait(TIMEOUT_S)
        if any(float(r["A"].min()) < 0 for r in requests):
            raise ValueError("negative input")
        return [{"B": r["A"] * 2} for r in requests]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[inferd.Server, str]]:
    repo = tmp_path_factory.mktemp("direct") / "models"
    repo.mkdir()
    with inferd.Server(
        model_repository=str(repo), http_address="127.0.0.1", cache_size=1 << 20
    ) as server:
        yield server, f"http://127.0.0.1:{server.serve_http(free_port())}"


def _body(values: list[float], **extra: Any) -> dict[str, Any]:
    tensor = {"name": "A", "shape": [1, len(values)], "datatype": "FP32", "data": values}
    return {"inputs": [tensor], **extra}


def _stats(url: str, model: str) -> dict[str, Any]:
    response = httpx.get(f"{url}/v2/models/{model}/stats", timeout=TIMEOUT_S)
    assert response.status_code == 200, response.text
    stats: dict[str, Any] = response.json()["model_stats"][0]
    return stats


def test_a_direct_call_runs_on_the_callers_thread_and_counts_as_a_request(
    served: tuple[inferd.Server, str],
) -> None:
    server, url = served
    plain = Recorder()
    server.bind("plain", plain, IN, OUT, max_batch_size=4)
    a = np.array([[1.0, 2.0]], np.float32)
    for _ in range(3):
        assert server.infer("plain", {"A": a})["B"].tolist() == [[2.0, 4.0]]
    over_http = httpx.post(f"{url}/v2/models/plain/infer", json=_body([3.0]), timeout=TIMEOUT_S)
    assert over_http.json()["outputs"][0]["data"] == [6.0]
    here = threading.get_ident()
    assert [thread == here for thread, _ in plain.calls] == [True, True, True, False]
    stats = _stats(url, "plain")
    assert (stats["inference_count"], stats["execution_count"]) == (4, 4)
    assert stats["inference_stats"]["success"]["count"] == 4
    assert {b["batch_size"]: b["compute_infer"]["count"] for b in stats["batch_stats"]} == {1: 4}
    (local,) = server.statistics("plain")
    assert (local.inference_count, local.inference_stats.success.count) == (4, 4)
    metrics = httpx.get(f"{url}/metrics", timeout=TIMEOUT_S).text
    assert 'inferd_request_success_total{model="plain",version="1"} 4.0' in metrics


def test_calls_from_many_threads_and_over_http_at_once_are_each_counted(
    served: tuple[inferd.Server, str],
) -> None:
    server, url = served
    busy = Recorder()
    server.bind("busy", busy, IN, OUT, max_batch_size=4, config={"instance_group": [{"count": 2}]})
    failures: list[BaseException] = []

    def local(value: float) -> None:
        try:
            for _ in range(50):
                a = np.full((1, 1), value, np.float32)
                assert server.infer("busy", {"A": a})["B"].tolist() == [[value * 2]]
        except BaseException as exc:
            failures.append(exc)

    def network() -> None:
        with httpx.Client(timeout=TIMEOUT_S) as client:
            for _ in range(20):
                answer = client.post(f"{url}/v2/models/busy/infer", json=_body([1.5]))
                assert answer.json()["outputs"][0]["data"] == [3.0]

    threads = [threading.Thread(target=local, args=(float(i),)) for i in range(4)]
    threads.append(threading.Thread(target=network))
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT_S * 2)
    assert failures == []
    assert sum(n for _, n in busy.calls) == 220
    stats = _stats(url, "busy")
    assert stats["inference_stats"]["success"]["count"] == 220
    assert stats["inference_stats"]["fail"]["count"] == 0
    assert stats["inference_count"] == 220


def test_errors_are_the_ones_http_reports(served: tuple[inferd.Server, str]) -> None:
    server, url = served
    server.bind("picky", Recorder(), IN, OUT, max_batch_size=4)
    cases: list[tuple[dict[str, Any], dict[str, Any], type[Exception]]] = [
        ({"inputs": {"A": np.array([[-1.0]], np.float32)}}, _body([-1.0]), InternalError),
        ({"inputs": {"Z": np.array([[1.0]], np.float32)}}, _body([1.0]), InvalidInput),
        (
            {"inputs": {"A": np.array([[1.0]], np.float32)}, "parameters": {"timeout": "soon"}},
            _body([1.0], parameters={"timeout": "soon"}),
            InvalidInput,
        ),
    ]
    cases[1][1]["inputs"][0]["name"] = "Z"
    for call, body, kind in cases:
        with pytest.raises(kind) as raised:
            server.infer("picky", **call)
        answer = httpx.post(f"{url}/v2/models/picky/infer", json=body, timeout=TIMEOUT_S)
        assert answer.status_code == (500 if kind is InternalError else 400)
        # HTTP names the request of a server error, for its log.
        assert answer.json()["error"].split(" (request id ")[0] == str(raised.value)
    stats = _stats(url, "picky")
    assert stats["inference_stats"]["fail"]["count"] == 6


def test_the_response_cache_answers_both_paths(served: tuple[inferd.Server, str]) -> None:
    server, url = served
    cached = Recorder()
    server.bind(
        "cached", cached, IN, OUT, max_batch_size=4, config={"response_cache": {"enable": True}}
    )
    a = np.array([[4.0]], np.float32)
    first = server.infer("cached", {"A": a})
    again = server.infer("cached", {"A": a})
    assert first["B"].tolist() == again["B"].tolist() == [[8.0]]
    assert not again["B"].flags.writeable  # the cache's own array
    answer = httpx.post(f"{url}/v2/models/cached/infer", json=_body([4.0]), timeout=TIMEOUT_S)
    assert answer.json()["outputs"][0]["data"] == [8.0]
    assert [thread for thread, _ in cached.calls] == [threading.get_ident()]
    inference = _stats(url, "cached")["inference_stats"]
    assert (inference["cache_miss"]["count"], inference["cache_hit"]["count"]) == (1, 2)


def test_a_batching_model_batches_the_calls_of_several_threads(
    served: tuple[inferd.Server, str],
) -> None:
    server, url = served
    batched = Recorder()
    # A full batch ships at once; the long delay only keeps an early arrival waiting for it.
    delay = {"max_queue_delay_microseconds": 120_000_000}
    server.bind("batched", batched, IN, OUT, max_batch_size=4, dynamic_batching=delay)
    answers: dict[float, list[list[float]]] = {}

    def call(value: float) -> None:
        a = np.full((1, 1), value, np.float32)
        answers[value] = server.infer("batched", {"A": a})["B"].tolist()

    threads = [threading.Thread(target=call, args=(float(v),)) for v in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT_S * 3)
    assert answers == {v: [[v * 2]] for v in (0.0, 1.0, 2.0, 3.0)}
    assert [n for _, n in batched.calls] == [4]
    assert batched.calls[0][0] not in {t.ident for t in threads}
    stats = _stats(url, "batched")
    assert (stats["inference_count"], stats["execution_count"]) == (4, 1)
    assert {b["batch_size"]: b["compute_infer"]["count"] for b in stats["batch_stats"]} == {4: 1}


def test_an_unload_waits_for_a_call_running_on_the_callers_thread(tmp_path: Path) -> None:
    (tmp_path / "models").mkdir()
    gated = Recorder()
    gated.gate.clear()
    events: list[str] = []
    repo = str(tmp_path / "models")
    with inferd.Server(model_repository=repo, model_control_mode="explicit") as server:
        server.bind("gated", gated, IN, OUT, max_batch_size=4)

        def call() -> None:
            answer = server.infer("gated", {"A": np.array([[2.5]], np.float32)})
            events.append(f"answered {answer['B'].tolist()}")

        def unload() -> None:
            server.unload("gated")
            events.append("unloaded")

        caller = threading.Thread(target=call)
        caller.start()
        assert gated.entered.wait(TIMEOUT_S)
        unloading = threading.Thread(target=unload)
        unloading.start()
        wait_for(lambda: not server.model_ready("gated"), "the unload to start")
        unloading.join(0.5)  # it would end here if it did not wait for the call
        gated.gate.set()
        caller.join(TIMEOUT_S)
        unloading.join(TIMEOUT_S)
        assert events == ["answered [[5.0]]", "unloaded"]
        assert [thread for thread, _ in gated.calls] == [caller.ident]
        assert [e.name for e in server.models(ready_only=True)] == []
