"""The backend contract: a ``Backend`` completes a model's config and loads ``Runtime``s.

A backend is a subclass of ``Backend`` found by name: a built-in in ``inferd.backends.BUILTIN``,
or a third-party one under the ``inferd.backends`` entry-point group (``inferd.backends.found``).
It must say what it is (``name``, ``platforms``, ``default_filename``) and load a model
(``load``); every other hook below has a default that suits a framework whose model runs on
threads, one batch at a time, with no config of its own to read. The server calls each hook
directly: a backend changes a behaviour by overriding its hook, never by having an attribute
the server looks for.

A Runtime sees only numpy arrays shaped as the model itself expects (after any config
reshape) and never a request, a protocol or a queue.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from inferd.backends.work import Runtime
from inferd.config.model_config_pb2 import ModelConfig
from inferd.core.errors import ConfigError

if TYPE_CHECKING:
    from inferd.backends.process import ProcessRecipe
    from inferd.backends.work import Executor, Scheduler
    from inferd.config.spec import SignatureSpec
    from inferd.core.stats import ModelStats
    from inferd.core.types import ModelCaller

__all__ = ["Backend", "InstancePlacement", "Runtime", "available_cpus", "model_path"]


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


class Backend(ABC):
    """A framework adapter. Subclass it, set the three class attributes, implement ``load``
    and override the hooks whose default does not suit your framework.

    One instance serves every model of the backend, from several threads: keep per-model
    state in the Runtime, not here.
    """

    # The name a config selects it by (``backend: "<name>"``), and the one it is listed under.
    name: str = ""
    # Triton ``platform`` values that select this backend (``platform: "onnxruntime_onnx"``).
    platforms: tuple[str, ...] = ()
    # The file (or folder) a version directory holds; a config's ``default_model_filename``
    # overrides it (``model_path``).
    default_filename: str = ""
    # Whether every instance runs in a model process of its own, whatever the config says
    # (code that must not share the server's interpreter). False: threads, unless the config
    # sets ``process_instances``.
    processes_only: bool = False

    @abstractmethod
    def load(self, version_dir: Path, config: ModelConfig, placement: InstancePlacement) -> Runtime:
        """One execution instance of the model in ``version_dir`` (the completed config; where
        it runs in ``placement``). Raise ``ConfigError`` for a model that cannot load."""

    def complete_config(
        self, version_dir: Path, config: ModelConfig, default_max_batch_size: int
    ) -> None:
        """Fill in missing inputs, outputs and max_batch_size from the model file (run at
        each load unless the server runs with auto-completion off).

        ``default_max_batch_size`` applies when the config is empty and every tensor of the
        model has a variable first dimension (Triton's autocomplete rule). The default reads
        nothing: the config must list the model's inputs and outputs itself.
        """
        if not config.input or not config.output:
            raise ConfigError(
                f"the {self.name} backend reads no inputs and outputs from the model file: "
                "list them in config.pbtxt"
            )

    def gpu_available(self) -> bool:
        """Whether ``KIND_GPU`` instances can run on a GPU here (default: no, they run on
        the CPU with a warning)."""
        return False

    def prime(self) -> bool:
        """Load the framework once, before the first model, so that the memory a later load
        takes is the model's own (lazy serving measures each load). True when it loaded
        something; the default has nothing to load."""
        return False

    def dependencies(self, config: ModelConfig) -> Sequence[str]:
        """The models this model calls (ensembles, pipelines): the control plane loads them
        first and refuses a cycle. Default: none."""
        return ()

    def signatures(self, version_dir: Path, config: ModelConfig) -> dict[str, SignatureSpec]:
        """Other signatures the model file offers, by name (a TF SavedModel's SignatureDefs):
        requests naming one run through ``Runtime.execute_signature``. Default: none."""
        return {}

    def load_executor(
        self, version_dir: Path, config: ModelConfig, placement: InstancePlacement
    ) -> Executor | None:
        """A request-level executor in place of ``load``'s batch Runtime, for models that
        answer request by request (Python models, decoupled responses). Default: None, the
        Runtime behind ``inferd.backends.work.BatchExecutor``."""
        return None

    def process_recipe(
        self, version_dir: Path, config: ModelConfig, placement: InstancePlacement
    ) -> ProcessRecipe | None:
        """How a model process builds this model's executor, when it runs in one. Default:
        None, the process gets this backend by name and calls ``load_executor`` or ``load``
        there; a backend whose models need another interpreter or setup gives its own."""
        return None

    def load_scheduler(
        self, config: ModelConfig, call_model: ModelCaller | None, stats: ModelStats
    ) -> Scheduler | None:
        """A scheduler of the backend's own in place of instances (an ensemble runs its graph
        over other models through ``call_model``). Default: None, instances and the config's
        batcher."""
        return None


def model_path(version_dir: Path, config: ModelConfig, backend: Backend) -> Path:
    return version_dir / (config.default_model_filename or backend.default_filename)
