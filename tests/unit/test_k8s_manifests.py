"""deploy/k8s: every overlay renders with ``kubectl kustomize`` and every object is valid, offline.

Core objects are checked by ``kubernetes-validate`` against the bundled JSON schema of a
current Kubernetes (strict: an unknown field fails). KEDA's ScaledObject and the Prometheus
operator's PodMonitor are checked against models generated from their published CRD schemas
(``cloudcoil-models-keda``, ``cloudcoil-models-prometheus-operator``), with unknown fields
caught by a round trip. Then the pieces must agree with each other and with inferd itself:
settings names, the drain and the grace period, metric names, the generated Envoy bootstrap.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import yaml

from inferd.app.drain import QUIET_S, STOP_GRACE_S
from inferd.app.flags import from_sources, parse_size
from inferd.app.settings import Settings
from inferd.observability.metrics import EndpointStats, build_registry, render
from inferd.plane.registry import ModelRecord, Registry
from tests.echo_support import echo_version
from tests.manifests import DEPLOY, KUBECTL, cloudcoil_problems
from tests.manifests import render as render_manifests

if TYPE_CHECKING:
    from cloudcoil.resources import Resource

K8S = DEPLOY / "k8s"
OVERLAYS = ["base", "overlays/hpa", "overlays/keda", "overlays/many-models"]
pytestmark = pytest.mark.skipif(KUBECTL is None, reason="kubectl (for kubectl kustomize) absent")


def _render(overlay: str) -> list[dict[str, Any]]:
    return render_manifests(K8S / overlay)


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict[str, Any]]]:
    return {overlay: _render(overlay) for overlay in OVERLAYS}


def _one(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (found,) = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


def _check_custom(obj: dict[str, Any]) -> None:
    model: type[Resource]
    if obj["kind"] == "ScaledObject":
        from cloudcoil.models.keda.v1alpha1 import ScaledObject

        model = ScaledObject
    elif obj["kind"] == "PodMonitor":
        from cloudcoil.models.prometheus_operator.v1 import PodMonitor

        model = PodMonitor
    else:
        raise AssertionError(f"no schema for {obj['kind']}")
    assert cloudcoil_problems(model, obj) == []


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_object_is_valid(rendered: dict[str, list[dict[str, Any]]], overlay: str) -> None:
    import kubernetes_validate
    from kubernetes_validate.utils import latest_version

    version = latest_version()
    kinds = []
    for obj in rendered[overlay]:
        kinds.append(obj["kind"])
        if obj["apiVersion"].startswith(("keda.sh/", "monitoring.coreos.com/")):
            _check_custom(obj)
        else:
            kubernetes_validate.validate(obj, version, strict=True)
    expected = {"ConfigMap", "Deployment", "Service", "PodDisruptionBudget"}
    expected |= {"overlays/hpa": {"HorizontalPodAutoscaler", "PodMonitor"}}.get(overlay, set())
    expected |= {"overlays/keda": {"ScaledObject", "PodMonitor"}}.get(overlay, set())
    expected |= {"overlays/many-models": {"PodMonitor"}}.get(overlay, set())
    assert set(kinds) == expected


def test_a_wrong_object_is_caught() -> None:
    import kubernetes_validate

    bad = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "x"}, "spec": {"portz": []}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, "1.33", strict=True)
    scaled = {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": {"name": "x"},
        "spec": {"scaleTargetRef": {"name": "inferd"}, "minReplicas": 0, "triggers": []},
    }
    with pytest.raises(AssertionError):
        _check_custom(scaled)  # minReplicas is not a field (minReplicaCount is)


def _settings(objects: list[dict[str, Any]]) -> dict[str, str]:
    (config,) = [
        o
        for o in objects
        if o["kind"] == "ConfigMap" and o["metadata"]["name"].startswith("inferd-")
    ]
    data: dict[str, str] = config["data"]
    return data


def test_the_deployment_matches_the_drain_and_the_settings(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    objects = rendered["base"]
    settings = _settings(objects)
    fields = {f"INFERD_{f.name.upper()}" for f in dataclasses.fields(Settings)}
    assert set(settings) <= fields, set(settings) - fields  # no misspelt variable
    assert settings["INFERD_MODEL_REPOSITORY"].startswith("s3://")
    assert settings["INFERD_MODEL_CONTROL_MODE"] == "poll"
    pod = _one(objects, "Deployment", "inferd")["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert container["startupProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    pre_stop_s = int(container["lifecycle"]["preStop"]["exec"]["command"][-1])
    drain_s = int(settings["INFERD_DRAIN_TIMEOUT_S"])
    grace_s = pod["spec"]["terminationGracePeriodSeconds"]
    assert grace_s >= pre_stop_s + drain_s + QUIET_S + STOP_GRACE_S
    assert container["args"] == ["--node-name=$(POD_NAME)"]
    env = {e["name"]: e["valueFrom"] for e in container["env"]}
    assert env["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["AWS_ACCESS_KEY_ID"]["secretKeyRef"]["name"] == "inferd-s3"
    assert env["AWS_SECRET_ACCESS_KEY"]["secretKeyRef"]["name"] == "inferd-s3"
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert {settings["INFERD_MODEL_CACHE_DIR"], "/tmp"} <= mounts
    assert set(container["resources"]) == {"requests", "limits"}
    annotations = pod["metadata"]["annotations"]
    assert annotations == {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": "8080",
        "prometheus.io/path": "/metrics",
    }
    service = _one(objects, "Service", "inferd")
    assert {p["name"]: p.get("appProtocol") for p in service["spec"]["ports"]} == {
        "http": "http",
        "grpc": "grpc",
    }
    assert service["metadata"]["annotations"]["prometheus.io/scrape"] == "true"
    assert _one(objects, "Service", "inferd-headless")["spec"]["clusterIP"] == "None"
    pdb = _one(objects, "PodDisruptionBudget", "inferd")
    assert pdb["spec"]["selector"]["matchLabels"] == pod["metadata"]["labels"] | {}


def test_envoy_runs_the_bootstrap_inferd_envoy_config_writes(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    objects = rendered["base"]
    (config,) = [
        o
        for o in objects
        if o["kind"] == "ConfigMap" and o["metadata"]["name"].startswith("envoy-")
    ]
    command = [
        sys.executable,
        "-m",
        "inferd",
        "envoy-config",
        "--upstream",
        "inferd-headless:8080:8081",
        "--strict-dns",
        "--stats-listen",
        "0.0.0.0:9902",
    ]
    expected = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    assert config["data"]["envoy.yaml"] == expected
    bootstrap = yaml.safe_load(expected)
    assert {c["type"] for c in bootstrap["static_resources"]["clusters"][:2]} == {"STRICT_DNS"}
    pod = _one(objects, "Deployment", "envoy")["spec"]["template"]["spec"]
    volume = next(v for v in pod["volumes"] if v["name"] == "config")
    assert volume["configMap"]["name"] == config["metadata"]["name"]  # the hashed name
    (container,) = pod["containers"]
    assert container["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "stats"}
    assert {p["name"]: p["containerPort"] for p in container["ports"]} == {
        "http": 8080,
        "grpc": 8081,
        "stats": 9902,
    }


def test_many_models_serves_lazily_and_envoy_routes_by_model(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    objects = rendered["overlays/many-models"]
    settings = from_sources(None, _settings(objects))  # as the pod reads them
    assert settings.lazy_serving()
    budget = parse_size(settings.model_memory_budget, "budget")
    pod = _one(objects, "Deployment", "inferd")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    limit = parse_size(container["resources"]["limits"]["memory"], "limit")
    assert budget <= limit - (512 << 20)  # room beside the models for the process itself
    cache = next(v for v in pod["volumes"] if v["name"] == "model-cache")
    cache_max = parse_size(settings.model_cache_max_bytes, "cache")
    assert cache_max < parse_size(cache["emptyDir"]["sizeLimit"], "volume")
    (config,) = [
        o
        for o in objects
        if o["kind"] == "ConfigMap" and o["metadata"]["name"].startswith("envoy-")
    ]
    command = [
        sys.executable,
        "-m",
        "inferd",
        "envoy-config",
        "--upstream",
        "inferd-headless:8080:8081",
        "--strict-dns",
        "--stats-listen",
        "0.0.0.0:9902",
        "--route-by-model",
    ]
    expected = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    assert config["data"]["envoy.yaml"] == expected
    clusters = yaml.safe_load(expected)["static_resources"]["clusters"]
    assert {c["name"]: c.get("lb_policy") for c in clusters} == {
        "inferd_http": "ROUND_ROBIN",
        "inferd_grpc": "ROUND_ROBIN",
        "inferd_http_by_model": "RING_HASH",
        "inferd_grpc_by_model": "RING_HASH",
        "envoy_admin": None,
    }


def _metric_names() -> str:
    """inferd's /metrics text with one model loaded."""
    registry = Registry()
    with tempfile.TemporaryDirectory() as root:
        version = echo_version(Path(root))
        registry.put(ModelRecord(version.name, versions={1: version}))
        return render(build_registry(registry, EndpointStats())).decode()


def test_autoscaling_uses_metrics_inferd_exports(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    exported = _metric_names()
    rules = yaml.safe_load((K8S / "prometheus-adapter" / "rules.yaml").read_text())["rules"]
    served = set()
    for rule in rules:
        series = rule["seriesQuery"].split("{")[0]
        assert f"\n{series}{{" in exported, series
        assert "<<.LabelMatchers>>" in rule["metricsQuery"]
        assert "<<.GroupBy>>" in rule["metricsQuery"]
        for name in ("inferd_queue_duration_seconds_count",):
            if name in rule["metricsQuery"]:
                assert f"\n{name}{{" in exported
        served.add(rule["name"]["as"])
    hpa = _one(rendered["overlays/hpa"], "HorizontalPodAutoscaler", "inferd")
    wanted = {m["pods"]["metric"]["name"] for m in hpa["spec"]["metrics"]}
    assert wanted == served == {"inferd_requests_per_second", "inferd_queue_seconds"}
    scaled = _one(rendered["overlays/keda"], "ScaledObject", "inferd")
    assert scaled["spec"]["minReplicaCount"] == 0
    first = scaled["spec"]["triggers"][0]["metadata"]["query"]
    assert (
        "rate(inferd_request_success_total{" in first
        and "\ninferd_request_success_total{" in exported
    )
    assert scaled["spec"]["scaleTargetRef"]["name"] == hpa["spec"]["scaleTargetRef"]["name"]
