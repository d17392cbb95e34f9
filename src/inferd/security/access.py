"""Who may call what: the one access decision that the HTTP middleware and the gRPC
interceptor both apply, before any handler runs.

Every route and RPC belongs to one class: public (the dashboard page's files), health,
metrics, inference (infer, metadata, readiness, statistics, index, the dashboard's reads) or
admin (load, unload, upload, routing and labels, logs, trace and log settings, the
repository's status and a model's files). With no admin token configured the admin API is off
unless the operator opened it (``--allow-unauthenticated-admin``, or poll/explicit mode on
loopback).
"""

from __future__ import annotations

import enum
import ipaddress
from dataclasses import dataclass

from inferd.core.errors import PermissionDenied, Unauthenticated
from inferd.security.tokens import Scope, TokenStore, token_from_header


class Access(enum.Enum):
    PUBLIC = "public"  # the dashboard page's static files: never a token
    HEALTH = "health"
    METRICS = "metrics"
    INFERENCE = "inference"
    ADMIN = "admin"


def is_loopback(address: str) -> bool:
    host = address.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True, slots=True)
class AccessPolicy:
    tokens: TokenStore
    auth_health: bool = False
    auth_metrics: bool = False
    admin_open: bool = False  # serve the admin API although no admin token is configured

    @classmethod
    def open(cls) -> AccessPolicy:
        """No tokens, admin API on: for tests and embedding."""
        return cls(TokenStore(), admin_open=True)

    def needs_token(self, access: Access) -> bool:
        if access is Access.PUBLIC:
            return False
        inference = self.tokens.has(Scope.INFERENCE)
        admin = self.tokens.has(Scope.ADMIN)
        if access is Access.ADMIN:
            return admin
        if access is Access.INFERENCE:
            return inference
        flag = self.auth_health if access is Access.HEALTH else self.auth_metrics
        return flag and (inference or admin)

    def admin_off(self) -> bool:
        return not self.tokens.has(Scope.ADMIN) and not self.admin_open

    def check(self, access: Access, authorization: str | None) -> None:
        """Pass, or raise Unauthenticated (no or unknown token) / PermissionDenied."""
        if access is Access.ADMIN and self.admin_off():
            raise PermissionDenied(
                "the admin API is off: configure --admin-token (or --admin-token-file), or run "
                "in poll or explicit mode bound to loopback, or pass "
                "--allow-unauthenticated-admin"
            )
        if not self.needs_token(access):
            return
        if not authorization:
            raise Unauthenticated(f"this {access.value} call needs a token (Authorization header)")
        scope = self.tokens.scope_of(token_from_header(authorization))
        if scope is None:
            raise Unauthenticated("the token is not valid")
        if access is Access.ADMIN and scope < Scope.ADMIN:
            raise PermissionDenied("this call needs a token of the admin scope")
