"""Models that need other models (as ensembles will): a load brings them up first; an unload
takes down the models that need the unloaded one, and with Triton's ``unload_dependents``
also what it needed that nothing else needs. Over HTTP and gRPC, with echo models."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http

from tests.e2e.lifecycle_support import HTTP, index
from tests.echo_support import BATCHED as ECHO
from tests.support import ServerProcess

NEEDS = 'parameters {{ key: "depends_on" value: {{ string_value: "{}" }} }}\n'


@pytest.fixture(scope="module")
def graph(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("graph") / "models"
    for name, extra in (("a", ""), ("b", ""), ("ens", NEEDS.format("a,b"))):
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(ECHO + extra)
    server = ServerProcess(root, extra_args=["--model-control-mode", "explicit"]).start()
    yield server
    server.stop()


def _ready(server: ServerProcess) -> list[str]:
    return [e["name"] for e in index(server, ready=True)]


def test_load_and_unload_dependents_over_http(graph: ServerProcess) -> None:
    client = triton_http.InferenceServerClient(graph.http_address)
    client.load_model("ens")
    assert _ready(graph) == ["a", "b", "ens"]
    assert "needs model 'a': loading it first" in graph.log()
    client.unload_model("a")  # ens cannot serve without a: it goes first
    assert _ready(graph) == ["b"]
    client.load_model("ens")
    client.unload_model("ens", unload_dependents=True)
    assert _ready(graph) == []
    r = HTTP.post(
        f"{graph.http_url}/v2/repository/models/ens/unload",
        json={"parameters": {"unload_dependents": "yes"}},
    )
    assert r.status_code == 400 and "unload_dependents must be a boolean" in r.json()["error"]


def test_load_and_unload_dependents_over_grpc(graph: ServerProcess) -> None:
    with triton_grpc.InferenceServerClient(graph.grpc_address) as client:
        client.load_model("ens")
        assert _ready(graph) == ["a", "b", "ens"]
        client.unload_model("ens")  # without unload_dependents what it needed stays
        assert _ready(graph) == ["a", "b"]
        client.load_model("ens")
        client.unload_model("ens", unload_dependents=True)
        assert _ready(graph) == []
