"""The parent of a multi-worker server: starts the workers, restarts one that dies, passes
SIGTERM (drain) and SIGINT (stop now) on to all of them, and exits when they have all stopped.

Workers are forked (the supervisor holds no thread), so they start with the server's modules
imported. They bind the HTTP and gRPC ports with SO_REUSEPORT, so the kernel spreads connections
over them. Worker 0 binds at once, as a single server does; the others, and every replacement, bind
only once their models are loaded and the journal replayed, so no connection reaches a worker
that cannot serve it yet. Each worker is its own process group and gets SIGTERM if the
supervisor dies.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import multiprocessing
import os
import shutil
import signal
import sys
import tempfile
import time
from multiprocessing.connection import wait
from multiprocessing.process import BaseProcess
from pathlib import Path
from types import FrameType
from typing import Protocol

from inferd.observability.logging import ENGINE, TAIL_LINES, TailHandler
from inferd.workers.peers import WorkerRole
from inferd.workers.supervisor_log import SUPERVISOR_LOG, RunFolderLog

log = logging.getLogger("inferd.workers")


class Entry(Protocol):
    """What a worker process runs: serve as ``role``; its exit code. The application binds its
    settings (each worker's own: see ``inferd.app.server.worker_settings``)."""

    def __call__(self, role: WorkerRole, /) -> int: ...


CONFIG_EXIT = 2  # what `inferd serve` exits with on a configuration error
INTERRUPTED_EXIT = 128 + signal.SIGINT  # a worker stopped by SIGINT while starting
STEADY_S = 10.0  # a worker that lived this long is restarted at once; sooner, with back-off
MAX_BACKOFF_S = 30.0
_PR_SET_PDEATHSIG = 1


def _keep_log(run_dir: Path) -> RunFolderLog:
    """The supervisor's engine lines from now on (and those it kept) in the run folder, for the
    workers' ``/v2/logs``, formatted as its engine log is."""
    engine = logging.getLogger(ENGINE)
    tails = [h for h in engine.handlers if isinstance(h, TailHandler)]
    kept = tails[0].entries(0, None, TAIL_LINES) if tails else []
    handler = RunFolderLog(run_dir / SUPERVISOR_LOG, kept)
    if tails:
        handler.setFormatter(tails[0].formatter)
        for level_filter in tails[0].filters:
            handler.addFilter(level_filter)
    engine.addHandler(handler)
    return handler


def _worker_main(entry: Entry, role: WorkerRole) -> None:
    # Forked from the supervisor: its signal handlers are not this process's (SIGINT stops a
    # worker that is still starting, SIGTERM ends it; the server installs its own later).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.setpgrp()  # a terminal's Ctrl-C reaches the supervisor, which passes it on once
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)  # drain if the supervisor dies
    except (OSError, AttributeError):
        pass
    if os.getppid() == 1:  # the supervisor died before prctl
        sys.exit(0)
    try:
        code = entry(role)
    except KeyboardInterrupt:
        # SIGINT before the server took the signal over (still importing or loading): the
        # supervisor stops every worker this way when one cannot start. A stop, not a crash.
        code = INTERRUPTED_EXIT
    sys.exit(code)


class Supervisor:
    def __init__(self, count: int, entry: Entry) -> None:
        self.entry = entry
        self.count = count
        self.run_dir = Path(tempfile.mkdtemp(prefix="inferd-workers-"))
        self.started_unix_s = time.time()  # the server's start, whichever worker tells it
        # Forked: a worker starts with the server's modules already imported (the supervisor
        # imported them to run ``entry``, and holds no thread), sharing their pages until
        # written; a spawned one would import them again, half a second of CPU per worker.
        self.context = multiprocessing.get_context("fork")
        self.procs: dict[int, BaseProcess] = {}
        self.started_s: dict[int, float] = {}
        self.backoff_s: dict[int, float] = {}
        self.restart_at: dict[int, float] = {}
        self.starts: dict[int, int] = {}
        self.stopping = False

    def _start(self, index: int) -> None:
        starts = self.starts.get(index, 0)
        role = WorkerRole(
            index,
            self.count,
            self.run_dir,
            restarted=starts > 0,
            started_unix_s=self.started_unix_s,
        )
        proc = self.context.Process(
            target=_worker_main,
            args=(self.entry, role),
            name=f"inferd-worker-{index}",
        )
        proc.start()
        log.info("worker %d started: pid %s", index, proc.pid)
        self.procs[index] = proc
        self.started_s[index] = time.monotonic()
        self.starts[index] = starts + 1

    def _signal(self, signum: int, frame: FrameType | None) -> None:
        if signum == signal.SIGTERM:
            log.info("SIGTERM: draining %d worker(s)", len(self.procs))
        self.stopping = True
        self.restart_at.clear()
        for proc in self.procs.values():
            if proc.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signum)

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._signal)
        signal.signal(signal.SIGINT, self._signal)
        kept = _keep_log(self.run_dir)
        log.info("starting %d workers on one port (run folder %s)", self.count, self.run_dir)
        try:
            for index in range(self.count):
                self._start(index)
            return self._watch()
        finally:
            for proc in self.procs.values():
                proc.join()
            logging.getLogger(ENGINE).removeHandler(kept)
            shutil.rmtree(self.run_dir, ignore_errors=True)

    def _watch(self) -> int:
        while self.procs or self.restart_at:
            now = time.monotonic()
            for index, when in list(self.restart_at.items()):
                if when <= now and not self.stopping:
                    del self.restart_at[index]
                    log.info("restarting worker %d", index)
                    self._start(index)
            sentinels = {proc.sentinel: index for index, proc in self.procs.items()}
            if not sentinels:
                time.sleep(0.1)  # every worker is waiting to be restarted
                continue
            for ready in wait(list(sentinels), timeout=0.5):
                assert isinstance(ready, int)
                code = self._reap(sentinels[ready])
                if code is not None:
                    return code
        return 0

    def _reap(self, index: int) -> int | None:
        """A worker exited; returns the server's exit code when it must stop."""
        proc = self.procs.pop(index)
        proc.join()
        code = proc.exitcode
        if self.stopping:
            return None
        if code == CONFIG_EXIT and self.starts[index] == 1:
            log.error("worker %d could not start: stopping the server", index)
            self._signal(signal.SIGINT, None)
            return CONFIG_EXIT
        lived_s = time.monotonic() - self.started_s[index]
        delay = 0.0
        if lived_s < STEADY_S:
            delay = min(MAX_BACKOFF_S, max(0.5, 2 * self.backoff_s.get(index, 0.25)))
        self.backoff_s[index] = delay
        log.warning(
            "worker %d (pid %s) exited with %s after %.1f s: restarting it in %.1f s",
            index,
            proc.pid,
            code,
            lived_s,
            delay,
        )
        self.restart_at[index] = time.monotonic() + delay
        return None
