"""Envoy's /clusters document condensed for the cluster panel; an Envoy that does not answer."""

from __future__ import annotations

import asyncio

import pytest

from inferd.core.errors import ConfigError, Unavailable
from inferd.dashboard import envoy
from tests.e2e.dashboard_support import envoy_clusters, fake_envoy_admin
from tests.support import free_port


def test_condense_keeps_health_weight_and_counters() -> None:
    (cluster,) = envoy.condense(envoy_clusters(8080))
    assert cluster["name"] == "inferd"
    good, bad = cluster["hosts"]
    assert good == {
        "address": "127.0.0.1:8080",
        "hostname": "",
        "healthy": True,
        "health": [],
        "weight": 1,
        "rq_total": 120,
        "rq_success": 119,
        "rq_error": 1,
        "rq_timeout": 0,
        "cx_total": 3,
        "cx_connect_fail": 0,
        "rq_active": 0,
        "cx_active": 2,
    }
    assert bad["healthy"] is False and bad["health"] == ["failed_active_health_check"]


def test_an_eds_status_other_than_healthy_takes_a_host_out() -> None:
    doc = {
        "cluster_statuses": [
            {
                "name": "c",
                "host_statuses": [
                    {
                        "address": {"socket_address": {"address": "10.0.0.9", "port_value": 80}},
                        "health_status": {"eds_health_status": "DRAINING"},
                    }
                ],
            }
        ]
    }
    (host,) = envoy.condense(doc)[0]["hosts"]
    assert host["healthy"] is False and host["health"] == ["eds: DRAINING"]
    assert host["rq_total"] == 0


def test_clusters_from_a_live_admin_port() -> None:
    with fake_envoy_admin(envoy_clusters(9000)) as admin:
        doc = asyncio.run(envoy.clusters(admin))
    assert doc["enabled"] is True and doc["admin"] == admin
    addresses = [h["address"] for h in doc["clusters"][0]["hosts"]]
    assert addresses == ["127.0.0.1:9000", "127.0.0.2:8080"]


def test_an_admin_port_that_does_not_answer_is_unavailable() -> None:
    admin = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(Unavailable, match=r"Envoy admin at http://127\.0\.0\.1:\d+ did not answer"):
        asyncio.run(envoy.clusters(admin))


def test_the_admin_url_must_be_http() -> None:
    assert envoy.check_admin_url("http://envoy:9901/") == "http://envoy:9901"
    with pytest.raises(ConfigError, match="--envoy-admin must be an http"):
        envoy.check_admin_url("envoy:9901")
