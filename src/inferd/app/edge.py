"""The server's edge, from Settings: tokens and scopes, code policy, browser guards, TLS,
connection and request limits. ``server.py`` builds the frontends with what this returns.
"""

from __future__ import annotations

import logging
import resource
import sys
from typing import Any

from inferd.app.settings import Settings
from inferd.core.errors import ConfigError
from inferd.protocols.transport.h2grpc.host import Limits as GrpcLimits
from inferd.protocols.transport.http_body import BodyRate, Limits
from inferd.security.access import AccessPolicy, is_loopback
from inferd.security.http_guard import HttpGuard
from inferd.security.tls import Tls, read_pem
from inferd.security.tokens import Scope, TokenStore
from inferd.security.trust import CodePolicy, Grant

log = logging.getLogger("inferd.security")

FD_RESERVE = 256  # descriptors kept for model files, gRPC and logs beyond HTTP connections


def _tls(cert: str, key: str, client_ca: str, what: str) -> Tls | None:
    if not cert and not key:
        if client_ca:
            raise ConfigError(f"{what}: a client CA needs a certificate and key too")
        return None
    if not (cert and key):
        raise ConfigError(f"{what}: give both a certificate and its key")
    for path in (cert, key, client_ca):
        if path:
            read_pem(path)
    return Tls(cert, key, client_ca)


def http_tls(settings: Settings) -> Tls | None:
    return _tls(settings.tls_cert, settings.tls_key, settings.tls_client_ca, "--tls-cert")


def grpc_tls(settings: Settings) -> Tls | None:
    """--tls-* serve both ports; Triton's --grpc-* names set (or override) gRPC's own."""
    cert = settings.grpc_server_cert or settings.tls_cert
    key = settings.grpc_server_key or settings.tls_key
    client_ca = settings.grpc_root_cert if settings.grpc_use_ssl_mutual else ""
    client_ca = client_ca or settings.tls_client_ca
    if settings.grpc_use_ssl_mutual and not client_ca:
        raise ConfigError("--grpc-use-ssl-mutual needs --grpc-root-cert (or --tls-client-ca)")
    tls = _tls(cert, key, client_ca, "--grpc-server-cert")
    if settings.grpc_use_ssl and tls is None:
        raise ConfigError("--grpc-use-ssl needs --grpc-server-cert and --grpc-server-key")
    return tls


def token_store(settings: Settings) -> TokenStore:
    return TokenStore(
        settings.auth_token,
        settings.admin_token,
        settings.auth_token_file,
        settings.admin_token_file,
    )


def access_policy(settings: Settings, tokens: TokenStore, address: str) -> AccessPolicy:
    """The access rules for one port, bound to ``address``."""
    explicit_or_poll = settings.model_control_mode.strip().lower() in ("explicit", "poll")
    admin_open = settings.allow_unauthenticated_admin or (explicit_or_poll and is_loopback(address))
    return AccessPolicy(tokens, settings.auth_health, settings.auth_metrics, admin_open)


def code_policy(settings: Settings, tokens: TokenStore) -> CodePolicy:
    return CodePolicy(
        pickle=Grant.parse(settings.allow_pickle, "--allow-pickle"),
        python_models=Grant.parse(settings.allow_python_models, "--allow-python-models"),
        unsafe_ops=Grant.parse(settings.allow_unsafe_ops, "--allow-unsafe-ops"),
        admin_token=tokens.has(Scope.ADMIN),
    )


def http_guard(settings: Settings, policy: AccessPolicy) -> HttpGuard:
    return HttpGuard(
        policy,
        bind_address=settings.http_address,
        allowed_hosts=settings.allowed_hosts,
        cors_allow_origin=settings.cors_allow_origin,
    )


def inflight_share(settings: Settings, workers: int = 1) -> int:
    """One worker's share of --max-inflight-requests, a total for the server (0: no limit)."""
    total = max(0, settings.max_inflight_requests)
    return -(-total // max(1, workers)) if total else 0


def http_limits(settings: Settings, workers: int = 1) -> Limits:
    if settings.http_body_timeout_s <= 0 or settings.http_header_timeout_s <= 0:
        raise ConfigError("--http-header-timeout-s and --http-body-timeout-s must be positive")
    return Limits(
        max_body_bytes=settings.http_max_body_bytes,
        body_timeout_s=settings.http_body_timeout_s,
        body_rate=BodyRate(
            grace_s=settings.http_header_timeout_s,
            min_bytes_per_s=max(0, settings.http_min_body_rate_bytes),
        ),
        max_inflight_requests=inflight_share(settings, workers),
        max_inflight_bytes=max(0, settings.max_inflight_bytes),
    )


def grpc_limits(settings: Settings) -> GrpcLimits:
    """The gRPC port's connection limits and timeouts, from their flags."""
    timeouts = (
        settings.grpc_header_timeout_s,
        settings.grpc_body_timeout_s,
        settings.grpc_idle_timeout_s,
        settings.grpc_keepalive_time,
        settings.grpc_keepalive_timeout,
    )
    if min(timeouts) <= 0:
        raise ConfigError(
            "--grpc-header-timeout-s, --grpc-body-timeout-s, --grpc-idle-timeout-s, "
            "--grpc-keepalive-time and --grpc-keepalive-timeout must be positive"
        )
    if settings.grpc_max_concurrent_streams < 1 or settings.grpc_max_header_list_bytes < 1024:
        raise ConfigError(
            "--grpc-max-concurrent-streams must be at least 1 and "
            "--grpc-max-header-list-bytes at least 1024"
        )
    return GrpcLimits(
        max_message_bytes=settings.grpc_max_message_bytes,
        max_concurrent_streams=settings.grpc_max_concurrent_streams,
        max_header_list_bytes=settings.grpc_max_header_list_bytes,
        max_buffered_bytes=settings.max_inflight_bytes or sys.maxsize,
        header_timeout_s=settings.grpc_header_timeout_s,
        body_timeout_s=settings.grpc_body_timeout_s,
        idle_timeout_s=settings.grpc_idle_timeout_s,
        keepalive_time_s=settings.grpc_keepalive_time / 1000,
        keepalive_timeout_s=settings.grpc_keepalive_timeout / 1000,
        keepalive_permit_without_calls=settings.grpc_keepalive_permit_without_calls,
        min_ping_interval_s=settings.grpc_http2_min_recv_ping_interval_without_data / 1000,
        max_ping_strikes=max(0, settings.grpc_http2_max_ping_strikes),
    )


def granian_options(settings: Settings) -> dict[str, Any]:
    """Connection limits, header timeout and size, TLS for the embedded granian server."""
    from granian.http import HTTP1Settings

    if settings.http_max_header_bytes < 8192:
        raise ConfigError("--http-max-header-bytes must be at least 8192")
    from granian.constants import HTTPModes

    options: dict[str, Any] = {
        # HTTP/1.1 only: in granian's auto mode a connection that sends nothing waits for its
        # protocol to be detected, with no timeout; HTTP/1's header timeout closes it.
        "http": HTTPModes.http1,
        # granian holds one permit per open connection: idle ones must not use them all up.
        "backpressure": connection_limit(settings.http_max_connections),
        "http1_settings": HTTP1Settings(
            header_read_timeout=int(settings.http_header_timeout_s * 1000),
            keep_alive=True,
            max_buffer_size=settings.http_max_header_bytes,
        ),
    }
    tls = http_tls(settings)
    if tls is not None:
        options.update(tls.granian_options())
    return options


def connection_limit(wanted: int) -> int:
    """``wanted``, raising the open-files limit to fit it where the hard limit allows."""
    if wanted < 1:
        raise ConfigError("--http-max-connections must be at least 1")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = wanted + FD_RESERVE
    if soft != resource.RLIM_INFINITY and soft < need:
        target = need if hard == resource.RLIM_INFINITY else min(need, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    if soft != resource.RLIM_INFINITY and soft < need:
        fitted = max(1, soft - FD_RESERVE)
        log.warning(
            "--http-max-connections %d does not fit the open-files limit %d: serving %d",
            wanted,
            soft,
            fitted,
        )
        return fitted
    return wanted


def warn_if_open(settings: Settings, tokens: TokenStore) -> None:
    """One clear line when anyone who reaches a non-loopback port may use it unchecked."""
    open_ports = [
        address
        for address, enabled in (
            (f"{settings.http_address}:{settings.http_port}", True),
            (f"{settings.grpc_address}:{settings.grpc_port}", settings.allow_grpc),
        )
        if enabled and not is_loopback(address.rpartition(":")[0])
    ]
    if not open_ports:
        return
    if not tokens.has(Scope.INFERENCE) and not tokens.has(Scope.ADMIN):
        log.warning(
            "serving without authentication on %s: anyone who reaches it can run inference%s; "
            "set --auth-token and --admin-token",
            ", ".join(open_ports),
            " and change models (--allow-unauthenticated-admin)"
            if settings.allow_unauthenticated_admin
            else "",
        )
    elif settings.allow_unauthenticated_admin and not tokens.has(Scope.ADMIN):
        log.warning(
            "the admin API is open to anyone on %s (--allow-unauthenticated-admin)",
            ", ".join(open_ports),
        )
