"""Engine and access logs: text or JSON lines, to stderr and/or size-rotated files.

The last lines of each log are also kept in memory so ``GET /v2/logs`` can show them.
The access log writes one line per request and costs nothing when it is off.
"""

from __future__ import annotations

import collections
import heapq
import logging
import logging.handlers
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any

import orjson

from inferd.core.errors import ConfigError

ENGINE = "inferd"
ACCESS = "inferd.access"
TAIL_LINES = 1000

# The fields of an access-log line, in order.
ACCESS_FIELDS = (
    "time",
    "node",
    "protocol",
    "method",
    "path",
    "model",
    "version",
    "status",
    "latency_ms",
    "bytes_in",
    "bytes_out",
    "client",
    "request_id",
)


def log_clock_us() -> int:
    """The clock that orders log lines: microseconds of CLOCK_MONOTONIC, one clock for every
    process of the machine, so the lines of several serving processes interleave in order."""
    return time.monotonic_ns() // 1000


Entry = tuple[int, str]  # a kept line's position (``log_clock_us`` when kept) and its text


class TailHandler(logging.Handler):
    """Keeps the last formatted lines of a log in memory, each with its position: the time it
    was kept, made unique and increasing in this process. A line kept after a reader took
    ``log_clock_us()`` has a greater position than that reading, whichever process keeps it,
    so "the lines up to position P" stays the same answer once P has passed (``cursor``)."""

    def __init__(self, capacity: int = TAIL_LINES) -> None:
        super().__init__()
        self.lines: collections.deque[Entry] = collections.deque(maxlen=capacity)
        self._last = 0  # the newest line's position
        self._lines_lock = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        line = self.format(record)
        with self._lines_lock:
            self._last = max(self._last + 1, log_clock_us())
            self.lines.append((self._last, line))

    def tail(self, count: int) -> list[str]:
        return [line for _, line in self.entries(0, None, count)]

    def entries(self, after: int, upto: int | None, count: int) -> list[Entry]:
        """At most the last ``count`` lines whose position is above ``after`` and at most
        ``upto`` (None: any), oldest first."""
        if count <= 0:
            return []
        found: list[Entry] = []
        with self._lines_lock:
            for entry in reversed(self.lines):
                if entry[0] <= after or len(found) == count:
                    break
                if upto is None or entry[0] <= upto:
                    found.append(entry)
        found.reverse()
        return found

    def since(self, after: int, count: int) -> tuple[list[str], int]:
        """At most the last ``count`` lines kept after position ``after``, and the position to
        pass back as ``after`` to get only what follows."""
        upto = cursor()
        return [line for _, line in self.entries(after, upto, count)], upto


def cursor() -> int:
    """A position every line kept from now on, in any process, will be above: lines up to it
    are all kept already (their answer is final), and lines above it are the next answer's."""
    return log_clock_us() - 1


def merge_entries(parts: Iterable[Sequence[Entry]], count: int) -> list[str]:
    """The last ``count`` lines of several processes' ``entries``, in order of position (the
    same position in two processes: the first part's line first)."""
    merged = heapq.merge(*parts, key=lambda entry: entry[0])
    return [line for _, line in collections.deque(merged, maxlen=count)] if count > 0 else []


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            return orjson.dumps(fields).decode()
        entry: dict[str, Any] = {
            "time": _iso(record.created),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(entry).decode()


class TextFormatter(logging.Formatter):
    def __init__(self, iso8601: bool = False) -> None:
        """``iso8601``: times as ``2024-05-01T12:00:00Z`` (UTC), Triton's ISO8601 log format."""
        super().__init__(
            "%(asctime)s %(levelname)s %(name)s: %(message)s",
            "%Y-%m-%dT%H:%M:%SZ" if iso8601 else None,
        )
        if iso8601:
            self.converter = time.gmtime

    def format(self, record: logging.LogRecord) -> str:
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            return " ".join(f"{k}={_text(fields[k])}" for k in ACCESS_FIELDS)
        return super().format(record)


# --log-format values, and Triton's names (log settings API): "default" is text.
FORMATS = ("text", "json", "default", "ISO8601")


def formatter_for(log_format: str) -> logging.Formatter:
    if log_format not in FORMATS:
        raise ConfigError(f"log format must be one of {', '.join(FORMATS)}, got '{log_format}'")
    if log_format == "json":
        return JsonFormatter()
    return TextFormatter(iso8601=log_format == "ISO8601")


class LevelFilter(logging.Filter):
    """Triton's per-severity switches: drops INFO, WARNING or ERROR (and above) records when off
    (DEBUG is the logger's level: ``--verbose``)."""

    def __init__(self) -> None:
        super().__init__()
        self.info = self.warning = self.error = True

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR:
            return self.error
        if record.levelno >= logging.WARNING:
            return self.warning
        if record.levelno >= logging.INFO:
            return self.info
        return True


def _text(value: Any) -> str:
    text = str(value) if value not in (None, "") else "-"
    return f'"{text}"' if " " in text else text


def _iso(created: float) -> str:
    millis = int((created % 1) * 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created)) + f".{millis:03d}Z"


class Logs:
    """The configured engine and access logs."""

    def __init__(
        self,
        *,
        verbose: int = 0,
        log_format: str = "text",
        log_file: str = "",
        access_log: bool = False,
        access_log_file: str = "",
        max_bytes: int = 50 * 1024 * 1024,
        backup_count: int = 5,
    ) -> None:
        if log_format not in ("text", "json"):
            raise ConfigError(f"--log-format must be text or json, got '{log_format}'")
        formatter = formatter_for(log_format)
        self.log_format = log_format
        self.log_file = log_file
        self.verbose = verbose
        self.levels = LevelFilter()
        self._max_bytes, self._backup_count = max_bytes, backup_count
        self._file_handler: logging.Handler | None = None
        self.engine_tail = TailHandler()
        self.access_tail = TailHandler()
        engine = logging.getLogger(ENGINE)
        engine.handlers.clear()
        engine.setLevel(logging.DEBUG if verbose > 0 else logging.INFO)
        engine.propagate = False
        handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr), self.engine_tail]
        if log_file:
            self._file_handler = _rotating(log_file, max_bytes, backup_count)
            handlers.append(self._file_handler)
        for handler in handlers:
            handler.setFormatter(formatter)
            handler.addFilter(self.levels)
            engine.addHandler(handler)
        self._engine = engine
        access = logging.getLogger(ACCESS)
        access.handlers.clear()
        access.propagate = False
        access.setLevel(logging.INFO)
        self.access_enabled = access_log or bool(access_log_file)
        access_handlers: list[logging.Handler] = [self.access_tail]
        if self.access_enabled:
            access_handlers.append(
                _rotating(access_log_file, max_bytes, backup_count)
                if access_log_file
                else logging.StreamHandler(sys.stderr)
            )
        for handler in access_handlers:
            handler.setFormatter(formatter)
            access.addHandler(handler)
        self._access = access

    def set_verbose(self, level: int) -> None:
        """Debug lines from now on when ``level`` > 0."""
        self.verbose = level
        self._engine.setLevel(logging.DEBUG if level > 0 else logging.INFO)

    def set_format(self, log_format: str) -> None:
        """Format every line from now on so (engine and access logs)."""
        formatter = formatter_for(log_format)
        for handler in (*self._engine.handlers, *self._access.handlers):
            handler.setFormatter(formatter)
        self.log_format = log_format

    def set_file(self, path: str) -> None:
        """Write the engine log to ``path`` from now on as well as stderr ("": stderr only)."""
        handler = _rotating(path, self._max_bytes, self._backup_count) if path else None
        if handler is not None:
            handler.setFormatter(formatter_for(self.log_format))
            handler.addFilter(self.levels)
            self._engine.addHandler(handler)
        if self._file_handler is not None:
            self._engine.removeHandler(self._file_handler)
            self._file_handler.close()
        self._file_handler = handler
        self.log_file = path

    def access(self, fields: dict[str, Any]) -> None:
        """One access-log line; ``fields`` holds ACCESS_FIELDS (time is filled in here)."""
        fields["time"] = _iso(time.time())
        self._access.info("", extra={"fields": fields})

    def tail(self, kind: str, count: int) -> list[str]:
        return self.kept(kind).tail(count)

    def since(self, kind: str, after: int, count: int) -> tuple[list[str], int]:
        return self.kept(kind).since(after, count)

    def entries(self, kind: str, after: int, upto: int | None, count: int) -> list[Entry]:
        return self.kept(kind).entries(after, upto, count)

    def kept(self, kind: str) -> TailHandler:
        """The lines kept of the ``engine`` or the ``access`` log."""
        return self.engine_tail if kind == "engine" else self.access_tail


def _rotating(path: str, max_bytes: int, backup_count: int) -> logging.Handler:
    return logging.handlers.RotatingFileHandler(
        path, maxBytes=max_bytes, backupCount=backup_count, encoding="utf-8"
    )
