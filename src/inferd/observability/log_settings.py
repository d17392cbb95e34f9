"""Triton's log settings (``/v2/logging``, gRPC LogSettings) over inferd's engine log: each
change applies to the next line logged.

Keys and types are Triton's: ``log_file`` (str), ``log_info`` / ``log_warning`` / ``log_error``
(bool), ``log_verbose_level`` (int, > 0 logs debug lines), ``log_format`` (inferd's ``text`` or
``json``, or Triton's ``default`` (text) or ``ISO8601`` (text, UTC ISO 8601 times)).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from inferd.core.errors import InvalidInput
from inferd.observability.logging import FORMATS, Logs

TYPES: dict[str, type] = {
    "log_file": str,
    "log_info": bool,
    "log_warning": bool,
    "log_error": bool,
    "log_verbose_level": int,
    "log_format": str,
}


class LogSettings:
    def __init__(self, logs: Logs) -> None:
        self.logs = logs
        # With --http-workers: makes a change on every other worker too.
        self.share: Callable[[dict[str, Any]], Awaitable[None]] | None = None

    def get(self) -> dict[str, Any]:
        logs = self.logs
        return {
            "log_file": logs.log_file,
            "log_info": logs.levels.info,
            "log_warning": logs.levels.warning,
            "log_error": logs.levels.error,
            "log_verbose_level": logs.verbose,
            "log_format": logs.log_format,
        }

    async def update_everywhere(self, changes: Mapping[str, Any]) -> dict[str, Any]:
        """``update`` here, then on this server's other workers."""
        settings = self.update(changes)
        if self.share is not None:
            change = {"changes": dict(changes)}
            await self.share({"op": "log_settings", "name": "log settings", **change})
        return settings

    def update(self, changes: Mapping[str, Any]) -> dict[str, Any]:
        """Check every change, then apply them all; answers the settings now in effect."""
        for key, value in changes.items():
            _check(key, value)
        logs = self.logs
        path = changes.get("log_file", logs.log_file)
        if path != logs.log_file:  # first: the one change that can still fail
            try:
                logs.set_file(path)
            except OSError as exc:
                raise InvalidInput(f"log setting 'log_file': cannot open '{path}': {exc}") from None
        for key, value in changes.items():
            if key == "log_format":
                logs.set_format(value)
            elif key == "log_verbose_level":
                logs.set_verbose(value)
            elif key in ("log_info", "log_warning", "log_error"):
                setattr(logs.levels, key.removeprefix("log_"), value)
        return self.get()


def _check(key: str, value: Any) -> None:
    wanted = TYPES.get(key)
    if wanted is None:
        raise InvalidInput(f"unknown log setting '{key}' (known: {', '.join(TYPES)})")
    if type(value) is not wanted:  # bool is not an int here, nor an int a bool
        raise InvalidInput(
            f"log setting '{key}' must be of type {wanted.__name__}, got {type(value).__name__}"
        )
    if key == "log_verbose_level" and isinstance(value, int) and value < 0:
        raise InvalidInput(f"log setting 'log_verbose_level' must be 0 or more, got {value}")
    if key == "log_format" and value not in FORMATS:
        raise InvalidInput(f"log setting 'log_format' must be one of {', '.join(FORMATS)}")
