"""The model a bound function's call belongs to: set on the instance's thread around each call,
read by the decorators that need the model's configuration and by ``@triton_context``."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator, Mapping
from typing import Any

from inferd.pytriton.exceptions import PyTritonValidationError
from inferd.pytriton.model_config import TritonModelConfig

_local = threading.local()


class ModelConfigDict(Mapping[Any, TritonModelConfig]):
    """``triton_context.model_configs[infer_func]``: the running model's configuration, whatever
    callable (the bound function or one it wraps) names it."""

    def __init__(self, config: TritonModelConfig) -> None:
        self._config = config

    def __getitem__(self, infer_callable: Any) -> TritonModelConfig:
        return self._config

    def __iter__(self) -> Iterator[Any]:
        return iter(())

    def __len__(self) -> int:
        return 1


@dataclasses.dataclass
class TritonContext:
    """What ``@triton_context`` passes: the model configs."""

    model_configs: ModelConfigDict


def current() -> TritonModelConfig:
    config: TritonModelConfig | None = getattr(_local, "config", None)
    if config is None:
        raise PyTritonValidationError(
            "this decorator reads the model's configuration: call the function through a "
            "model bound with Triton.bind"
        )
    return config


def current_context() -> TritonContext:
    return TritonContext(ModelConfigDict(current()))


class running:
    """``with running(config):`` the calls made inside belong to this model."""

    def __init__(self, config: TritonModelConfig) -> None:
        self._config = config
        self._before: TritonModelConfig | None = None

    def __enter__(self) -> None:
        self._before = getattr(_local, "config", None)
        _local.config = self._config

    def __exit__(self, *exc: object) -> None:
        _local.config = self._before
