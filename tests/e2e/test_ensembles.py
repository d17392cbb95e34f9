"""Triton ensembles end to end: a chain and a diamond of demo models over HTTP and gRPC,
statistics per ensemble and per composing model, bad graphs UNAVAILABLE with their reason,
step errors naming the step and the model."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http

from tests.e2e.ensemble_support import ensemble_repository
from tests.support import ServerProcess, wait_for


@pytest.fixture(scope="module")
def ens(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = ensemble_repository(tmp_path_factory.mktemp("ens") / "models")
    server = ServerProcess(root, extra_args=["--strict-readiness=false"]).start()
    yield server
    server.stop()


def _x(*values: float) -> np.ndarray:
    return np.asarray(values, np.float32).reshape(-1, 1)


def _http_infer(server: ServerProcess, model: str, x: np.ndarray) -> triton_http.InferResult:
    client = triton_http.InferenceServerClient(server.http_address)
    inp = triton_http.InferInput("IN", list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=True)
    return client.infer(model, [inp])


def test_chain_over_http_and_grpc(ens: ServerProcess) -> None:
    x = _x(1.0, 2.0, 6.0)
    expected = 0.5 * (0.5 * x + 2.0) + 2.0
    got = _http_infer(ens, "chain", x).as_numpy("OUT")
    np.testing.assert_allclose(got, expected)
    with triton_grpc.InferenceServerClient(ens.grpc_address) as client:
        inp = triton_grpc.InferInput("IN", [3, 1], "FP32")
        inp.set_data_from_numpy(x)
        result = client.infer("chain", [inp])
        np.testing.assert_allclose(result.as_numpy("OUT"), expected)
        meta = client.get_model_metadata("chain", as_json=True)
        assert meta["platform"] == "ensemble"
        assert meta["inputs"] == [{"name": "IN", "datatype": "FP32", "shape": ["-1", "1"]}]


def test_diamond_runs_steps_as_a_dag(ens: ServerProcess) -> None:
    x = _x(4.0, -2.0)
    result = _http_infer(ens, "diamond", x)
    a = 0.5 * x + 2.0
    np.testing.assert_allclose(result.as_numpy("A"), a)
    np.testing.assert_allclose(result.as_numpy("B"), 0.5 * a + 2.0)
    # One requested output needs only the steps that make it.
    r = httpx.post(
        f"{ens.http_url}/v2/models/diamond/infer",
        json={
            "inputs": [{"name": "IN", "datatype": "FP32", "shape": [1, 1], "data": [2.0]}],
            "outputs": [{"name": "A"}],
        },
        timeout=60,
    )
    assert r.status_code == 200, r.text
    assert [o["name"] for o in r.json()["outputs"]] == ["A"]
    assert r.json()["outputs"][0]["data"] == [3.0]


def test_statistics_and_index(ens: ServerProcess) -> None:
    client = triton_http.InferenceServerClient(ens.http_address)
    before = client.get_inference_statistics("half_plus_two")["model_stats"][0]
    _http_infer(ens, "chain", _x(1.0, 2.0))
    chain = client.get_inference_statistics("chain")["model_stats"][0]
    after = client.get_inference_statistics("half_plus_two")["model_stats"][0]
    assert chain["inference_stats"]["success"]["count"] >= 1
    assert chain["inference_count"] >= 2
    # Each ensemble request is two requests to half_plus_two (one per step).
    succeeded = after["inference_stats"]["success"]["count"]
    assert succeeded - before["inference_stats"]["success"]["count"] == 2
    entries = {e["name"]: e for e in client.get_model_repository_index()}
    assert entries["chain"]["state"] == "READY"
    assert entries["diamond"]["state"] == "READY"
    metrics = httpx.get(f"{ens.http_url}/metrics", timeout=60).text
    assert 'model="chain"' in metrics


def test_bad_graphs_are_unavailable_with_their_reason(ens: ServerProcess) -> None:
    client = triton_http.InferenceServerClient(ens.http_address)
    entries = {e["name"]: e for e in client.get_model_repository_index()}
    cycle = entries["cycle"]
    assert cycle["state"] == "UNAVAILABLE"
    assert "steps form a cycle" in cycle["reason"]
    assert "step 0 (model 'half_plus_two') reads ['b']" in cycle["reason"]
    unknown = entries["unknown_tensor"]
    assert unknown["state"] == "UNAVAILABLE"
    assert "input 'x' reads tensor 'nowhere'" in unknown["reason"]
    missing = entries["missing_model"]
    assert missing["state"] == "UNAVAILABLE"
    assert "needs model 'later'" in missing["reason"]
    r = httpx.post(
        f"{ens.http_url}/v2/models/cycle/infer",
        json={"inputs": [{"name": "IN", "datatype": "FP32", "shape": [1, 1], "data": [2.0]}]},
        timeout=60,
    )
    assert r.status_code in (400, 503), r.text
    assert "cycle" in r.json()["error"]


def test_bad_requests_name_the_problem(ens: ServerProcess) -> None:
    r = httpx.post(
        f"{ens.http_url}/v2/models/chain/infer",
        json={"inputs": [{"name": "IN", "datatype": "INT32", "shape": [1, 1], "data": [2]}]},
        timeout=60,
    )
    assert r.status_code == 400
    assert "IN" in r.json()["error"] and "FP32" in r.json()["error"]
    r = httpx.post(
        f"{ens.http_url}/v2/models/chain/infer",
        json={"inputs": [{"name": "IN", "datatype": "FP32", "shape": [65, 1], "data": [0.0] * 65}]},
        timeout=60,
    )
    assert r.status_code == 400, r.text
    # The server keeps serving.
    np.testing.assert_allclose(_http_infer(ens, "chain", _x(0.0)).as_numpy("OUT"), [[3.0]])


def test_a_failing_step_names_the_step_and_model(tmp_path: Path) -> None:
    from tests.e2e.ensemble_support import ensemble, step, write_model

    root = tmp_path / "models"
    write_model(
        root,
        "fails",
        'backend: "echo"\nmax_batch_size: 8\n'
        'input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [1] }]\n'
        'parameters { key: "error_every" value: { string_value: "1" } }\n',
    )
    write_model(
        root,
        "wraps",
        ensemble("wraps", [step("fails", {"INPUT0": "IN"}, {"OUTPUT0": "OUT"})], ["IN"], ["OUT"]),
    )
    server = ServerProcess(root).start()
    try:
        r = httpx.post(
            f"{server.http_url}/v2/models/wraps/infer",
            json={"inputs": [{"name": "IN", "datatype": "FP32", "shape": [1, 1], "data": [1]}]},
            timeout=60,
        )
        assert r.status_code == 500, r.text
        assert r.json()["error"].startswith("ensemble 'wraps' step 0 (model 'fails'): ")
    finally:
        server.stop()


def _wait_ready(server: ServerProcess, model: str) -> None:
    """Version 1 ready in each serving process: frontends hear of the host's changes with its
    next table, each at its own pace, so each process is asked over its own socket (8 fresh
    connections miss a given one of three processes 4 % of the time, and a wait tries again
    and again while one is late)."""
    url = f"{server.http_url}/v2/models/{model}/ready"
    message = {"op": "statistics", "name": model, "version": "1"}  # [] where not ready

    def ready() -> bool:
        return httpx.get(url, timeout=60).status_code == 200 and all(
            server.ask_each_worker(message)
        )

    wait_for(ready, f"model '{model}' ready in every serving process")


def test_an_ensemble_becomes_ready_when_its_model_appears(tmp_path: Path) -> None:
    root = ensemble_repository(tmp_path / "models")
    args = ["--model-control-mode", "poll", "--repository-poll-secs", "1"]
    server = ServerProcess(root, extra_args=[*args, "--strict-readiness=false"]).start()
    try:
        r = httpx.get(f"{server.http_url}/v2/models/missing_model/ready", timeout=60)
        assert r.status_code != 200
        shutil.copytree(root / "half_plus_two", root / "later")
        _wait_ready(server, "missing_model")
        got = _http_infer(server, "missing_model", _x(2.0)).as_numpy("OUT")
        np.testing.assert_allclose(got, [[3.0]])
        assert "is ready: loading model 'missing_model', which needs it" in server.log()
    finally:
        server.stop()


def test_unload_dependents_takes_ensembles_down(tmp_path: Path) -> None:
    root = ensemble_repository(tmp_path / "models")
    server = ServerProcess(root, extra_args=["--model-control-mode", "explicit"]).start()
    try:
        client = triton_http.InferenceServerClient(server.http_address)
        client.load_model("chain")  # its composing model comes up first
        assert client.is_model_ready("half_plus_two") and client.is_model_ready("chain")
        client.unload_model("half_plus_two")  # the ensemble cannot serve without it
        assert not client.is_model_ready("chain")
        client.load_model("chain")
        client.unload_model("chain", unload_dependents=True)
        assert not client.is_model_ready("half_plus_two")
    finally:
        server.stop()
