"""Envoy's view of the cluster for the dashboard: its admin ``/clusters?format=json``, condensed.

The server fetches it (the browser could not: Envoy's admin port sends no CORS headers and is
not meant to face operators' browsers) with a short timeout, off the event loop, and keeps
per upstream host its address, health, weight and request and connection counters.
"""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request
from typing import Any

import orjson

from inferd.core.errors import ConfigError, Unavailable

TIMEOUT_S = 2.0
MAX_BYTES = 8 * 1024 * 1024
_COUNTERS = ("rq_total", "rq_success", "rq_error", "rq_timeout", "cx_total", "cx_connect_fail")
_GAUGES = ("rq_active", "cx_active")
# health_status flags that mark a host out of rotation.
_FAILED_FLAGS = (
    "failed_active_health_check",
    "failed_outlier_check",
    "failed_active_degraded_check",
    "pending_dynamic_removal",
    "pending_active_hc",
    "excluded_via_immediate_hc_fail",
    "active_hc_timeout",
)
HINT = (
    "Start inferd with --envoy-admin http://ENVOY_HOST:9901 (the admin address of the Envoy in "
    "front of the replicas) to see every node with its health and traffic here."
)


def check_admin_url(url: str) -> str:
    if not url.startswith(("http://", "https://")):
        raise ConfigError(f"--envoy-admin must be an http:// or https:// URL, got '{url}'")
    return url.rstrip("/")


def _address(host: dict[str, Any]) -> str:
    socket = host.get("address", {}).get("socket_address", {})
    if socket:
        return f"{socket.get('address', '?')}:{socket.get('port_value', '?')}"
    pipe = host.get("address", {}).get("pipe", {})
    return str(pipe.get("path", "?"))


def _health(status: dict[str, Any]) -> tuple[bool, list[str]]:
    """Whether a host takes traffic, and the reasons it does not."""
    reasons = [flag for flag in _FAILED_FLAGS if status.get(flag)]
    eds = status.get("eds_health_status", "HEALTHY")
    if eds not in ("HEALTHY", "UNKNOWN", "DEGRADED"):
        reasons.append(f"eds: {eds}")
    return not reasons, reasons


def condense(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Clusters and their hosts from Envoy's ``/clusters?format=json`` document."""
    clusters = []
    for cluster in doc.get("cluster_statuses", []):
        hosts = []
        for host in cluster.get("host_statuses", []):
            stats = {s.get("name"): int(s.get("value", 0)) for s in host.get("stats", [])}
            healthy, reasons = _health(host.get("health_status", {}))
            hosts.append(
                {
                    "address": _address(host),
                    "hostname": host.get("hostname", ""),
                    "healthy": healthy,
                    "health": reasons,
                    "weight": int(host.get("weight", 1)),
                    **{name: stats.get(name, 0) for name in (*_COUNTERS, *_GAUGES)},
                }
            )
        clusters.append({"name": cluster.get("name", "?"), "hosts": hosts})
    return clusters


def _fetch(url: str) -> bytes:
    request = urllib.request.Request(url, headers={"accept": "application/json"})
    with urllib.request.urlopen(request, timeout=TIMEOUT_S) as answer:
        data: bytes = answer.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        raise ValueError(f"the answer is over {MAX_BYTES} bytes")
    return data


async def clusters(admin_url: str) -> dict[str, Any]:
    """The cluster panel's document; Unavailable naming the problem if Envoy does not answer."""
    url = f"{admin_url}/clusters?format=json"
    try:
        data = await asyncio.to_thread(_fetch, url)
        doc = orjson.loads(data)
        if not isinstance(doc, dict):
            raise ValueError("the answer is not a JSON object")
        found = condense(doc)
    except (OSError, urllib.error.URLError, ValueError, TypeError, AttributeError) as exc:
        raise Unavailable(f"Envoy admin at {admin_url} did not answer /clusters: {exc}") from None
    return {"enabled": True, "admin": admin_url, "clusters": found}
