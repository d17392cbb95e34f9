"""Echo models in process: a model folder from a config text, loaded as a ModelVersion."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np

from inferd.backends import echo
from inferd.backends.work import Result
from inferd.core.errors import InferdError
from inferd.core.types import InferRequest, Tensors
from inferd.plane.model import ModelState, ModelVersion
from inferd.plane.registry import ModelRecord, Registry, VersionStatus
from inferd.repository.loader import LoadOptions, load_version, plan

_NAMES = itertools.count()

BATCHED = """
backend: "echo"
max_batch_size: 8
input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [2] }]
"""


def echo_version(
    root: Path, config: str = BATCHED, name: str = "", version: int = 1
) -> ModelVersion:
    """Load an echo model (a unique name unless given) with ``config`` (text format)."""
    name = name or f"echo{next(_NAMES)}"
    folder = root / name
    (folder / str(version)).mkdir(parents=True, exist_ok=True)
    (folder / "config.pbtxt").write_text(f'name: "{name}"\n{config}')
    echo.reset(name)
    return load_version(name, version, plan(name, folder), LoadOptions())


def rows(*values: float) -> Tensors:
    """One [n, 2] FP32 input: row i is [v_i, v_i]."""
    x = np.repeat(np.asarray(values, np.float32)[:, None], 2, axis=1)
    return {"INPUT0": x}


def request(model: ModelVersion, *values: float, id: str = "", **params: object) -> InferRequest:
    return InferRequest(model.name, rows(*values), id=id, parameters=dict(params))


def ok(result: Result) -> Tensors:
    """The tensors of one executed request's result, which must not be an error."""
    assert not isinstance(result, InferdError), result
    return result


def registry_with(*models: ModelVersion) -> Registry:
    """A registry holding these versions, grouped by model name, every one READY."""
    registry = Registry()
    for name in sorted({m.name for m in models}):
        versions = {m.version: m for m in sorted(models, key=lambda m: m.version) if m.name == name}
        status = {v: VersionStatus(v, ModelState.READY) for v in versions}
        registry.put(ModelRecord(name, versions=versions, status=status, state=ModelState.READY))
    return registry
