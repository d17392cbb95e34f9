"""PyTriton's model configuration (``pytriton.model_config``): ``ModelConfig``, ``Tensor``,
``DynamicBatcher``, ``QueuePolicy``, ``TimeoutAction``, ``DeviceKind``, and the bound model's
full view (``TritonModelConfig``) that decorators and ``triton_context`` read; and the inferd
model config (Triton's JSON form) a binding becomes."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Sequence
from typing import Any

import numpy as np

from inferd.app.bind import config_name
from inferd.pytriton.exceptions import PyTritonBadParameterError


class DeviceKind(enum.Enum):
    KIND_AUTO = "KIND_AUTO"
    KIND_CPU = "KIND_CPU"
    KIND_GPU = "KIND_GPU"


class TimeoutAction(enum.Enum):
    REJECT = "REJECT"
    DELAY = "DELAY"


@dataclasses.dataclass
class QueuePolicy:
    """Triton's ModelQueuePolicy."""

    timeout_action: TimeoutAction = TimeoutAction.REJECT
    default_timeout_microseconds: int = 0
    allow_timeout_override: bool = False
    max_queue_size: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "timeout_action": self.timeout_action.value,
            "default_timeout_microseconds": self.default_timeout_microseconds,
            "allow_timeout_override": self.allow_timeout_override,
            "max_queue_size": self.max_queue_size,
        }


@dataclasses.dataclass
class DynamicBatcher:
    """Triton's dynamic_batching fields."""

    max_queue_delay_microseconds: int = 0
    preferred_batch_size: list[int] | None = None
    preserve_ordering: bool = False
    priority_levels: int = 0
    default_priority_level: int = 0
    default_queue_policy: QueuePolicy | None = None
    priority_queue_policy: dict[int, QueuePolicy] | None = None

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "max_queue_delay_microseconds": self.max_queue_delay_microseconds,
            "preserve_ordering": self.preserve_ordering,
            "priority_levels": self.priority_levels,
            "default_priority_level": self.default_priority_level,
        }
        if self.preferred_batch_size:
            doc["preferred_batch_size"] = list(self.preferred_batch_size)
        if self.default_queue_policy is not None:
            doc["default_queue_policy"] = self.default_queue_policy.to_json()
        if self.priority_queue_policy:
            doc["priority_queue_policy"] = {
                str(level): policy.to_json() for level, policy in self.priority_queue_policy.items()
            }
        return doc


@dataclasses.dataclass
class ModelConfig:
    """How a bound function is served: batching, its batch size and batcher, the response
    cache, decoupled responses."""

    batching: bool = True
    max_batch_size: int = 4
    batcher: DynamicBatcher = dataclasses.field(default_factory=DynamicBatcher)
    response_cache: bool = False
    decoupled: bool = False
    model_warmup: list[Any] | None = None


@dataclasses.dataclass(frozen=True)
class Tensor:
    """An input or output: shape past the batch dimension (-1: any size), numpy dtype (object
    or bytes for BYTES), name (default ``INPUT_<n>`` / ``OUTPUT_<n>``), optional."""

    shape: tuple[int, ...]
    dtype: Any
    name: str | None = None
    optional: bool | None = False

    def __post_init__(self) -> None:
        if isinstance(self.dtype, np.dtype):
            object.__setattr__(self, "dtype", self.dtype.type)


@dataclasses.dataclass
class TensorSpec:
    """A named input or output of a bound model."""

    name: str
    shape: tuple[int, ...]
    dtype: Any
    optional: bool | None = False


@dataclasses.dataclass
class TritonModelConfig:
    """A bound model's whole configuration, as decorators and ``triton_context`` see it."""

    model_name: str
    model_version: int = 1
    max_batch_size: int = 4
    batching: bool = True
    batcher: DynamicBatcher | None = None
    instance_group: dict[DeviceKind, int | None] = dataclasses.field(default_factory=dict)
    decoupled: bool = False
    backend_parameters: dict[str, str] = dataclasses.field(default_factory=dict)
    inputs: Sequence[TensorSpec] | None = None
    outputs: Sequence[TensorSpec] | None = None
    response_cache: bool = False


def named(tensors: Sequence[Tensor], prefix: str) -> list[TensorSpec]:
    """Each tensor with its name (an unnamed one is ``<prefix>_<n>``, counted from 1)."""
    return [
        TensorSpec(t.name or f"{prefix}_{n}", tuple(t.shape), t.dtype, t.optional)
        for n, t in enumerate(tensors, start=1)
    ]


def triton_model_config(
    name: str,
    version: int,
    inputs: Sequence[Tensor],
    outputs: Sequence[Tensor],
    config: ModelConfig,
    instances: int,
) -> TritonModelConfig:
    if config.model_warmup:
        raise PyTritonBadParameterError(f"model '{name}': model_warmup is not supported here")
    if config.batching and config.max_batch_size <= 0:
        raise PyTritonBadParameterError(
            f"model '{name}': a batching model needs max_batch_size > 0"
        )
    return TritonModelConfig(
        model_name=name,
        model_version=version,
        max_batch_size=config.max_batch_size if config.batching else 0,
        batching=config.batching,
        batcher=config.batcher if config.batching else None,
        instance_group={DeviceKind.KIND_CPU: instances},
        decoupled=config.decoupled,
        inputs=named(inputs, "INPUT"),
        outputs=named(outputs, "OUTPUT"),
        response_cache=config.response_cache,
    )


def _tensor_json(spec: TensorSpec, input_: bool) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "name": spec.name,
        "data_type": config_name(spec.dtype),
        "dims": list(spec.shape),
    }
    if input_ and spec.optional:
        doc["optional"] = True
    return doc


def inferd_config(model: TritonModelConfig) -> dict[str, Any]:
    """The model's config as Triton's JSON (inferd's ``ModelConfig``) for the function backend."""
    doc: dict[str, Any] = {
        "name": model.model_name,
        "backend": "function",
        "max_batch_size": model.max_batch_size,
        "input": [_tensor_json(s, True) for s in model.inputs or ()],
        "output": [_tensor_json(s, False) for s in model.outputs or ()],
        "instance_group": [
            {"count": count or 1, "kind": kind.value}
            for kind, count in model.instance_group.items()
        ],
    }
    if model.batcher is not None:
        doc["dynamic_batching"] = model.batcher.to_json()
    if model.decoupled:
        doc["model_transaction_policy"] = {"decoupled": True}
    if model.response_cache:
        doc["response_cache"] = {"enable": True}
    return doc
