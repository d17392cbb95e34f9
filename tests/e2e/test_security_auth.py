"""Tokens and scopes on both ports: 401/403 on HTTP, UNAUTHENTICATED/PERMISSION_DENIED on
every RPC (streams, reflection and TF Serving included), health and metrics open unless asked,
token files reloaded on change, tokens never in the logs."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from tritonclient.utils import InferenceServerException

from inferd.protocols import grpc_service_pb2 as pb
from inferd.protocols import grpc_service_pb2_grpc as pb_grpc
from tests.e2e.lifecycle_support import write_version
from tests.support import ServerProcess, wait_for

INFER = {"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1.0]}]}
TOKEN, ADMIN, FILE_TOKEN = "inf-secret-1", "adm-secret-1", "file-secret-1"


@pytest.fixture(scope="module")
def token_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tokens") / "inference.tokens"
    path.write_text(f"# inference tokens\n{FILE_TOKEN}\n")
    return path


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("auth") / "models"
    write_version(root / "half_plus_two", 1)
    return root


def _secured_args(token_file: Path) -> list[str]:
    return [
        "--auth-token",
        TOKEN,
        "--admin-token",
        ADMIN,
        "--auth-token-file",
        str(token_file),
        "--access-log",
        "--log-verbose",
        "1",
    ]


@pytest.fixture(scope="module")
def secured(repo: Path, token_file: Path) -> Iterator[ServerProcess]:
    server = ServerProcess(repo, extra_args=_secured_args(token_file)).start()
    yield server
    server.stop()


@pytest.fixture(scope="module", params=["native", "grpcio"])
def grpc_secured(
    request: pytest.FixtureRequest, repo: Path, token_file: Path
) -> Iterator[ServerProcess]:
    """The same server on each gRPC server: the native one (the default), then grpcio."""
    if request.param == "native":
        server: ServerProcess = request.getfixturevalue("secured")
        assert "(native server)" in server.log()
        yield server
        return
    args = [*_secured_args(token_file), "--grpc-server", "grpcio"]
    server = ServerProcess(repo, extra_args=args).start()
    assert "(grpcio server)" in server.log()
    yield server
    server.stop()


def _infer(server: ServerProcess, **headers: str) -> httpx.Response:
    url = f"{server.http_url}/v2/models/half_plus_two/infer"
    return httpx.post(url, json=INFER, headers=headers, timeout=60)


def test_http_needs_a_token_of_the_right_scope(secured: ServerProcess) -> None:
    r = _infer(secured)
    assert r.status_code == 401
    assert r.headers["www-authenticate"] == 'Bearer realm="inferd"'
    assert "needs a token" in r.json()["error"]
    assert _infer(secured, authorization="Bearer wrong").status_code == 401
    for value in (f"Bearer {TOKEN}", TOKEN, f"bearer {ADMIN}", FILE_TOKEN):
        r = _infer(secured, authorization=value)
        assert r.status_code == 200, value
        assert r.json()["outputs"][0]["data"] == [2.5]
    logs = f"{secured.http_url}/v2/logs"
    assert httpx.get(logs, timeout=60).status_code == 401
    r = httpx.get(logs, headers={"authorization": TOKEN}, timeout=60)
    assert r.status_code == 403 and "admin scope" in r.json()["error"]
    assert httpx.get(logs, headers={"authorization": ADMIN}, timeout=60).status_code == 200
    load = f"{secured.http_url}/v2/repository/models/digits/load"
    assert httpx.post(load, headers={"authorization": TOKEN}, timeout=60).status_code == 403


def test_health_and_metrics_stay_open(secured: ServerProcess) -> None:
    assert httpx.get(f"{secured.http_url}/v2/health/ready", timeout=60).status_code == 200
    assert httpx.get(f"{secured.http_url}/v2/health/live", timeout=60).status_code == 200
    assert httpx.get(f"{secured.http_url}/metrics", timeout=60).status_code == 200
    assert httpx.get(f"{secured.http_url}/v2", timeout=60).status_code == 401
    assert httpx.get(f"{secured.http_url}/v1/models/half_plus_two", timeout=60).status_code == 401


def test_tritonclient_http_with_a_bare_authorization_header(secured: ServerProcess) -> None:
    client = triton_http.InferenceServerClient(secured.http_address)
    x = triton_http.InferInput("x", [2], "FP32")
    x.set_data_from_numpy(np.array([1.0, 4.0], np.float32))
    result = client.infer("half_plus_two", [x], headers={"Authorization": TOKEN})
    np.testing.assert_allclose(result.as_numpy("y").ravel(), [2.5, 4.0])
    with pytest.raises(InferenceServerException, match="needs a token"):
        client.infer("half_plus_two", [x])
    client.close()


def _code(call: Any) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as info:
        call()
    code: grpc.StatusCode = info.value.code()
    return code


def test_every_rpc_is_checked(grpc_secured: ServerProcess) -> None:
    channel = grpc.insecure_channel(grpc_secured.grpc_address)
    stub = pb_grpc.GRPCInferenceServiceStub(channel)  # type: ignore[no-untyped-call]
    request = pb.ModelInferRequest(model_name="half_plus_two")
    tensor = request.inputs.add(name="x", datatype="FP32", shape=[1])
    tensor.contents.fp32_contents.append(1.0)
    good = (("authorization", f"Bearer {TOKEN}"),)
    unauthenticated = grpc.StatusCode.UNAUTHENTICATED
    assert _code(lambda: stub.ModelInfer(request)) == unauthenticated
    assert _code(lambda: list(stub.ModelStreamInfer(iter([request])))) == unauthenticated
    assert _code(lambda: stub.ServerMetadata(pb.ServerMetadataRequest())) == unauthenticated
    assert stub.ModelInfer(request, metadata=good).outputs[0].name == "y"
    streamed = list(stub.ModelStreamInfer(iter([request]), metadata=good))
    assert streamed[0].error_message == "" and streamed[0].infer_response.model_name
    # Health stays open; the admin RPCs need the admin scope.
    assert stub.ServerLive(pb.ServerLiveRequest()).live
    health = health_pb2_grpc.HealthStub(channel)
    check = health.Check(health_pb2.HealthCheckRequest(service=""))
    assert check.status == health_pb2.HealthCheckResponse.SERVING
    unload = pb.RepositoryModelUnloadRequest(model_name="half_plus_two")
    denied = _code(lambda: stub.RepositoryModelUnload(unload, metadata=good))
    assert denied == grpc.StatusCode.PERMISSION_DENIED
    reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
    ask = reflection_pb2.ServerReflectionRequest(list_services="")
    assert _code(lambda: list(reflection.ServerReflectionInfo(iter([ask])))) == unauthenticated
    answers = list(reflection.ServerReflectionInfo(iter([ask]), metadata=good))
    assert answers[0].list_services_response.service
    channel.close()


def test_tritonclient_grpc_with_headers(secured: ServerProcess) -> None:
    with triton_grpc.InferenceServerClient(secured.grpc_address) as client:
        x = triton_grpc.InferInput("x", [1], "FP32")
        x.set_data_from_numpy(np.array([2.0], np.float32))
        result = client.infer("half_plus_two", [x], headers={"authorization": FILE_TOKEN})
        np.testing.assert_allclose(result.as_numpy("y").ravel(), [3.0])
        with pytest.raises(InferenceServerException) as info:
            client.infer("half_plus_two", [x], headers={"authorization": "nope"})
        assert info.value.status() == "StatusCode.UNAUTHENTICATED"


def test_a_token_file_is_reloaded_when_it_changes(secured: ServerProcess, token_file: Path) -> None:
    token_file.write_text("rotated-secret-2\n")
    deadline = time.monotonic() + 60
    while _infer(secured, authorization="rotated-secret-2").status_code != 200:
        assert time.monotonic() < deadline, "the new token was never accepted"
        time.sleep(0.2)
    # Refused at once by every serving process (fresh connections reach each of them).
    assert {_infer(secured, authorization=FILE_TOKEN).status_code for _ in range(12)} == {401}
    assert _infer(secured, authorization=TOKEN).status_code == 200  # flags stay


def test_tokens_are_never_logged(secured: ServerProcess) -> None:
    path = "/v2/models/half_plus_two/infer"
    logged = secured.log().count(path)
    _infer(secured, authorization=TOKEN)
    _infer(secured, authorization="Bearer wrong-guess-xyz")
    wait_for(lambda: secured.log().count(path) >= logged + 2, "both requests in the access log")
    log = secured.log()
    assert "half_plus_two" in log
    for secret in (TOKEN, ADMIN, FILE_TOKEN, "wrong-guess-xyz", "rotated-secret-2"):
        assert secret not in log


def test_auth_health_and_auth_metrics(repo: Path) -> None:
    args = ["--auth-token", TOKEN, "--auth-health", "--auth-metrics"]
    server = ServerProcess(repo, extra_args=args, env={"INFERD_ADMIN_TOKEN": ADMIN})
    server.token = TOKEN
    server.start()
    try:
        url = server.http_url
        assert httpx.get(f"{url}/v2/health/live", timeout=60).status_code == 401
        assert httpx.get(f"{url}/metrics", timeout=60).status_code == 401
        assert (
            httpx.get(f"{url}/metrics", headers={"authorization": TOKEN}, timeout=60).status_code
            == 200
        )
        # INFERD_ADMIN_TOKEN, the variable, configures the admin scope.
        r = httpx.get(f"{url}/v2/logs", headers={"authorization": ADMIN}, timeout=60)
        assert r.status_code == 200
        channel = grpc.insecure_channel(server.grpc_address)
        health = health_pb2_grpc.HealthStub(channel)
        ask = health_pb2.HealthCheckRequest(service="")
        assert _code(lambda: health.Check(ask)) == grpc.StatusCode.UNAUTHENTICATED
        channel.close()
    finally:
        server.stop()
