"""Starting a worker Python process, with the server's interpreter or a model's own.

A worker runs ``python -c BOOT``: BOOT appends to ``sys.path`` the folder that holds inferd
and, when the interpreter is the server's Python version, the server's own path, then runs the
``main()`` of a module. Appended, not prepended: a model environment's own packages win, and
what it lacks (numpy, say) comes from the server's. A worker gets a process group of its own,
so a Ctrl-C at the terminal reaches the server, which then stops its workers in order; it stays
in the server's session, so a kernel that shares CPU time by session (autogroup) weighs the
server and its workers as one program rather than each worker as a program of its own (which
left a busy worker waiting for the CPU most of the time on a loaded host).
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol

log = logging.getLogger("inferd.scheduling")

# The folder that holds the inferd package (this file is inferd/backends/spawn.py).
PACKAGE_ROOT = Path(__file__).resolve().parents[2]

# SIGTTOU ignored: a worker outside the terminal's foreground group still writes to the server's
# terminal when the terminal is set to stop background writers (``stty tostop``).
BOOT = """\
import importlib, os, signal, sys
signal.signal(signal.SIGTTOU, signal.SIG_IGN)
for entry in os.environ.pop("INFERD_WORKER_PATH", "").split(os.pathsep):
    if entry and entry not in sys.path:
        sys.path.append(entry)
importlib.import_module(os.environ.pop("INFERD_WORKER_MAIN")).main()
"""
VERSION_PROBE_TIMEOUT_S = 30.0


class ProcessHandle(Protocol):
    """What the server keeps of a model process (``subprocess.Popen`` is one)."""

    pid: int

    def wait(self, timeout: float | None = None) -> int | None:
        """The exit code, negative for a signal (None: unknown); ``TimeoutExpired``."""
        ...

    def kill(self) -> None: ...


@functools.cache
def python_version(interpreter: str) -> tuple[int, int]:
    """The (major, minor) version of an interpreter (run once per path)."""
    if not interpreter or interpreter == sys.executable:
        return sys.version_info[:2]
    out = subprocess.run(
        [interpreter, "-c", "import sys; print(*sys.version_info[:2])"],
        capture_output=True,
        text=True,
        timeout=VERSION_PROBE_TIMEOUT_S,
        check=True,
    ).stdout.split()
    return int(out[0]), int(out[1])


def worker_path(interpreter: str) -> str:
    """The ``sys.path`` entries a worker appends (``INFERD_WORKER_PATH``)."""
    entries = [str(PACKAGE_ROOT)]
    if python_version(interpreter) == sys.version_info[:2]:
        entries += [p for p in sys.path if p]
    return os.pathsep.join(entries)


def start_python(
    interpreter: str,
    main_module: str,
    pass_fds: Sequence[int] = (),
    env: Mapping[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """Run ``main_module.main()`` in a new Python process (stdout and stderr: the server's)."""
    python = interpreter or sys.executable
    full_env = {
        "PYTHONUNBUFFERED": "1",  # a model's prints reach the server's log as they happen
        **os.environ,
        **(env or {}),
        "INFERD_WORKER_PATH": worker_path(python),
        "INFERD_WORKER_MAIN": main_module,
    }
    return subprocess.Popen(
        [python, "-c", BOOT],
        pass_fds=tuple(pass_fds),
        env=full_env,
        stdin=subprocess.DEVNULL,
        process_group=0,
    )


_SIGNAL_NOTES = {
    signal.SIGKILL: "killed, or out of memory",
    signal.SIGSEGV: "segmentation fault",
    signal.SIGBUS: "bus error",
    signal.SIGABRT: "aborted",
    signal.SIGFPE: "arithmetic fault",
    signal.SIGILL: "illegal instruction",
}


def describe_exit(returncode: int | None) -> str:
    """How a process ended, in words: 'killed by SIGSEGV (segmentation fault)'."""
    if returncode is None:
        return "stopped answering"
    if returncode < 0:
        try:
            sig = signal.Signals(-returncode)
        except ValueError:
            return f"killed by signal {-returncode}"
        note = _SIGNAL_NOTES.get(sig)
        return f"killed by {sig.name}" + (f" ({note})" if note else "")
    return f"exited with code {returncode}"
