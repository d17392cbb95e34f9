"""The backend seam: a Backend completes a config and loads Runtimes that execute whole batches.

A Runtime sees only numpy arrays shaped as the model itself expects (after any config
reshape) and never a request, a protocol or a queue.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from inferd.config.model_config_pb2 import ModelConfig
from inferd.core.types import Tensors


@dataclass(frozen=True, slots=True)
class InstancePlacement:
    """Where one execution instance runs and how many threads it may use."""

    kind: str  # "CPU" or "GPU"
    device_id: int
    instance_count: int  # instances of this model version in total, for thread sharing
    index: int = 0  # which instance this is (0 .. instance_count - 1)

    def cpu_threads(self) -> int:
        """A thread share that does not oversubscribe the machine across instances."""
        return max(1, available_cpus() // max(1, self.instance_count))


def available_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


class Runtime(Protocol):
    """One loaded execution instance of a model version (``backends.work.BatchExecutor``
    puts it behind the request-level seam)."""

    # Whether a call may run on the event loop itself when it is fast (the instances measure
    # it on the worker threads first): true for runtimes with no thread affinity.
    inline: bool

    def execute(self, inputs: Tensors, output_names: Sequence[str]) -> Tensors:
        """Run one whole batch; called by one thread at a time per instance."""
        ...

    def close(self) -> None: ...


class SignatureRuntime(Runtime, Protocol):
    """A Runtime whose model file has several signatures (a TF SavedModel's SignatureDefs):
    ``execute`` runs the model's own (the config's) inputs and outputs, this runs another."""

    def execute_signature(
        self, signature: str, inputs: Tensors, output_names: Sequence[str]
    ) -> Tensors: ...


class Backend(Protocol):
    """A framework adapter, found by name in ``inferd.backends.BACKENDS``.

    A backend whose models call other models (ensembles, pipelines) also has
    ``dependencies(config) -> Sequence[str]``: the control plane loads those models first.
    A backend may have ``prime()``: load its framework once, so that the memory a later load
    takes is the model's own (lazy serving measures each model's load).
    """

    name: str
    platforms: tuple[str, ...]  # Triton ``platform`` values that select this backend
    default_filename: str  # the file (or folder) a version directory holds

    def complete_config(
        self, version_dir: Path, config: ModelConfig, default_max_batch_size: int
    ) -> None:
        """Fill in missing inputs, outputs and max_batch_size from the model file.

        ``default_max_batch_size`` applies when the config is empty and every tensor of
        the model has a variable first dimension (Triton's autocomplete rule).
        """
        ...

    def load(self, version_dir: Path, config: ModelConfig, placement: InstancePlacement) -> Runtime:
        """A batch Runtime. A backend whose models answer request by request (Python models)
        also has ``load_executor(version_dir, config, placement)``, returning a request-level
        ``backends.work.Executor`` (or None to fall back to ``load``). A backend whose
        model files hold several signatures also has ``signatures(version_dir, config) ->
        dict[str, config.spec.SignatureSpec]``, and its runtimes are ``SignatureRuntime``s."""
        ...

    def gpu_available(self) -> bool: ...


def model_path(version_dir: Path, config: ModelConfig, backend: Backend) -> Path:
    return version_dir / (config.default_model_filename or backend.default_filename)
