"""The ensemble "backend" (Triton's ``platform: "ensemble"``): no model file and no runtime;
its models are schedulers that call their composing models (``backends.ensemble_graph``).

The control plane loads the composing models first (``dependencies``), and the loader builds
an ``EnsembleScheduler`` (``load_scheduler``) in place of instances.
"""

from __future__ import annotations

from pathlib import Path

from inferd.backends.base import Backend, InstancePlacement
from inferd.backends.ensemble_graph import ENSEMBLE_PLATFORM, EnsembleScheduler, build_graph
from inferd.backends.work import Runtime
from inferd.config.model_config_pb2 import ModelConfig
from inferd.core.errors import ConfigError
from inferd.core.stats import ModelStats
from inferd.core.types import ModelCaller


class EnsembleBackend(Backend):
    name = "ensemble"
    platforms: tuple[str, ...] = (ENSEMBLE_PLATFORM,)
    default_filename = ""  # an ensemble's version folder is empty

    def complete_config(
        self, version_dir: Path, config: ModelConfig, default_max_batch_size: int
    ) -> None:
        """An ensemble lists its own inputs and outputs; only the graph is checked here."""
        if not config.input or not config.output:
            raise ConfigError("an ensemble lists its inputs and outputs in config.pbtxt")
        build_graph(config)

    def dependencies(self, config: ModelConfig) -> list[str]:
        """The composing models (the graph is checked first: a bad one fails the plan)."""
        return build_graph(config).models()

    def load(self, version_dir: Path, config: ModelConfig, placement: InstancePlacement) -> Runtime:
        raise ConfigError("an ensemble has no runtime: the loader builds its scheduler")

    def load_scheduler(
        self, config: ModelConfig, call_model: ModelCaller | None, stats: ModelStats
    ) -> EnsembleScheduler:
        if call_model is None:
            raise ConfigError("this server cannot run ensembles (no way to call models)")
        return EnsembleScheduler(build_graph(config), call_model, stats)
