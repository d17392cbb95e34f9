"""HttpGuard and AccessPolicy: Host, Origin, Content-Type and token checks, in that order."""

from __future__ import annotations

import pytest

from inferd.core.errors import PermissionDenied, Unauthenticated, UnsupportedMediaType
from inferd.security.access import Access, AccessPolicy
from inferd.security.http_guard import ACCEPTED_HOSTS_KEPT, HttpGuard, host_name
from inferd.security.tokens import TokenStore

LOCAL = {"host": "127.0.0.1:8080"}


def guard(**kwargs: object) -> HttpGuard:
    policy = kwargs.pop("policy", AccessPolicy.open())
    return HttpGuard(policy, bind_address="127.0.0.1", **kwargs)  # type: ignore[arg-type]


def test_host_names() -> None:
    assert host_name("LOCALHOST:8080") == "localhost"
    assert host_name("[::1]:80") == "::1"
    assert host_name("example.com") == "example.com"


def test_dns_rebinding_is_refused_on_loopback() -> None:
    g = guard()
    assert g.check("GET", LOCAL, Access.INFERENCE) == []
    with pytest.raises(PermissionDenied, match="--allowed-hosts"):
        g.check("GET", {"host": "evil.example:8080"}, Access.INFERENCE)
    g = guard(allowed_hosts=["*.corp.example"])
    g.check("GET", {"host": "api.corp.example"}, Access.INFERENCE)


def test_accepted_hosts_are_remembered_and_refused_ones_never() -> None:
    g = guard()
    for port in range(200):  # more distinct accepted Host headers than it keeps
        assert g.check("GET", {"host": f"127.0.0.1:{port}"}, Access.INFERENCE) == []
    for _ in range(3):  # a refused host is refused every time, never remembered
        with pytest.raises(PermissionDenied, match="--allowed-hosts"):
            g.check("GET", {"host": "evil.example:8080"}, Access.INFERENCE)
    assert len(g._accepted) == ACCEPTED_HOSTS_KEPT and "evil.example:8080" not in g._accepted
    assert g.check("GET", {"host": "localhost:9"}, Access.INFERENCE) == []  # past the bound


def test_origins() -> None:
    g = guard(cors_allow_origin=["https://app.example"])
    same = {**LOCAL, "origin": "http://127.0.0.1:8080"}
    assert g.check("POST", same, Access.INFERENCE) == []
    allowed = dict(g.check("POST", {**LOCAL, "origin": "https://app.example"}, Access.INFERENCE))
    assert allowed["access-control-allow-origin"] == "https://app.example"
    with pytest.raises(PermissionDenied, match="--cors-allow-origin"):
        g.check("POST", {**LOCAL, "origin": "https://evil.example"}, Access.INFERENCE)
    preflight = dict(g.preflight({**LOCAL, "origin": "https://app.example"}))
    assert "authorization" in preflight["access-control-allow-headers"]


def test_simple_content_types_are_refused_on_admin_routes() -> None:
    g = guard()
    for kind in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; b=x"):
        with pytest.raises(UnsupportedMediaType):
            g.check("POST", {**LOCAL, "content-type": kind}, Access.ADMIN)
    g.check("POST", {**LOCAL, "content-type": "application/json"}, Access.ADMIN)
    g.check("POST", {**LOCAL, "content-type": "text/plain"}, Access.INFERENCE)


def test_scopes() -> None:
    policy = AccessPolicy(TokenStore(["inf"], ["adm"]))
    g = guard(policy=policy)
    with pytest.raises(Unauthenticated):
        g.check("POST", LOCAL, Access.INFERENCE)
    g.check("POST", {**LOCAL, "authorization": "Bearer inf"}, Access.INFERENCE)
    with pytest.raises(PermissionDenied, match="admin scope"):
        g.check("POST", {**LOCAL, "authorization": "inf"}, Access.ADMIN)
    g.check("POST", {**LOCAL, "authorization": "adm"}, Access.ADMIN)
    g.check("GET", LOCAL, Access.HEALTH)  # open unless --auth-health


def test_the_admin_api_is_off_without_a_token_unless_opened() -> None:
    off = AccessPolicy(TokenStore())
    with pytest.raises(PermissionDenied, match="admin API is off"):
        off.check(Access.ADMIN, None)
    off.check(Access.INFERENCE, None)
    AccessPolicy(TokenStore(), admin_open=True).check(Access.ADMIN, None)
