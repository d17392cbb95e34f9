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
