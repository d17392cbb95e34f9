"""The HTTP middleware chain in front of the router: Host, Origin (CORS), content type, token.

Runs once per request after the route is matched and before its body is read, in this order:
the ``Host`` header against ``--allowed-hosts`` (or the loopback names when bound to loopback:
DNS rebinding), a browser's ``Origin`` against the server itself and ``--cors-allow-origin``,
the ``Content-Type`` of admin calls (no browser "simple" form or text requests), then the
token and its scope (``inferd.security.access``). Each step is skipped when it cannot apply,
so an open server pays two header look-ups per request.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from inferd.core.errors import PermissionDenied, UnsupportedMediaType
from inferd.security.access import Access, AccessPolicy, is_loopback

LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "::1"})
# The content types a cross-site page can send without a CORS preflight.
SIMPLE_TYPES = ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data")
ALLOWED_HEADERS = (
    "authorization, content-type, content-encoding, inference-header-content-length, "
    "x-request-id, traceparent, tracestate"
)
EXPOSED_HEADERS = "inference-header-content-length, x-request-id, www-authenticate"
ALLOWED_METHODS = "GET, POST, PUT, OPTIONS"
PREFLIGHT_MAX_AGE_S = 600
ACCEPTED_HOSTS_KEPT = 64  # distinct Host headers remembered as accepted

CorsHeaders = Sequence[tuple[str, str]]
NO_CORS: CorsHeaders = ()  # none to send (no guard, or a preflight refused)


def host_name(host: str) -> str:
    """The name in a Host header, without its port, lower case."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host
    name, sep, port = host.rpartition(":")
    return name if sep and port.isdecimal() else host


class HttpGuard:
    def __init__(
        self,
        policy: AccessPolicy,
        *,
        bind_address: str = "0.0.0.0",
        allowed_hosts: Sequence[str] = (),
        cors_allow_origin: Sequence[str] = (),
    ) -> None:
        self.policy = policy
        # A tuple, not a dict: ``in`` compares enum members by identity, in C (an Enum's
        # hash is Python code).
        self._check = tuple(
            a for a in Access if policy.needs_token(a) or (a is Access.ADMIN and policy.admin_off())
        )
        names = [h.strip().lower() for h in allowed_hosts if h.strip()]
        if "*" in names:
            self._hosts: frozenset[str] | None = None
        elif names:
            self._hosts = frozenset(names)
        else:
            self._hosts = LOOPBACK_HOSTS if is_loopback(bind_address) else None
        self._loopback = not names and self._hosts is not None
        self._suffixes = tuple(n[1:] for n in names if n.startswith("*."))
        # Host headers already accepted (clients send the same few): one set lookup each.
        self._accepted: set[str | None] = set()
        origins = [o.strip().rstrip("/") for o in cors_allow_origin if o.strip()]
        self._any_origin = "*" in origins
        self._origins = frozenset(o.lower() for o in origins)

    def check(self, method: str, headers: Mapping[str, str], access: Access) -> CorsHeaders:
        """Raise PermissionDenied, UnsupportedMediaType or Unauthenticated; else the CORS
        headers the answer carries (none for a non-browser or same-origin request)."""
        if self._hosts is not None:
            host = headers.get("host")
            if host not in self._accepted:
                self._check_host(host)
        cors: CorsHeaders = []
        origin = headers.get("origin")
        if origin is not None:
            cors = self._check_origin(origin, headers.get("host"))
        if access is Access.ADMIN and method in ("POST", "PUT"):
            kind = headers.get("content-type", "").split(";")[0].strip().lower()
            if kind in SIMPLE_TYPES:
                raise UnsupportedMediaType(
                    f"Content-Type '{kind}' is not accepted by the admin API: send "
                    "application/json (or the archive's own type for uploads)"
                )
        if access in self._check:
            self.policy.check(access, headers.get("authorization"))
        return cors

    def _check_host(self, host: str | None) -> None:
        if host is None or self._host_ok(host):  # None: HTTP/1.0, nothing to rebind
            if len(self._accepted) < ACCEPTED_HOSTS_KEPT:
                self._accepted.add(host)
            return
        raise PermissionDenied(
            f"Host '{host[:100]}' is not served here (--allowed-hosts; a DNS rebinding guard)"
        )

    def _host_ok(self, host: str) -> bool:
        name = host_name(host)
        if self._hosts is not None and name in self._hosts:
            return True
        if self._loopback and is_loopback(name):
            return True  # an address literal such as 127.0.0.2 (a rebinding attack sends a name)
        return bool(self._suffixes) and name.endswith(self._suffixes)

    def _check_origin(self, origin: str, host: str | None) -> CorsHeaders:
        normalized = origin.strip().rstrip("/").lower()
        if self._any_origin or normalized in self._origins:
            return [
                ("access-control-allow-origin", origin),
                ("access-control-expose-headers", EXPOSED_HEADERS),
                ("vary", "origin"),
            ]
        if host is not None and normalized.partition("://")[2] == host.strip().lower():
            return []  # same origin: a page served by this server
        raise PermissionDenied(
            f"requests from origin '{origin[:100]}' are not allowed (--cors-allow-origin)"
        )

    def preflight(self, headers: Mapping[str, str]) -> CorsHeaders:
        """The answer to a CORS preflight (OPTIONS), or PermissionDenied."""
        origin = headers.get("origin")
        if origin is None:
            raise PermissionDenied("an OPTIONS request needs an Origin header (CORS preflight)")
        if self._hosts is not None:
            self._check_host(headers.get("host"))
        cors = self._check_origin(origin, headers.get("host"))
        if not cors:
            cors = [("access-control-allow-origin", origin), ("vary", "origin")]
        return [
            *cors,
            ("access-control-allow-methods", ALLOWED_METHODS),
            ("access-control-allow-headers", ALLOWED_HEADERS),
            ("access-control-max-age", str(PREFLIGHT_MAX_AGE_S)),
        ]
