"""deploy/kserve: the ClusterServingRuntime and the InferenceService examples fit KServe's CRDs
as its Python SDK models them (an unknown field fails), and agree with inferd: its flags, its
ports, its health routes, the formats it serves, and what KServe does with an
InferenceService's own args (it appends them to the runtime's)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from inferd.app.flags import parse, parse_size
from inferd.app.settings import Settings
from inferd.backends import get_backend
from tests.manifests import DEPLOY, KUBECTL, check_kserve, load, render

KSERVE = DEPLOY / "kserve"
EXAMPLES = sorted((KSERVE / "examples").glob("*.yaml"))
HANDLERS = {"httpGet", "grpc", "tcpSocket", "exec"}  # a probe has one of these
# The examples whose storageUri holds one model's files (KServe's and TF Serving's layout).
SINGLE_MODEL = {"sklearn", "xgboost", "lightgbm", "tensorflow"}
pytestmark = pytest.mark.skipif(KUBECTL is None, reason="kubectl (for kubectl kustomize) absent")
# A KServe model format -> the inferd backends that serve it (a Triton repository: any).
FORMATS: dict[str, tuple[str, ...]] = {
    "onnx": ("onnxruntime",),
    "tensorflow": ("tensorflow",),
    "pytorch": ("pytorch", "torchserve"),
    "sklearn": ("sklearn",),
    "xgboost": ("xgboost",),
    "lightgbm": ("lightgbm",),
    "openvino": ("openvino",),
    "python": ("python",),
    "triton": (),
}


@pytest.fixture(scope="module")
def runtime() -> dict[str, Any]:
    (found,) = render(KSERVE)
    assert found["kind"] == "ClusterServingRuntime"
    return found


def _container(runtime: dict[str, Any]) -> dict[str, Any]:
    containers: list[dict[str, Any]] = runtime["spec"]["containers"]
    (container,) = containers
    return container


def _settings(runtime: dict[str, Any], more: list[str] | None = None) -> Settings:
    """What `inferd serve` makes of the runtime's args (and an InferenceService's after them),
    $(POD_NAME) expanded as Kubernetes does."""
    args = [a.replace("$(POD_NAME)", "isvc-predictor-0") for a in _container(runtime)["args"]]
    return parse([*args, *(more or [])], environ={})


def test_the_runtime_fits_the_sdk(runtime: dict[str, Any]) -> None:
    assert check_kserve(runtime) == []


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_every_example_fits_the_sdk(path: Path) -> None:
    (isvc,) = load(path)
    assert isvc["kind"] == "InferenceService"
    assert check_kserve(isvc) == []


def test_a_wrong_field_is_caught(runtime: dict[str, Any]) -> None:
    (isvc,) = load(KSERVE / "examples" / "triton-grpc.yaml")
    model = isvc["spec"]["predictor"]["model"]
    model["storageURI"] = model.pop("storageUri")  # a KServe model field
    model["ports"][0]["containerPorts"] = 9000  # a Kubernetes field inside it
    isvc["spec"]["predictor"]["minReplicas"] = "1"  # a type
    del model["modelFormat"]  # a required field
    assert check_kserve(isvc) == [
        ".spec.predictor.model.storageURI: not a field of V1beta1ModelSpec",
        ".spec.predictor.model.ports[0]: Additional properties are not allowed "
        "('containerPorts' was unexpected)",
        ".spec.predictor.model: Invalid value for `model_format`, must not be `None`",
        ".spec.predictor.minReplicas: int expected, not '1'",
    ]
    bad = copy.deepcopy(runtime)
    bad["spec"]["supportedModelFormats"][0]["autoselect"] = True
    _container(bad)["arg"] = []
    assert check_kserve(bad) == [
        ".spec.containers[0]: Additional properties are not allowed ('arg' was unexpected)",
        ".spec.supportedModelFormats[0].autoselect: not a field of V1alpha1SupportedModelFormat",
    ]


def test_the_runtime_runs_inferd_as_kserve_expects(runtime: dict[str, Any]) -> None:
    container = _container(runtime)
    assert container["name"] == "kserve-container"  # the name KServe merges the model into
    assert container["command"] == ["inferd", "serve"]
    settings = _settings(runtime)
    # The storage initializer's folder, read as a repository; KServe's ports: 8080 for HTTP
    # (Knative's default), 9000 for gRPC (its runtimes'); the probes on inferd's routes.
    assert settings.model_repository == ["/mnt/models"]
    assert settings.model_control_mode == "none"  # the files never change under a pod
    assert (settings.http_port, settings.grpc_port) == (8080, 9000)
    assert settings.node_name == "isvc-predictor-0"
    assert container["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": 8080}
    assert container["livenessProbe"]["httpGet"] == {"path": "/v2/health/live", "port": 8080}
    annotations = runtime["spec"]["annotations"]
    assert annotations["prometheus.kserve.io/port"] == str(settings.http_port)
    assert annotations["prometheus.kserve.io/path"] == "/metrics"
    env = {e["name"]: e for e in container["env"]}
    assert env["POD_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert parse([], environ={"INFERD_LOG_FORMAT": env["INFERD_LOG_FORMAT"]["value"]})
    shm = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert shm == {"dshm": "/dev/shm"}
    assert runtime["spec"]["volumes"] == [
        {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}}
    ]
    assert set(runtime["spec"]["protocolVersions"]) == {"v1", "v2", "grpc-v1", "grpc-v2"}
    assert "multiModel" not in runtime["spec"]  # ModelMesh's puller: not this runtime


def test_every_format_the_runtime_lists_has_a_backend(runtime: dict[str, Any]) -> None:
    listed = {f["name"] for f in runtime["spec"]["supportedModelFormats"]}
    assert listed == set(FORMATS)
    for backends in FORMATS.values():
        for name in backends:
            assert get_backend(name).name == name


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_every_example_runs_on_the_runtime(runtime: dict[str, Any], path: Path) -> None:
    (isvc,) = load(path)
    predictor = isvc["spec"]["predictor"]
    model = predictor["model"]
    assert model["runtime"] == runtime["metadata"]["name"]
    formats = {f["name"] for f in runtime["spec"]["supportedModelFormats"]}
    assert model["modelFormat"]["name"] in formats
    assert model["protocolVersion"] in runtime["spec"]["protocolVersions"]
    assert model["storageUri"].split("://")[0] in ("s3", "gs")
    settings = _settings(runtime, model.get("args", []))  # KServe appends them
    limit = parse_size(model["resources"]["limits"]["memory"], "limit")
    if model["protocolVersion"].startswith("grpc-"):
        # Knative routes one port: the gRPC one, named h2c.
        assert model["ports"] == [
            {"name": "h2c", "containerPort": settings.grpc_port, "protocol": "TCP"}
        ]
    else:
        assert "ports" not in model  # the runtime's HTTP port, 8080
    # KServe merges the model's container into the runtime's field by field (args appended):
    # a probe there must not add a second handler to the runtime's.
    container = _container(runtime)
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        merged = {**container.get(probe, {}), **model.get(probe, {})}
        assert len(HANDLERS & set(merged)) <= 1, (probe, merged)
    # One model's files under the storageUri: named as KServe's runtimes name it.
    assert bool(settings.model_name) == (path.stem in SINGLE_MODEL)
    if settings.model_name:
        assert settings.model_name == isvc["metadata"]["name"]
    if path.stem == "many-models":
        assert settings.lazy_serving()
        budget = parse_size(settings.model_memory_budget, "budget")
        assert budget <= limit - (512 << 20)  # room beside the models for the process itself
        annotations = isvc["metadata"]["annotations"]
        assert annotations["serving.kserve.io/deploymentMode"] == "RawDeployment"
        assert predictor["scaleMetric"] == "memory"
    else:
        assert not settings.lazy_serving()
