"""Triton's system shared-memory extension with unmodified tritonclient (HTTP, and gRPC on both
servers): regions registered and listed, inputs read and outputs written in place, windows
checked against their region, vanished regions and CUDA refused cleanly."""

from __future__ import annotations

import base64
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from tests.support import ServerProcess

M = "half_plus_two"
X = np.array([[1.0], [2.0], [-4.0]], dtype=np.float32)  # y = x / 2 + 2


@pytest.fixture(scope="module", params=["native", "grpcio"])
def served(
    request: pytest.FixtureRequest, demo_repo: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("shm") / "models"
    shutil.copytree(demo_repo / M, root / M)
    server = ServerProcess(root, extra_args=["--grpc-server", request.param]).start()
    yield server
    server.stop()


@pytest.fixture(params=["http", "grpc"])
def client(request: pytest.FixtureRequest, served: ServerProcess) -> Iterator[Any]:
    if request.param == "http":
        found: Any = triton_http.InferenceServerClient(served.http_address)
    else:
        found = triton_grpc.InferenceServerClient(served.grpc_address)
    found.kind = request.param
    yield found
    found.unregister_system_shared_memory()


@pytest.fixture
def regions(served: ServerProcess, client: Any) -> Iterator[tuple[Any, Any]]:
    """An input region holding X at offset 16, and an output region, both registered."""
    tag = f"{served.http_port}_{client.kind}"
    region_in = shm.create_shared_memory_region("in", f"/inferd_in_{tag}", 64)
    region_out = shm.create_shared_memory_region("out", f"/inferd_out_{tag}", 64)
    shm.set_shared_memory_region(region_in, [X], offset=16)
    client.register_system_shared_memory("in", f"/inferd_in_{tag}", 64)
    client.register_system_shared_memory("out", f"/inferd_out_{tag}", 32, offset=32)
    yield region_in, region_out
    client.unregister_system_shared_memory()
    for region in (region_in, region_out):
        shm.destroy_shared_memory_region(region)


def _module(client: Any) -> Any:
    return triton_http if client.kind == "http" else triton_grpc


def _input(client: Any, offset: int = 16, byte_size: int = X.nbytes, region: str = "in") -> Any:
    tensor = _module(client).InferInput("x", list(X.shape), "FP32")
    tensor.set_shared_memory(region, byte_size, offset=offset)
    return tensor


def _output(client: Any, byte_size: int = 32) -> Any:
    out = _module(client).InferRequestedOutput("y")
    out.set_shared_memory("out", byte_size)
    return out


def test_inputs_and_outputs_in_shared_memory(client: Any, regions: tuple[Any, Any]) -> None:
    region_in, region_out = regions
    result = client.infer(M, [_input(client)], outputs=[_output(client)])
    y = shm.get_contents_as_numpy(region_out, np.float32, [3, 1], offset=32)
    np.testing.assert_array_equal(y, [[2.5], [3.0], [0.0]])
    # As Triton answers (perf_analyzer's C++ client relies on it): over HTTP the output has no
    # data and no parameters; over gRPC it keeps its place with an empty raw_output_contents.
    out = result.get_output("y")
    if client.kind == "http":
        assert out == {"name": "y", "datatype": "FP32", "shape": [3, 1]}
    else:
        assert (out.name, out.datatype, list(out.shape)) == ("y", "FP32", [3, 1])
        assert list(result.get_response().raw_output_contents) == [b""]
    # New values in place, the same registration: the server reads them, not a copy.
    shm.set_shared_memory_region(region_in, [X * 10], offset=16)
    client.infer(M, [_input(client)], outputs=[_output(client)])
    y = shm.get_contents_as_numpy(region_out, np.float32, [3, 1], offset=32)
    np.testing.assert_array_equal(y, [[7.0], [12.0], [-18.0]])
    # Input in shared memory, output on the wire.
    assert client.infer(M, [_input(client)]).as_numpy("y").ravel().tolist() == [7, 12, -18]


def test_status_lists_the_registered_regions(client: Any, regions: tuple[Any, Any]) -> None:
    if client.kind == "http":
        found = {r["name"]: r for r in client.get_system_shared_memory_status()}
        assert found["out"]["offset"] == 32 and found["out"]["byte_size"] == 32
        assert found["in"]["key"].startswith("/inferd_in_")
        assert client.get_system_shared_memory_status("in")[0]["byte_size"] == 64
    else:
        found = client.get_system_shared_memory_status().regions
        assert (found["out"].offset, found["out"].byte_size) == (32, 32)
        assert found["in"].key.startswith("/inferd_in_")
    client.unregister_system_shared_memory("in")
    with pytest.raises(InferenceServerException, match="Unable to find system shared memory"):
        client.get_system_shared_memory_status("in")
    with pytest.raises(InferenceServerException, match="'in' is not registered"):
        client.infer(M, [_input(client)])


def test_an_unknown_cuda_region_is_not_found(client: Any) -> None:
    """As an unknown system region: 404 / NOT_FOUND (no GPU here: none is ever registered)."""
    with pytest.raises(InferenceServerException, match="Unable to find cuda shared memory") as e:
        client.get_cuda_shared_memory_status("nothing")
    assert e.value.status() in ("404", "StatusCode.NOT_FOUND")


@pytest.mark.parametrize(
    ("offset", "byte_size", "output_size", "fragment"),
    [
        (60, 12, 32, "offset 60 \\+ byte_size 12 is outside shared memory region 'in' of 64"),
        (16, 8, 32, "needs 12 bytes, got 8"),
        (16, 12, 40, "offset 0 \\+ byte_size 40 is outside shared memory region 'out'"),
        (16, 12, 8, "output 'y' needs 12 bytes but its shared memory window 'out' has 8"),
    ],
)
def test_windows_are_checked(
    client: Any,
    regions: tuple[Any, Any],
    offset: int,
    byte_size: int,
    output_size: int,
    fragment: str,
) -> None:
    with pytest.raises(InferenceServerException, match=fragment):
        client.infer(M, [_input(client, offset, byte_size)], outputs=[_output(client, output_size)])
    assert client.infer(M, [_input(client)]).as_numpy("y").ravel().tolist() == [2.5, 3.0, 0.0]


def test_bad_registrations_and_a_vanished_region(served: ServerProcess, client: Any) -> None:
    tag = f"{served.http_port}_{client.kind}_gone"
    with pytest.raises(InferenceServerException, match="cannot open key '/inferd_nokey'"):
        client.register_system_shared_memory("nokey", "/inferd_nokey", 16)
    region = shm.create_shared_memory_region("gone", f"/inferd_{tag}", 16)
    try:
        with pytest.raises(InferenceServerException, match="exceeds the 16 bytes"):
            client.register_system_shared_memory("gone", f"/inferd_{tag}", 16, offset=8)
        client.register_system_shared_memory("gone", f"/inferd_{tag}", 16)
        with pytest.raises(InferenceServerException, match="already registered"):
            client.register_system_shared_memory("gone", f"/inferd_{tag}", 8)
    finally:
        shm.destroy_shared_memory_region(region)  # the client removes the object
    with pytest.raises(InferenceServerException, match="no longer exists"):
        client.infer(M, [_input(client, 0, 12, region="gone")])
    with pytest.raises(InferenceServerException, match="needs a GPU"):
        client.register_cuda_shared_memory("gpu", base64.b64encode(b"handle"), 0, 16)
    client.unregister_system_shared_memory("gone")
    with pytest.raises(InferenceServerException, match="'gone' is not registered"):
        client.infer(M, [_input(client, 0, 12, region="gone")])


def test_extension_listed(client: Any) -> None:
    metadata = client.get_server_metadata()
    extensions = metadata["extensions"] if client.kind == "http" else metadata.extensions
    assert "system_shared_memory" in extensions
    assert "cuda_shared_memory" not in extensions
