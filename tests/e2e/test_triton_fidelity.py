"""What Triton's own clients check, with tritonclient (http, http.aio, grpc): compression only
on inference responses, Triton's error wording over HTTP and gRPC, and a server metadata
extension list in which every extension listed works and none that does not is listed."""

from __future__ import annotations

import asyncio
import gzip
import zlib
from collections.abc import Iterator

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
import tritonclient.http.aio as triton_aio
from tritonclient.utils import InferenceServerException

from inferd.demo.models import write_demo_repository
from inferd.protocols import grpc_service_pb2 as pb
from inferd.protocols import grpc_service_pb2_grpc as pb_grpc
from tests.support import ServerProcess

M = "half_plus_two"
X = np.array([[1.0], [2.0], [5.0]], dtype=np.float32)
EXTENSIONS = [
    "classification",
    "sequence",
    "model_repository",
    "model_repository(unload_dependents)",
    "schedule_policy",
    "model_configuration",
    "system_shared_memory",
    "binary_tensor_data",
    "parameters",
    "statistics",
    "trace",
    "logging",
]


@pytest.fixture(scope="module")
def triton(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("triton") / "models"
    write_demo_repository(root, models=[M])
    (root / "broken" / "1").mkdir(parents=True)
    (root / "broken" / "1" / "model.onnx").write_bytes(b"not an onnx model")
    args = ["--model-control-mode", "explicit", "--load-model", M]
    server = ServerProcess(root, extra_args=args).start()
    yield server
    server.stop()


def _http_input(binary: bool = True) -> triton_http.InferInput:
    tensor = triton_http.InferInput("x", list(X.shape), "FP32")
    tensor.set_data_from_numpy(X, binary_data=binary)
    return tensor


def _grpc_input() -> triton_grpc.InferInput:
    tensor = triton_grpc.InferInput("x", list(X.shape), "FP32")
    tensor.set_data_from_numpy(X)
    return tensor


def test_only_inference_responses_are_compressed(triton: ServerProcess) -> None:
    async def run() -> tuple[str, list[float], list[float]]:
        # aiohttp asks for gzip on every call and leaves decompression to tritonclient, which
        # only decompresses inference responses: anything else compressed would not parse.
        client = triton_aio.InferenceServerClient(triton.http_address)
        try:
            stats = await client.get_inference_statistics(M)
            zipped = await client.infer(M, [_http_input()], response_compression_algorithm="gzip")
            deflated = await client.infer(
                M, [_http_input()], response_compression_algorithm="deflate"
            )
        finally:
            await client.close()
        return (
            stats["model_stats"][0]["name"],
            zipped.as_numpy("y").ravel().tolist(),
            deflated.as_numpy("y").ravel().tolist(),
        )

    name, zipped, deflated = asyncio.run(run())
    assert (name, zipped, deflated) == (M, [2.5, 3.0, 4.5], [2.5, 3.0, 4.5])
    infer = f"{triton.http_url}/v2/models/{M}/infer"
    doc = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [3, 1], "data": [1, 2, 5]}]}
    with httpx.Client(headers={"Accept-Encoding": "identity"}, timeout=60) as plain:
        for accept, encoding in [
            ("gzip, deflate", "gzip"),
            ("deflate, gzip", "deflate"),
            ("gzip;q=0.5, deflate;q=0.9", "deflate"),
            ("br", None),
            ("identity;q=1, gzip;q=0.5", None),
        ]:
            r = plain.post(infer, json=doc, headers={"Accept-Encoding": accept})
            assert r.headers.get("content-encoding") == encoding, accept
            assert b'"data":[2.5,3.0,4.5]' in r.content  # httpx decodes gzip and deflate
        for url in ("/v2/health/live", "/v2", f"/v2/models/{M}/stats", f"/v2/models/{M}"):
            r = plain.get(triton.http_url + url, headers={"Accept-Encoding": "gzip"})
            assert r.status_code == 200 and "content-encoding" not in r.headers, url
        r = plain.post(
            f"{triton.http_url}/v2/models/nope/infer", json=doc, headers={"Accept-Encoding": "gzip"}
        )
        assert r.status_code == 404 and "content-encoding" not in r.headers
        r = plain.post(
            f"{triton.http_url}/v1/models/{M}:predict",
            json={"instances": [1.0]},
            headers={"Accept-Encoding": "gzip"},
        )
        assert r.json() == {"predictions": [2.5]} and "content-encoding" not in r.headers
    # The bodies on the wire are gzip and zlib streams.
    for accept, decompress in (("gzip", gzip.decompress), ("deflate", zlib.decompress)):
        with httpx.stream(
            "POST", infer, json=doc, headers={"Accept-Encoding": accept}, timeout=60
        ) as r:
            raw = b"".join(r.iter_raw())
        assert r.headers["content-encoding"] == accept
        assert b'"data":[2.5,3.0,4.5]' in decompress(raw)


def _http_error(call: object) -> str:
    with pytest.raises(InferenceServerException) as info:
        call()  # type: ignore[operator]
    message: str = info.value.message()
    return message


def test_triton_error_wording_over_http_and_grpc(triton: ServerProcess) -> None:
    http = triton_http.InferenceServerClient(triton.http_address)
    rpc = triton_grpc.InferenceServerClient(triton.grpc_address)
    for client, tensor in ((http, _http_input), (rpc, _grpc_input)):
        assert (
            _http_error(lambda c=client, t=tensor: c.infer("nope", [t()]))
            == "Request for unknown model: 'nope' is not found"
        )
        assert (
            _http_error(lambda c=client, t=tensor: c.infer(M, [t()], model_version="9"))
            == f"Request for unknown model: '{M}' version 9 is not found"
        )
        assert _http_error(
            lambda c=client, t=tensor: c.infer(M, [t()], model_version="abc")
        ).startswith("failed to get model version from specified version string 'abc'")
        assert _http_error(lambda c=client: c.load_model("broken")).startswith(
            "failed to load 'broken', "
        )
    request = pb.ModelInferRequest(model_name=M)
    request.inputs.add(name="x", datatype="FP32", shape=[1, 1])
    request.inputs[0].contents.fp32_contents.append(1.0)
    request.raw_input_contents.append(np.float32(1.0).tobytes())
    with (
        grpc.insecure_channel(triton.grpc_address) as channel,
        pytest.raises(grpc.RpcError) as info,
    ):
        stub = pb_grpc.GRPCInferenceServiceStub(channel)  # type: ignore[no-untyped-call]
        stub.ModelInfer(request, timeout=60)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details().startswith(
        f"contents field must not be specified when using raw_input_contents for 'x' for model "
        f"'{M}'"
    )
    # Checked before the count of raw entries, as Triton does: one raw entry, a typed second.
    request = pb.ModelInferRequest(model_name=M)
    request.inputs.add(name="x", datatype="FP32", shape=[1, 1])
    request.inputs.add(name="y", datatype="FP32", shape=[1, 1])
    request.inputs[1].contents.fp32_contents.append(1.0)
    request.raw_input_contents.append(np.float32(1.0).tobytes())
    with (
        grpc.insecure_channel(triton.grpc_address) as channel,
        pytest.raises(grpc.RpcError) as info,
    ):
        stub = pb_grpc.GRPCInferenceServiceStub(channel)  # type: ignore[no-untyped-call]
        stub.ModelInfer(request, timeout=60)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.details() == (
        f"contents field must not be specified when using raw_input_contents for 'y' for model "
        f"'{M}'"
    )


def test_extensions_listed_are_the_ones_that_work(triton: ServerProcess) -> None:
    http = triton_http.InferenceServerClient(triton.http_address)
    rpc = triton_grpc.InferenceServerClient(triton.grpc_address)
    assert http.get_server_metadata()["extensions"] == EXTENSIONS
    assert list(rpc.get_server_metadata().extensions) == EXTENSIONS
    # Each one listed works...
    assert http.get_inference_statistics(M)["model_stats"][0]["name"] == M  # statistics
    assert {"name": M, "version": "1", "state": "READY"} in rpc.get_model_repository_index(
        as_json=True
    )["models"]  # model_repository
    assert http.get_model_config(M)["name"] == M  # model_configuration
    wanted = [triton_http.InferRequestedOutput("y", binary_data=True)]
    result = http.infer(  # binary_tensor_data, schedule_policy (priority, timeout), parameters
        M, [_http_input()], outputs=wanted, priority=1, timeout=1_000_000, parameters={"k": "v"}
    )
    assert result.as_numpy("y").ravel().tolist() == [2.5, 3.0, 4.5]
    assert http.get_system_shared_memory_status() == []  # system_shared_memory
    assert http.get_trace_settings()["trace_level"] == ["OFF"]  # trace (no exporter: off)
    assert rpc.get_log_settings(as_json=True)["settings"]["log_info"] == {"bool_param": True}
    classes = [triton_http.InferRequestedOutput("y", class_count=3)]  # classification
    result = http.infer(M, [_http_input()], outputs=classes)
    assert result.as_numpy("y").tolist() == [[b"2.500000:0"], [b"3.000000:0"], [b"4.500000:0"]]
    http.unload_model("broken", unload_dependents=True)  # model_repository(unload_dependents)
    # ... and none that does not work is listed.
    with pytest.raises(InferenceServerException, match="needs a GPU"):
        http.register_cuda_shared_memory("gpu", "aGFuZGxl", 0, 16)
    with pytest.raises(InferenceServerException) as info:
        rpc.register_cuda_shared_memory("gpu", "aGFuZGxl", 0, 16)
    assert info.value.status() == "StatusCode.UNIMPLEMENTED"
