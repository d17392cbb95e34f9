"""What a server tells its operator: the engine and access logs its settings ask for, and, once
startup loading settled, whether it is ready, in the words ``/v2/health/ready`` answers."""

from __future__ import annotations

import logging

from inferd.app.settings import Settings
from inferd.observability.logging import Logs
from inferd.plane.model import ModelState
from inferd.plane.registry import Registry

log = logging.getLogger("inferd.server")


def log_readiness(registry: Registry, ready: bool, announce: bool = True) -> None:
    """ "server ready" only when the server is (``/v2/health/ready`` answers 200), and the
    models that failed either way; at debug level where another process says it (``announce``
    false: a worker other than the first of several)."""
    records = registry.records()
    loaded = sorted(r.name for r in records if r.versions)
    failed = sorted(
        f"{r.name} ({r.reason or r.state.value})"
        for r in records
        if not r.versions and r.state is ModelState.UNAVAILABLE
    )
    if ready:
        log.log(
            logging.INFO if announce else logging.DEBUG,
            "server ready; models ready: %s%s",
            ", ".join(loaded) or "none",
            f"; models that failed to load: {', '.join(failed)}" if failed else "",
        )
    else:
        log.log(
            logging.WARNING if announce else logging.DEBUG,
            "server not ready (/v2/health/ready answers 503): models that failed to load: "
            "%s; models ready: %s",
            ", ".join(failed) or "none",
            ", ".join(loaded) or "none",
        )


def logs_from(settings: Settings) -> Logs:
    return Logs(
        verbose=settings.log_verbose,
        log_format=settings.log_format,
        log_file=settings.log_file,
        access_log=settings.access_log,
        access_log_file=settings.access_log_file,
        max_bytes=settings.log_max_bytes,
        backup_count=settings.log_backup_count,
    )
