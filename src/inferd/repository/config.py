"""Reads a model folder's ``config.pbtxt``; the message and its checks live in ``inferd.config``."""

from __future__ import annotations

from pathlib import Path

from inferd.config.model_config_pb2 import ModelConfig
from inferd.config.text import CONFIG_FILENAME, parse_config_text
from inferd.core.errors import ConfigError


def read_config(model_dir: Path) -> ModelConfig:
    """The model's config.pbtxt, or an empty config named after the folder."""
    path = model_dir / CONFIG_FILENAME
    if path.is_file():
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"cannot read {path.name}: {exc}") from None
        config = parse_config_text(text, str(path.name))
    else:
        config = ModelConfig()
    if not config.name:
        config.name = model_dir.name
    elif config.name != model_dir.name:
        raise ConfigError(
            f"config name '{config.name}' does not match the model folder '{model_dir.name}'"
        )
    return config
