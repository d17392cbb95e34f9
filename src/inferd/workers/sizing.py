"""How many serving processes ``--http-workers auto`` runs: the rule, and what it reads.

The models load once, in worker 0 (the model host); every other worker is a frontend that
decodes and encodes requests and holds no model. So auto is the number of usable CPU cores (the
affinity mask, capped by a cgroup CPU quota), fewer when the frontends' own memory
(``FRONTEND_BYTES`` each) would not fit in half the available memory (MemAvailable, capped by a
cgroup memory limit); the models' size does not count, since it is paid once.

Below ``FRONTENDS_FROM_CORES`` cores auto is one process. One process already keeps two cores
busy (its event loop, granian's HTTP threads beside it, the models' own threads), so on two a
second serving process adds little capacity and costs every request more CPU: each process
wakes its threads for half the requests, and a forwarded model adds the hop to the host.
Measured on 2 cores (tiny model, v2 JSON, c=16): 0.95x the requests per second of one
process at 1.28x the CPU per request; HTTP binary 0.82x at 1.69x.

Lazy serving (a memory budget) makes auto one process. Its budget is the host's whatever the
count (``workers.demand_host`` loads on behalf of every worker), but no model is copied into
the frontends under a budget, so with several workers every request takes the hop to the host:
a warm hit costs more CPU and latency than in one process, which is what a node of many lightly
used models needs most. A number chooses several workers sharing the one budget, for traffic
heavy enough to need the cores.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from inferd.core.errors import ConfigError

FRONTEND_BYTES = 256 << 20  # one frontend worker's memory, rounded up: interpreter, buffers
FRONTENDS_FROM_CORES = 3  # fewer usable cores: one process (the module doc)


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


def auto_workers() -> tuple[int, str]:
    """The worker count auto picks, and why (for the log)."""
    cores = usable_cores()
    if cores == 1:
        return 1, "one usable CPU core"
    if cores < FRONTENDS_FROM_CORES:
        return 1, (
            f"{cores} usable CPU cores: one process keeps them busy, and a second would cost "
            "every request more CPU"
        )
    available = available_memory_bytes()
    if available is None:
        return 1, "the available memory is unknown"
    fits = 1 + (available // 2) // FRONTEND_BYTES
    if fits < cores:
        return max(1, fits), (
            f"{cores} usable CPU cores, but only {fits - 1} frontend(s) of "
            f"{FRONTEND_BYTES >> 20} MiB fit in half the available memory"
        )
    return cores, f"{cores} usable CPU cores; the models load once, in worker 0"


def worker_count(http_workers: str, lazy_serving: bool = False) -> tuple[int, str]:
    """``--http-workers``: a positive number, or auto (ConfigError otherwise); ``lazy_serving``:
    whether the server loads models on first use."""
    text = http_workers.strip().lower()
    if text == "auto" and lazy_serving:
        return 1, "lazy serving: a warm hit in one process skips the hop to the model host"
    if text == "auto":
        return auto_workers()
    if not text.isdigit() or int(text) < 1:
        raise ConfigError(f"--http-workers must be a positive number or auto, not '{text}'")
    return int(text), "--http-workers"
