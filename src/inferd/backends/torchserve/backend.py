"""The TorchServe backend as the server sees it: a version folder holding a model archive.

``<repo>/<model>/<version>/<name>.mar`` (or an unpacked ``no-archive`` folder) is a model like
any other: the archive's manifest and ``model-config.yaml`` complete its config, and each
instance is a worker process that runs the archive's handler (``executor``). Handlers are code
that came with the model: they run only when the operator allows Python models
(``--allow-python-models``, ``inferd.security.trust``), as ``model.py`` models do.

Every model has one input and two outputs, all BYTES, with a batch dimension:

- ``body`` ``[-1]``: a request's values, one per TorchServe parameter (the raw body, or each
  multipart field); the request parameters ``torchserve_names``, ``torchserve_types`` and
  ``torchserve_headers`` carry their names, content types and the request's headers.
- ``prediction`` ``[1]``: the handler's answer as TorchServe encodes it (bytes as they are,
  text as UTF-8, anything else as indented JSON).
- ``meta`` ``[1]``: what the handler set through ``context`` (status, content type, headers)
  as JSON, empty when it set nothing.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from inferd.backends.base import Backend, InstancePlacement
from inferd.backends.process import ProcessRecipe
from inferd.backends.python.env import ENV_PARAMETER, interpreter_for
from inferd.backends.torchserve import archive
from inferd.backends.torchserve.settings import (
    PARAMETER_PREFIX,
    VersionSettings,
    read_registration,
    resolve,
)
from inferd.backends.work import Executor, Runtime
from inferd.config.model_config_pb2 import DataType as ConfigDataType
from inferd.config.model_config_pb2 import ModelConfig, ModelInput, ModelInstanceGroup, ModelOutput
from inferd.core.errors import ConfigError
from inferd.security.trust import Capability, require

INPUT = "body"
PREDICTION = "prediction"
META = "meta"


def _streams(found: Path, handler: str) -> bool:
    """Whether the handler's file sends intermediate answers (a streaming handler): read as
    text, never run here."""
    module = handler.partition(":")[0].split("/")[-1]
    source = archive.read_member(found, module if module.endswith(".py") else f"{module}.py")
    return source is not None and b"send_intermediate_predict_response" in source


class TorchServeBackend(Backend):
    name = "torchserve"
    platforms: tuple[str, ...] = ()
    default_filename = "model.mar"
    processes_only = True

    def __init__(self, cache_dir: Path | None = None) -> None:
        self.cache_dir = cache_dir  # where zip archives are unpacked (None: the temp dir)

    def gpu_available(self) -> bool:
        return False

    def _archive(self, version_dir: Path, config: ModelConfig) -> Path:
        """The version's archive, once the server granted model code (``inferd.security.trust``)."""
        found = archive.find_archive(version_dir)
        require(Capability.PYTHON_MODELS, f"{found.name} holds a TorchServe handler")
        return found

    def settings(self, version_dir: Path, config: ModelConfig) -> VersionSettings:
        found = self._archive(version_dir, config)
        manifest = archive.read_manifest(found)
        where = f"model '{config.name}' version {version_dir.name}"
        settings = resolve(
            manifest,
            archive.read_model_yaml(found, manifest),
            read_registration(version_dir),
            where,
        )
        if not settings.url:
            settings = replace(settings, url=found.name)
        return replace(settings, streaming=_streams(found, settings.handler))

    def complete_config(
        self, version_dir: Path, config: ModelConfig, default_max_batch_size: int
    ) -> None:
        """Inputs, outputs, batching and instances from the archive and its registration;
        what the config sets itself stays."""
        settings = self.settings(version_dir, config)
        if not config.input:
            config.input.append(ModelInput(name=INPUT, data_type=ConfigDataType.TYPE_STRING))
            config.input[0].dims.append(-1)
        if not config.output:
            for name in (PREDICTION, META):
                output = ModelOutput(name=name, data_type=ConfigDataType.TYPE_STRING)
                output.dims.append(1)
                config.output.append(output)
        self._check_tensors(config)
        if config.max_batch_size == 0:
            config.max_batch_size = settings.batch_size
        if settings.batch_size > 1 and not config.HasField("dynamic_batching"):
            config.dynamic_batching.max_queue_delay_microseconds = settings.max_batch_delay * 1000
        if not config.instance_group:
            config.instance_group.append(
                ModelInstanceGroup(count=settings.min_workers, kind=ModelInstanceGroup.KIND_CPU)
            )
        for key, value in settings.parameters().items():
            config.parameters[key].string_value = value
        if not config.backend:
            config.backend = self.name

    def _check_tensors(self, config: ModelConfig) -> None:
        inputs = [i.name for i in config.input]
        outputs = sorted(o.name for o in config.output)
        if inputs != [INPUT] or outputs != sorted((PREDICTION, META)):
            raise ConfigError(
                f"model '{config.name}': a TorchServe model has the input '{INPUT}' and the "
                f"outputs '{PREDICTION}' and '{META}' (leave them out of config.pbtxt)"
            )
        types = [t.data_type for t in config.input] + [t.data_type for t in config.output]
        if any(t != ConfigDataType.TYPE_STRING for t in types):
            raise ConfigError(f"model '{config.name}': its tensors must be TYPE_STRING")

    def process_recipe(
        self, version_dir: Path, config: ModelConfig, placement: InstancePlacement
    ) -> ProcessRecipe:
        """How a worker process builds one instance: the unpacked archive and the handler."""
        from inferd.backends.torchserve.executor import torchserve_executor

        found = self._archive(version_dir, config)
        manifest = archive.read_manifest(found)
        settings = VersionSettings.from_parameters(
            {
                k: v.string_value
                for k, v in config.parameters.items()
                if k.startswith(PARAMETER_PREFIX)
            }
        )
        model_yaml = archive.read_model_yaml(found, manifest)
        env = (
            config.parameters[ENV_PARAMETER].string_value
            if ENV_PARAMETER in config.parameters
            else ""
        )
        return ProcessRecipe(
            f"{torchserve_executor.__module__}:{torchserve_executor.__name__}",
            (
                str(archive.unpacked(found, self.cache_dir)),
                json.dumps(manifest.raw),
                settings.handler,
                config.name,
                settings.model_version,
                version_dir.name,
                max(config.max_batch_size, 1),
                json.dumps(model_yaml, default=str),
                placement.index,
                float(settings.response_timeout),
            ),
            interpreter_for(env, version_dir.parent),
        )

    def load(self, version_dir: Path, config: ModelConfig, placement: InstancePlacement) -> Runtime:
        raise ConfigError(
            f"model '{config.name}': a TorchServe handler answers request by request, "
            "not in batches"
        )

    def load_executor(
        self, version_dir: Path, config: ModelConfig, placement: InstancePlacement
    ) -> Executor:
        """The handler's executor in this process (what a worker process runs)."""
        recipe = self.process_recipe(version_dir, config, placement)
        return recipe.build()
