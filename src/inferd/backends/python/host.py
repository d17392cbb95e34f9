"""Builds a Python model's executor where it runs: in its worker process (or, for tests, in
the calling one). Imports ``model.py``, picks the form, and starts the model."""

from __future__ import annotations

import json
from pathlib import Path

from inferd.backends.python.decoupled import DecoupledExecutor
from inferd.backends.python.modelfile import import_model, model_class
from inferd.backends.python.native import NativeRuntime
from inferd.backends.python.triton import TritonExecutor
from inferd.backends.work import BatchExecutor, Executor


def python_executor(
    path: str,
    config_json: str,
    kind: str,
    device_id: int,
    index: int,
    model_dir: str,
    version: str,
) -> Executor:
    """The executor of one instance: ``TritonExecutor``, or a ``NativeRuntime`` behind
    ``BatchExecutor`` (it takes whole batches)."""
    model_file = Path(path)
    config = json.loads(config_json)
    name = str(config.get("name", Path(model_dir).name))
    label = f"{name}/{version}"
    form, cls = model_class(import_model(model_file), model_file)
    if form == "native":
        return BatchExecutor(label, NativeRuntime(cls, model_file, config, label))
    args = {
        "model_config": config_json,
        "model_instance_kind": kind,
        "model_instance_name": f"{name}_0_{index}",
        "model_instance_device_id": str(device_id),
        "model_repository": model_dir,
        "model_version": version,
        "model_name": name,
    }
    if config.get("model_transaction_policy", {}).get("decoupled"):
        return DecoupledExecutor(cls, model_file, args, config, label)
    return TritonExecutor(cls, model_file, args, config, label)
