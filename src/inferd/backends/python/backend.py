"""The Python backend as the server sees it: checks and completes a ``model.py`` model's config
and says how its worker processes build it. The server itself never imports ``model.py``.

Python models always run in worker processes (``processes_only``), each with the interpreter
``EXECUTION_ENV_PATH`` names (default: the server's). Whether the server may run Python models
at all is the operator's decision (``--allow-python-models``, ``inferd.security.trust``);
nothing in a model's config or a request enables them.
"""

from __future__ import annotations

import json
from pathlib import Path

from inferd.backends.base import Backend, InstancePlacement
from inferd.backends.completion import model_file, require_listed
from inferd.backends.process import ProcessRecipe
from inferd.backends.python.describe import describe
from inferd.backends.python.env import ENV_PARAMETER, interpreter_for
from inferd.backends.python.host import python_executor
from inferd.backends.python.modelfile import import_model, model_class
from inferd.backends.python.native import NativeRuntime
from inferd.backends.work import Executor
from inferd.config.model_config_pb2 import ModelConfig
from inferd.config.text import config_to_dict, parse_config_json
from inferd.core.errors import ConfigError
from inferd.security.trust import Capability, require

FILENAME = "model.py"


class PythonBackend(Backend):
    name = "python"
    platforms: tuple[str, ...] = ()
    default_filename = FILENAME
    processes_only = True

    def gpu_available(self) -> bool:
        return False

    def _path(self, version_dir: Path, config: ModelConfig) -> Path:
        """The model's code, once the server has granted Python models (``inferd.security.trust``):
        every step that runs it (completing the config, building instances) comes here first."""
        path = model_file(version_dir, config, [FILENAME])
        if not path.is_file():
            raise ConfigError(f"python model '{config.name}': {path} does not exist")
        require(Capability.PYTHON_MODELS, f"{path.name} is a Python model")
        return path

    def _interpreter(self, version_dir: Path, config: ModelConfig) -> str:
        value = (
            config.parameters[ENV_PARAMETER].string_value
            if ENV_PARAMETER in config.parameters
            else ""
        )
        return interpreter_for(value, version_dir.parent)

    def complete_config(
        self, version_dir: Path, config: ModelConfig, default_max_batch_size: int
    ) -> None:
        """Ask the model's code (in a process of its own) when the config needs it: Triton's
        ``auto_complete_config``, or a native model's type hints."""
        path = self._path(version_dir, config)
        source = path.read_text(errors="replace")
        if "auto_complete_config" in source or not (config.input and config.output):
            completed = describe(
                self._interpreter(version_dir, config),
                path,
                config_to_dict(config),
                default_max_batch_size,
            )
            config.CopyFrom(parse_config_json(completed, f"the config {path.name} completed"))
        require_listed(config, f"python model '{config.name}'")
        if not config.backend:
            config.backend = self.name

    def process_recipe(
        self, version_dir: Path, config: ModelConfig, placement: InstancePlacement
    ) -> ProcessRecipe:
        """How a worker process builds one instance (with the model's own interpreter)."""
        return ProcessRecipe(
            f"{python_executor.__module__}:{python_executor.__name__}",
            self._arguments(version_dir, config, placement),
            self._interpreter(version_dir, config),
        )

    def _arguments(
        self, version_dir: Path, config: ModelConfig, placement: InstancePlacement
    ) -> tuple[str, str, str, int, int, str, str]:
        return (
            str(self._path(version_dir, config)),
            json.dumps(config_to_dict(config)),
            placement.kind,
            placement.device_id,
            placement.index,
            str(version_dir.parent),
            version_dir.name,
        )

    def load_executor(
        self, version_dir: Path, config: ModelConfig, placement: InstancePlacement
    ) -> Executor:
        """The model's executor in this process (what a worker process runs)."""
        return python_executor(*self._arguments(version_dir, config, placement))

    def load(
        self, version_dir: Path, config: ModelConfig, placement: InstancePlacement
    ) -> NativeRuntime:
        """A native model's batch runtime in this process."""
        path = self._path(version_dir, config)
        form, cls = model_class(import_model(path), path)
        if form != "native":
            raise ConfigError(
                f"{path}: a {cls.__name__} answers request by request, not in batches"
            )
        label = f"{config.name}/{version_dir.name}"
        return NativeRuntime(cls, path, config_to_dict(config), label)
