"""Offline checks of the manifests under deploy/: render a kustomization, and check an object
against the real schema of its kind, an unknown field included.

- Kubernetes objects, and the Kubernetes types inside other objects (a container, its probes),
  against the JSON schema of a current Kubernetes that ``kubernetes-validate`` bundles (strict:
  an unknown field fails).
- KServe's resources against the models of KServe's Python SDK (``kserve.models``), generated
  from its CRDs. The models take keyword arguments and keep no unknown key, so every key is
  checked against each model's ``attribute_map``, recursively, by its ``openapi_types``.
- Resources whose CRDs cloudcoil generates pydantic models for (KEDA, the Prometheus operator,
  Istio), by validating and dumping again: a field the schema does not know is dropped.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import json
import re
import shutil
import subprocess
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

if TYPE_CHECKING:
    from cloudcoil.resources import Resource

KUBECTL = shutil.which("kubectl")
DEPLOY = Path(__file__).parents[1] / "deploy"


def render(folder: Path) -> list[dict[str, Any]]:
    """The objects ``kubectl kustomize`` builds from a kustomization folder."""
    assert KUBECTL is not None
    done = subprocess.run(
        [KUBECTL, "kustomize", str(folder)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def load(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def unknown_fields(given: Any, kept: Any, path: str = "") -> Iterator[str]:
    """Paths in ``given`` that a model dropped (fields its schema does not know)."""
    if isinstance(given, dict):
        for key, value in given.items():
            if not isinstance(kept, dict) or key not in kept:
                yield f"{path}.{key}"
            else:
                yield from unknown_fields(value, kept[key], f"{path}.{key}")
    elif isinstance(given, list) and isinstance(kept, list):
        for i, (a, b) in enumerate(zip(given, kept, strict=False)):
            yield from unknown_fields(a, b, f"{path}[{i}]")


def cloudcoil_problems(model: type[Resource], obj: dict[str, Any]) -> list[str]:
    """Types, enums and required fields (pydantic raises), then fields the model dropped."""
    parsed = model.model_validate(obj)
    kept = parsed.model_dump(by_alias=True, exclude_unset=True, mode="json")
    return [f"{path}: not a field of {obj['kind']}" for path in unknown_fields(obj, kept)]


# --- Kubernetes types, by the Kubernetes client's names (V1Container, V1ObjectMeta...) -------

_K8S_NAME = re.compile(r"V(\d+)((?:alpha|beta)\d+)?([A-Z]\w*)")
_DEFINITIONS_ID = "https://kubernetes.io/api/_definitions.json"


@functools.cache
def _k8s_definitions() -> tuple[dict[str, Any], Any]:
    """The strict definitions of the newest Kubernetes that kubernetes-validate bundles, and
    a registry that resolves references to them."""
    import kubernetes_validate
    import referencing
    from kubernetes_validate.utils import latest_version

    root = Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema"
    contents = json.loads(
        (root / f"v{latest_version()}-local-strict/_definitions.json").read_text()
    )
    assert contents["$id"] == _DEFINITIONS_ID
    registry = referencing.Resource.from_contents(contents) @ referencing.Registry()
    return contents["$defs"], registry


def k8s_problems(data: Any, type_name: str, path: str) -> list[str]:
    """``data`` against the Kubernetes definition the client calls ``type_name``."""
    import jsonschema

    match = _K8S_NAME.fullmatch(type_name)
    if match is None:
        return [f"{path}: no schema for the type {type_name}"]
    version = f"v{match[1]}{match[2] or ''}"
    definitions, registry = _k8s_definitions()
    keys = [k for k in definitions if k.endswith(f".{version}.{match[3]}")]
    if len(keys) != 1:
        return [f"{path}: no single Kubernetes definition for {type_name}: {keys}"]
    schema = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$ref": f"{_DEFINITIONS_ID}#/$defs/{keys[0]}",
    }
    validator = jsonschema.Draft202012Validator(schema, registry=registry)
    return [
        path
        + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in e.absolute_path)
        + f": {e.message}"
        for e in validator.iter_errors(data)
    ]


# --- KServe, by its SDK's generated models ----------------------------------------------------


def kserve_models() -> types.ModuleType:
    """``kserve.models``, imported without the package's ``__init__``: that one imports KServe's
    model server (FastAPI, pandas...), which the dev tools leave out (scripts/setup installs the
    SDK with --no-deps); the generated models need only six and urllib3."""
    if "kserve.models" in sys.modules:
        return sys.modules["kserve.models"]
    if "kserve" not in sys.modules:
        spec = importlib.util.find_spec("kserve")
        assert spec is not None and spec.submodule_search_locations is not None, "kserve absent"
        package = types.ModuleType("kserve")
        package.__path__ = list(spec.submodule_search_locations)
        sys.modules["kserve"] = package
    return importlib.import_module("kserve.models")


_NATIVE: dict[str, tuple[type, ...]] = {
    "str": (str,),
    "int": (int,),
    "float": (int, float),
    "bool": (bool,),
    "datetime": (str,),
    "date": (str,),
    "object": (object,),
}


def kserve_problems(data: Any, type_name: str, path: str = "") -> list[str]:
    """Where ``data`` does not fit the SDK's ``type_name`` (a model's class name, or the
    generator's ``list[...]`` / ``dict(str, ...)``): unknown keys, wrong types, required fields
    missing and values out of an enum (the models' setters check those two)."""
    if inner := re.fullmatch(r"list\[(.+)\]", type_name):
        if not isinstance(data, list):
            return [f"{path}: a list expected, not {data!r}"]
        found: list[str] = []
        for i, item in enumerate(data):
            found += kserve_problems(item, inner[1], f"{path}[{i}]")
        return found
    if inner := re.fullmatch(r"dict\(str, (.+)\)", type_name):
        if not isinstance(data, dict):
            return [f"{path}: a mapping expected, not {data!r}"]
        found = []
        for key, value in data.items():
            found += kserve_problems(value, inner[1], f"{path}.{key}")
        return found
    if type_name in _NATIVE:
        fits = isinstance(data, _NATIVE[type_name])
        if isinstance(data, bool) and type_name in ("int", "float"):
            fits = False
        return [] if fits else [f"{path}: {type_name} expected, not {data!r}"]
    model = getattr(kserve_models(), type_name, None)
    if model is None:  # the SDK's Kubernetes types are the Kubernetes client's
        return k8s_problems(data, type_name, path)
    if not isinstance(data, dict):
        return [f"{path}: a {type_name} mapping expected, not {data!r}"]
    by_key = {key: attr for attr, key in model.attribute_map.items()}
    found = [f"{path}.{key}: not a field of {type_name}" for key in data if key not in by_key]
    for key, value in data.items():
        if key in by_key:
            found += kserve_problems(value, model.openapi_types[by_key[key]], f"{path}.{key}")
    try:
        model(**{by_key[k]: v for k, v in data.items() if k in by_key})
    except ValueError as exc:
        found.append(f"{path or type_name}: {exc}")
    return found


KSERVE_KINDS = {
    "ClusterServingRuntime": "V1alpha1ClusterServingRuntime",
    "ServingRuntime": "V1alpha1ServingRuntime",
    "InferenceService": "V1beta1InferenceService",
}


def check_kserve(obj: dict[str, Any]) -> list[str]:
    """A KServe resource against the SDK's model of its kind."""
    assert obj["apiVersion"].startswith("serving.kserve.io/"), obj["apiVersion"]
    version = obj["apiVersion"].split("/")[1]
    type_name = KSERVE_KINDS[obj["kind"]]
    assert type_name.lower().startswith(version), (type_name, version)
    return kserve_problems(obj, type_name)
