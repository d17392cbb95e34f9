"""How many serving processes ``--http-workers auto`` runs: the rule, and what it reads.

auto is the number of usable CPU cores (the affinity mask, capped by a cgroup CPU quota) when
every model store is a local folder, every model that loads at start is at most
``SMALL_MODEL_BYTES`` on disk, and ``cores x (WORKER_BYTES + 2 x their total size)`` fits in
half the available memory (MemAvailable, capped by a cgroup memory limit); otherwise 1. Lazy
serving (a memory budget) runs one process: the budget is the server's, not each process's.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from inferd.app.settings import Settings
from inferd.core.errors import ConfigError

SMALL_MODEL_BYTES = 256 << 20
WORKER_BYTES = 256 << 20  # one worker's own memory: interpreter, frameworks, buffers


def usable_cores() -> int:
    cores = len(os.sched_getaffinity(0))
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
    except (OSError, ValueError):
        return max(1, cores)
    if quota != "max":
        cores = min(cores, math.ceil(int(quota) / int(period)))
    return max(1, cores)


def available_memory_bytes() -> int | None:
    """MemAvailable, capped by the cgroup's memory limit; None when unknown."""
    available: int | None = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                available = int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if available is not None and limit != "max":
            used = int(Path("/sys/fs/cgroup/memory.current").read_text().strip())
            available = min(available, int(limit) - used)
    except (OSError, ValueError):
        pass
    return available


def folder_bytes(folder: Path) -> int:
    total = 0
    for root, _, files in os.walk(folder):
        for name in files:
            try:
                total += (Path(root) / name).stat().st_size
            except OSError:
                continue
    return total


def startup_models(settings: Settings) -> list[Path] | None:
    """The folders of the models that load at start; None when a store is not local."""
    roots = [Path(uri) for uri in settings.model_repository]
    if any("://" in uri for uri in settings.model_repository):
        return None
    names = settings.models_to_load()
    if names is None and settings.model_control_mode.strip().lower() == "explicit":
        names = []  # explicit mode without --load-model loads nothing at start
    found: list[Path] = []
    for root in roots:
        if not root.is_dir():
            return None
        for child in sorted(root.iterdir()):
            if (
                child.is_dir()
                and not child.name.startswith(".")
                and (names is None or child.name in names)
            ):
                found.append(child)
    return found


def auto_workers(settings: Settings) -> tuple[int, str]:
    """The worker count auto picks, and why (for the log)."""
    cores = usable_cores()
    if cores == 1:
        return 1, "one usable CPU core"
    folders = startup_models(settings)
    if folders is None:
        return 1, "a model store is not a local folder, so model sizes are unknown"
    sizes = {f.name: folder_bytes(f) for f in folders}
    big = sorted(name for name, size in sizes.items() if size > SMALL_MODEL_BYTES)
    if big:
        return 1, f"model(s) over {SMALL_MODEL_BYTES >> 20} MiB: {', '.join(big)}"
    available = available_memory_bytes()
    need = cores * (WORKER_BYTES + 2 * sum(sizes.values()))
    if available is None or need > available // 2:
        return 1, f"{cores} copies need {need >> 20} MiB, over half the available memory"
    return cores, f"{cores} usable CPU cores, models {sum(sizes.values()) >> 20} MiB in all"


def worker_count(settings: Settings) -> tuple[int, str]:
    """``--http-workers``: a positive number, or auto (ConfigError otherwise)."""
    text = settings.http_workers.strip().lower()
    if settings.lazy_serving() and text in ("auto", "1"):
        return 1, "lazy serving: one memory budget for the server"
    if settings.lazy_serving():
        raise ConfigError(
            f"--http-workers {text} with lazy serving would give each serving process a budget "
            "and a copy of the models of its own: use 1 or auto"
        )
    if text == "auto":
        return auto_workers(settings)
    if not text.isdigit() or int(text) < 1:
        raise ConfigError(f"--http-workers must be a positive number or auto, not '{text}'")
    return int(text), "--http-workers"
