"""Batching options and queue policies read from ``dynamic_batching``, and request parameters.

Priorities follow Triton: level 1 is the highest; 0 in a request means the default level.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from inferd.config.model_config_pb2 import ModelConfig, ModelQueuePolicy
from inferd.core.errors import ConfigError, InvalidInput


@dataclass(frozen=True, slots=True)
class QueuePolicy:
    max_queue_size: int  # 0: unbounded
    default_timeout_ns: int  # 0: none
    allow_timeout_override: bool
    delay_on_timeout: bool  # timeout_action DELAY (else REJECT)

    @classmethod
    def from_proto(cls, policy: ModelQueuePolicy) -> QueuePolicy:
        return cls(
            max_queue_size=policy.max_queue_size,
            default_timeout_ns=policy.default_timeout_microseconds * 1000,
            allow_timeout_override=policy.allow_timeout_override,
            delay_on_timeout=policy.timeout_action == ModelQueuePolicy.DELAY,
        )

    def timeout_ns(self, requested_us: int | None) -> int:
        """The request's queue timeout: the default, or a shorter one the request asks for."""
        if requested_us is None or not self.allow_timeout_override:
            return self.default_timeout_ns
        requested_ns = requested_us * 1000
        if self.default_timeout_ns and (
            requested_ns == 0 or requested_ns > self.default_timeout_ns
        ):
            return self.default_timeout_ns  # a request may shorten the timeout, never extend it
        return requested_ns


@dataclass(frozen=True, slots=True)
class BatchingOptions:
    max_batch_size: int
    preferred: tuple[int, ...]
    max_queue_delay_ns: int
    preserve_ordering: bool
    priority_levels: int  # 0: one level
    default_level: int  # 1-based
    policies: tuple[QueuePolicy, ...]  # one per level

    @property
    def target_rows(self) -> int:
        """Rows at which a batch goes out without waiting."""
        return self.preferred[-1] if self.preferred else self.max_batch_size

    @property
    def first_ship_rows(self) -> int:
        """The fewest rows that can make a batch go out before its queue delay ends."""
        return self.preferred[0] if self.preferred else self.max_batch_size

    @classmethod
    def from_config(cls, config: ModelConfig) -> BatchingOptions:
        batching = config.dynamic_batching
        if config.max_batch_size <= 0:
            raise ConfigError("dynamic_batching needs max_batch_size > 0")
        preferred = tuple(sorted(set(batching.preferred_batch_size)))
        for size in preferred:
            if not 1 <= size <= config.max_batch_size:
                raise ConfigError(
                    f"preferred_batch_size {size} is outside 1..{config.max_batch_size} "
                    "(max_batch_size)"
                )
        levels = int(batching.priority_levels)
        default_level = int(batching.default_priority_level)
        if levels and not 1 <= default_level <= levels:
            raise ConfigError(
                f"default_priority_level {default_level} is outside 1..{levels} (priority_levels)"
            )
        if not levels and default_level:
            raise ConfigError("default_priority_level is set but priority_levels is 0")
        for level in batching.priority_queue_policy:
            if not 1 <= level <= max(levels, 1):
                raise ConfigError(f"priority_queue_policy for level {level} outside 1..{levels}")
        default = QueuePolicy.from_proto(batching.default_queue_policy)
        policies = tuple(
            QueuePolicy.from_proto(batching.priority_queue_policy[level])
            if level in batching.priority_queue_policy
            else default
            for level in range(1, max(levels, 1) + 1)
        )
        return cls(
            max_batch_size=config.max_batch_size,
            preferred=preferred,
            max_queue_delay_ns=batching.max_queue_delay_microseconds * 1000,
            preserve_ordering=batching.preserve_ordering,
            priority_levels=levels,
            default_level=default_level or 1,
            policies=policies,
        )

    def level_of(self, parameters: dict[str, Any], model: str) -> int:
        value = _int_parameter(parameters, "priority")
        if not value:
            return self.default_level
        if not self.priority_levels:
            raise InvalidInput(f"priority {value} given but model '{model}' has no priority levels")
        if not 1 <= value <= self.priority_levels:
            raise InvalidInput(
                f"priority {value} is out of range 1..{self.priority_levels} for model '{model}'"
            )
        return value


def _int_parameter(parameters: dict[str, Any], key: str) -> int | None:
    value = parameters.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidInput(f"parameter '{key}' must be a non-negative integer, got {value!r}")
    return value


def check_request_parameters(parameters: dict[str, Any]) -> None:
    """Validate ``priority`` and ``timeout`` even where no batcher reads them."""
    if "priority" in parameters:  # mostly neither is there (nor any parameter at all)
        _int_parameter(parameters, "priority")
    if "timeout" in parameters:
        _int_parameter(parameters, "timeout")


def timeout_parameter_us(parameters: dict[str, Any]) -> int | None:
    """The request's ``timeout`` parameter in microseconds, if any."""
    return _int_parameter(parameters, "timeout")
