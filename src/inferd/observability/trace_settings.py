"""Triton's trace settings (level, rate, count), global and per model, deciding at once which
finished requests become trace spans.

Values are Triton's: strings (``trace_rate: "1000"``) and a list for ``trace_level``. A model's
settings override the global ones key by key; ``None`` for a key clears the override (for a
model) or restores the startup value (globally). inferd exports spans with OpenTelemetry
(``--trace-exporter``), so ``trace_mode`` is ``opentelemetry`` and Triton's file settings
(``trace_file``, ``log_frequency``) keep their empty values.
"""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

from inferd.core.errors import InvalidInput

LEVELS = ("OFF", "TIMESTAMPS")
MODE = "opentelemetry"
# Keys a client may read and write, and the fixed ones it may only read (or write unchanged).
KEYS = ("trace_level", "trace_rate", "trace_count")
FIXED: dict[str, Any] = {"log_frequency": "0", "trace_file": "", "trace_mode": MODE}

Settings = dict[str, Any]


def _startup(exporter: bool) -> Settings:
    """Traced from the start when an exporter is set (every request), else off."""
    return {
        "trace_level": ["TIMESTAMPS" if exporter else "OFF"],
        "trace_rate": "1",
        "trace_count": "-1",
    }


class Counts(Protocol):
    """Limited trace counts kept for a whole server of several workers (``workers.counts``),
    by scope ("": the global settings; else a model's)."""

    def set(self, scope: str, count: int) -> None: ...

    def take(self, scope: str) -> bool: ...

    def left(self, scope: str) -> int: ...


class _Sampler:
    """Which requests of one scope (global, or one model) are traced: 1 in ``rate`` while
    ``count`` traces are left (-1: no limit; a limited count is ``counts``'s when set)."""

    def __init__(self, settings: Settings, scope: str, counts: Counts | None = None) -> None:
        self.on = settings["trace_level"] != ["OFF"]
        self.rate = int(settings["trace_rate"])
        self.count = int(settings["trace_count"])
        self.seen = 0
        self.scope = scope
        self.counts = counts if self.count > 0 else None

    def take(self) -> bool:
        if not self.on or self.count == 0:
            return False
        self.seen += 1
        if self.seen % self.rate:
            return False
        if self.counts is not None:
            return self.counts.take(self.scope)
        if self.count > 0:
            self.count -= 1
        return True

    def left(self) -> int:
        return self.counts.left(self.scope) if self.counts is not None else self.count


class TraceSettings:
    """The global trace settings and each model's overrides; ``sample`` decides per request."""

    def __init__(self, exporter: bool, known_model: Callable[[str], object] | None = None) -> None:
        """``exporter``: whether spans go anywhere (else tracing cannot be turned on);
        ``known_model(name)`` raises NotFound for a model the server does not have."""
        self.exporter = exporter
        self.known_model = known_model
        self._startup = _startup(exporter)
        self._global: Settings = dict(self._startup)
        self._models: dict[str, Settings] = {}
        self._samplers: dict[str, _Sampler] = {"": _Sampler(self._global, "")}
        self._lock = threading.Lock()
        # With --http-workers: makes a change on every other worker too, and keeps limited
        # counts for the server (set by the worker that received the change).
        self.share: Callable[[dict[str, Any]], Awaitable[None]] | None = None
        self.counts: Counts | None = None

    async def update_everywhere(self, changes: Mapping[str, Any], model: str = "") -> Settings:
        """``update`` here, then on this server's other workers."""
        settings = self.update(changes, model)
        if self.share is not None:
            change = {"changes": dict(changes), "model": model}
            await self.share({"op": "trace_settings", "name": "trace settings", **change})
        return settings

    def get(self, model: str = "") -> Settings:
        """The settings in effect for ``model`` ("": the global ones), with the current count."""
        if model and self.known_model is not None:
            self.known_model(model)
        with self._lock:
            effective = {**self._global, **self._models.get(model, {})}
            sampler = self._samplers.get(model if model in self._models else "")
            if sampler is not None:
                effective["trace_count"] = str(sampler.left())
        effective["trace_level"] = list(effective["trace_level"])
        return {**effective, **FIXED}

    def update(
        self, changes: Mapping[str, Any], model: str = "", received: bool = True
    ) -> Settings:
        """Apply ``changes`` (Triton's keys; None clears) and return the settings in effect;
        ``received``: from a client, not from another worker (which set the counts)."""
        if model and self.known_model is not None:
            self.known_model(model)
        checked = {key: self._check(key, value) for key, value in changes.items()}
        with self._lock:
            target = dict(self._models.get(model, {}) if model else self._global)
            for key, value in checked.items():
                if key in FIXED:
                    continue
                if value is not None:
                    target[key] = value
                elif model:
                    target.pop(key, None)
                else:
                    target[key] = self._startup[key]
            effective = {**self._global, **target} if model else target
            if effective["trace_level"] != ["OFF"] and not self.exporter:
                raise InvalidInput(
                    "tracing needs a trace exporter: start inferd with --trace-exporter "
                    "console|otlp"
                )
            if not model:
                self._global = target
                self._new_sampler("", target, received)
                for name, overrides in self._models.items():  # they inherit the rest
                    self._new_sampler(name, {**target, **overrides}, received)
            elif target:
                self._models[model] = target
                self._new_sampler(model, effective, received)
            else:
                self._models.pop(model, None)
                self._samplers.pop(model, None)
        return self.get(model)

    def _new_sampler(self, scope: str, settings: Settings, received: bool) -> None:
        sampler = self._samplers[scope] = _Sampler(settings, scope, self.counts)
        if sampler.counts is not None and received:
            sampler.counts.set(scope, sampler.count)

    def sample(self, model: str) -> bool:
        """Whether this finished request of ``model`` ("" for none) is traced."""
        with self._lock:
            sampler = self._samplers.get(model) or self._samplers[""]
            return sampler.take()

    def _check(self, key: str, value: Any) -> Any:
        if key in FIXED:
            if value is not None and _text(key, value) != FIXED[key]:
                raise InvalidInput(
                    f"trace setting '{key}' cannot be changed: inferd exports traces with "
                    f"OpenTelemetry (--trace-exporter), so it stays '{FIXED[key]}'"
                )
            return None
        if key not in KEYS:
            known = ", ".join((*KEYS, *FIXED))
            raise InvalidInput(f"unknown trace setting '{key}' (known: {known})")
        if value is None:
            return None
        if key == "trace_level":
            levels = [value] if isinstance(value, str) else value
            if not isinstance(levels, list) or not levels:
                raise InvalidInput("trace setting 'trace_level' must be a non-empty list")
            for level in levels:
                if level not in LEVELS:
                    raise InvalidInput(
                        f"trace setting 'trace_level': '{level}' is not supported "
                        f"(inferd traces {' or '.join(LEVELS)})"
                    )
            return ["OFF"] if set(levels) == {"OFF"} else ["TIMESTAMPS"]
        text = _text(key, value)
        try:
            number = int(text)
        except ValueError:
            raise InvalidInput(f"trace setting '{key}' must be an integer, got '{text}'") from None
        if key == "trace_rate" and number < 1:
            raise InvalidInput(f"trace setting 'trace_rate' must be at least 1, got {number}")
        if key == "trace_count" and number < -1:
            raise InvalidInput(f"trace setting 'trace_count' must be -1 or more, got {number}")
        return str(number)


def _text(key: str, value: Any) -> str:
    """A scalar setting as Triton's string (a one-element list is accepted, as gRPC sends)."""
    if isinstance(value, list):
        if len(value) != 1:
            raise InvalidInput(f"trace setting '{key}' takes one value, got {len(value)}")
        value = value[0]
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise InvalidInput(f"trace setting '{key}' must be a string or an integer")
    return str(value)
