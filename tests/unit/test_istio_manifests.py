"""deploy/istio: every kustomization renders with ``kubectl kustomize``; the Kubernetes objects
are valid (``kubernetes-validate``, strict) and the VirtualService and DestinationRule fit
Istio's ``networking.istio.io/v1`` CRD schema (cloudcoil's models of it; an unknown field
fails). Then the pieces must agree: 80/20 between stable and canary, all of it mirrored to the
shadow, each subset naming one version's pods, the sidecar outliving inferd's drain."""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

import pytest
import yaml

from inferd.app.drain import QUIET_S, STOP_GRACE_S
from tests.manifests import DEPLOY, KUBECTL, cloudcoil_problems, render

if TYPE_CHECKING:
    from cloudcoil.resources import Resource

ISTIO = DEPLOY / "istio"
FOLDERS = [".", "version", "stable", "canary", "shadow"]
VERSIONS = ("stable", "canary", "shadow")
pytestmark = pytest.mark.skipif(KUBECTL is None, reason="kubectl (for kubectl kustomize) absent")


@pytest.fixture(scope="module")
def objects() -> list[dict[str, Any]]:
    return render(ISTIO)


def _one(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (found,) = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


def _istio_model(kind: str) -> type[Resource]:
    from cloudcoil.models.istio.networking.v1 import DestinationRule, VirtualService

    models: dict[str, type[Resource]] = {
        "VirtualService": VirtualService,
        "DestinationRule": DestinationRule,
    }
    return models[kind]


@pytest.mark.parametrize("folder", FOLDERS)
def test_every_object_is_valid(folder: str) -> None:
    import kubernetes_validate
    from kubernetes_validate.utils import latest_version

    kinds = set()
    for obj in render(ISTIO / folder):
        kinds.add(obj["kind"])
        if obj["apiVersion"].startswith("networking.istio.io/"):
            assert obj["apiVersion"] == "networking.istio.io/v1"
            assert cloudcoil_problems(_istio_model(obj["kind"]), obj) == []
        else:
            kubernetes_validate.validate(obj, latest_version(), strict=True)
    expected = {"ConfigMap", "Deployment", "PodDisruptionBudget"}  # Envoy's are dropped
    if folder == ".":
        expected |= {"Service", "DestinationRule", "VirtualService"}
    assert kinds == expected


def test_a_wrong_field_is_caught(objects: list[dict[str, Any]]) -> None:
    from pydantic import ValidationError

    route = copy.deepcopy(_one(objects, "VirtualService", "inferd"))
    route["spec"]["http"][0]["mirrorPercentag"] = {"value": 100}
    assert cloudcoil_problems(_istio_model("VirtualService"), route) == [
        ".spec.http[0].mirrorPercentag: not a field of VirtualService"
    ]
    rule = copy.deepcopy(_one(objects, "DestinationRule", "inferd"))
    rule["spec"]["trafficPolicy"]["loadBalancer"]["simple"] = "FASTEST"
    with pytest.raises(ValidationError):
        cloudcoil_problems(_istio_model("DestinationRule"), rule)


def test_the_split_and_the_mirror(objects: list[dict[str, Any]]) -> None:
    service = _one(objects, "Service", "inferd")
    rule = _one(objects, "DestinationRule", "inferd")["spec"]
    route = _one(objects, "VirtualService", "inferd")["spec"]
    assert rule["host"] == service["metadata"]["name"]
    assert route["hosts"] == [service["metadata"]["name"]]
    (http,) = route["http"]
    weights = {r["destination"]["subset"]: r["weight"] for r in http["route"]}
    assert weights == {"stable": 80, "canary": 20}
    assert {r["destination"]["host"] for r in http["route"]} == {rule["host"]}
    assert http["mirror"] == {"host": rule["host"], "subset": "shadow"}
    assert http["mirrorPercentage"] == {"value": 100.0}
    # Retried only where no model saw the request (an inference is not always idempotent).
    assert set(http["retries"]["retryOn"].split(",")) <= {
        "connect-failure",
        "refused-stream",
        "reset",
    }

    subsets = {s["name"]: s["labels"] for s in rule["subsets"]}
    assert set(subsets) == set(VERSIONS)
    pods = {}
    for version in VERSIONS:
        deployment = _one(objects, "Deployment", f"inferd-{version}")
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
        pods[version] = labels
    for name, wanted in subsets.items():  # each subset selects one version's pods
        chosen = [v for v, labels in pods.items() if wanted.items() <= labels.items()]
        assert chosen == [name]
    # The Service names every version's pods; its ports are named for Istio's protocol sniffing.
    assert all(service["spec"]["selector"].items() <= p.items() for p in pods.values())
    ports = {p["name"]: p for p in service["spec"]["ports"]}
    assert {n: p["appProtocol"] for n, p in ports.items()} == {"http": "http", "grpc": "grpc"}
    (container,) = _one(objects, "Deployment", "inferd-stable")["spec"]["template"]["spec"][
        "containers"
    ]
    named = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert {p["targetPort"] for p in ports.values()} <= set(named)


def test_the_versions_differ_where_they_should(objects: list[dict[str, Any]]) -> None:
    images = {}
    repositories = {}
    for version in VERSIONS:
        pod = _one(objects, "Deployment", f"inferd-{version}")["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        images[version] = container["image"]
        (source,) = container["envFrom"]
        settings = _one(objects, "ConfigMap", source["configMapRef"]["name"])
        repositories[version] = settings["data"]["INFERD_MODEL_REPOSITORY"]
    assert images["canary"] != images["stable"] == images["shadow"]
    assert repositories["shadow"] != repositories["stable"] == repositories["canary"]


def test_the_sidecar_outlives_the_drain(objects: list[dict[str, Any]]) -> None:
    for version in VERSIONS:
        template = _one(objects, "Deployment", f"inferd-{version}")["spec"]["template"]
        proxy = yaml.safe_load(template["metadata"]["annotations"]["proxy.istio.io/config"])
        assert proxy["holdApplicationUntilProxyStarts"] is True
        (container,) = template["spec"]["containers"]
        (source,) = container["envFrom"]
        settings = _one(objects, "ConfigMap", source["configMapRef"]["name"])["data"]
        pre_stop_s = int(container["lifecycle"]["preStop"]["exec"]["command"][-1])
        drain_s = int(settings["INFERD_DRAIN_TIMEOUT_S"])
        sidecar_s = int(proxy["terminationDrainDuration"].removesuffix("s"))
        assert pre_stop_s + drain_s + QUIET_S + STOP_GRACE_S <= sidecar_s
        assert sidecar_s <= template["spec"]["terminationGracePeriodSeconds"]
