"""A model's metadata from its repository alone, for lazy serving: no load where the config
says enough.

A ``config.pbtxt`` that names its platform or backend and lists every input and output with a
datatype and dims describes the model as loading it would (completion fills in only what a
config leaves out), so metadata and config calls for a model that is not loaded are answered
from it. Anything less (a bare ``model.onnx``, a config that does not parse) returns None and
the caller loads the model to know. Blocking (reads the config): call it on a worker thread.
"""

from __future__ import annotations

import logging

from inferd.backends import get_backend
from inferd.config.model_config_pb2 import TYPE_INVALID, ModelConfig
from inferd.config.spec import build_spec
from inferd.config.text import CONFIG_FILENAME, parse_config_text
from inferd.core.errors import InferdError
from inferd.plane.demand import Described
from inferd.repository.layout import select_versions
from inferd.repository.storage import ModelFiles, Storage, version_files

log = logging.getLogger("inferd.repository")


def complete_enough(config: ModelConfig) -> bool:
    """Whether a config lists everything metadata reports (tensors, datatypes, dims)."""
    if not (config.platform or config.backend) or not config.input or not config.output:
        return False
    inputs = all(t.data_type != TYPE_INVALID and len(t.dims) > 0 for t in config.input)
    return inputs and all(t.data_type != TYPE_INVALID and len(t.dims) > 0 for t in config.output)


def describe(name: str, storage: Storage, files: ModelFiles) -> Described | None:
    """The model's config and served versions, when the config says enough; else None."""
    if CONFIG_FILENAME not in files:
        return None
    try:
        data = storage.read(f"{name}/{CONFIG_FILENAME}")
        if data is None:
            return None
        config = parse_config_text(data.decode("utf-8"), CONFIG_FILENAME)
        if (config.name and config.name != name) or not complete_enough(config):
            return None
        config.name = name
        if not config.platform:
            platforms = get_backend(config.backend).platforms
            config.platform = platforms[0] if platforms else ""
        build_spec(config)  # a config the load would refuse is not described here
        available = version_files(files)[0]
        versions = tuple(select_versions(available, config.version_policy))
    except (InferdError, UnicodeDecodeError) as exc:
        log.debug("model '%s': metadata needs a load (%s)", name, exc)
        return None
    return Described(config, versions) if versions else None
