"""Settings -> the edge: safe defaults of the admin API, TLS flag pairs, Triton's gRPC names."""

from __future__ import annotations

import pytest

from inferd.app import edge, flags
from inferd.core.errors import ConfigError
from inferd.security.access import Access, AccessPolicy


def _policy(*argv: str, address: str) -> AccessPolicy:
    s = flags.parse(["--model-repository", "m", *argv], environ={})
    return edge.access_policy(s, edge.token_store(s), address)


def test_admin_api_safe_defaults() -> None:
    assert _policy(address="0.0.0.0").admin_off()
    assert _policy(address="127.0.0.1").admin_off()  # mode none
    assert not _policy("--model-control-mode", "explicit", address="127.0.0.1").admin_off()
    assert not _policy("--model-control-mode", "poll", address="::1").admin_off()
    assert _policy("--model-control-mode", "explicit", address="0.0.0.0").admin_off()
    assert not _policy("--allow-unauthenticated-admin", address="0.0.0.0").admin_off()
    with_token = _policy("--admin-token", "t", address="0.0.0.0")
    assert not with_token.admin_off() and with_token.needs_token(Access.ADMIN)
    assert not with_token.needs_token(Access.INFERENCE)


def test_tls_flags() -> None:
    s = flags.parse(["--model-repository", "m", "--tls-cert", "c.pem"], environ={})
    with pytest.raises(ConfigError, match="both a certificate and its key"):
        edge.http_tls(s)
    s = flags.parse(["--model-repository", "m", "--grpc-use-ssl"], environ={})
    with pytest.raises(ConfigError, match="--grpc-use-ssl needs"):
        edge.grpc_tls(s)
    s = flags.parse(["--model-repository", "m", "--grpc-use-ssl-mutual"], environ={})
    with pytest.raises(ConfigError, match="--grpc-root-cert"):
        edge.grpc_tls(s)


def test_code_policy_from_flags() -> None:
    s = flags.parse(
        ["--model-repository", "m", "--allow-pickle", "--allow-unsafe-ops", "never"],
        environ={"INFERD_ADMIN_TOKEN": "x"},
    )
    policy = edge.code_policy(s, edge.token_store(s))
    assert policy.pickle.value == "always" and policy.unsafe_ops.value == "never"
    assert policy.python_models.value == "startup" and policy.admin_token


def test_the_inflight_limit_is_a_server_total_shared_by_the_workers() -> None:
    s = flags.parse(["--max-inflight-requests", "1024", "--http-min-body-rate-bytes", "500"])
    assert edge.inflight_share(s, 1) == 1024
    assert edge.inflight_share(s, 3) == 342  # rounded up: the total is never cut below
    limits = edge.http_limits(s, 4)
    assert limits.max_inflight_requests == 256
    assert limits.body_rate.min_bytes_per_s == 500 and limits.body_rate.grace_s == 10.0
    unlimited = flags.parse(["--max-inflight-requests", "0"])
    assert edge.inflight_share(unlimited, 4) == 0


def test_grpc_limits_from_their_flags() -> None:
    s = flags.parse(
        [
            "--grpc-keepalive-time",
            "60000",
            "--grpc-keepalive-timeout",
            "5000",
            "--grpc-http2-max-ping-strikes",
            "3",
            "--grpc-max-concurrent-streams",
            "50",
            "--grpc-idle-timeout-s",
            "30",
        ]
    )
    limits = edge.grpc_limits(s)
    assert (limits.keepalive_time_s, limits.keepalive_timeout_s) == (60.0, 5.0)
    assert (limits.max_ping_strikes, limits.max_concurrent_streams) == (3, 50)
    assert limits.idle_timeout_s == 30.0 and limits.max_header_list_bytes == 16 * 1024
    assert limits.min_ping_interval_s == 300.0 and not limits.keepalive_permit_without_calls
    with pytest.raises(ConfigError, match="--grpc-body-timeout-s"):
        edge.grpc_limits(flags.parse(["--grpc-body-timeout-s", "0"]))
