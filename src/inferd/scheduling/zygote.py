"""A fork server for model processes of the server's own Python.

Starting a worker from scratch imports numpy, asyncio and the worker's modules again: a
second or more on a busy host, paid at every load and every restart after a crash. The
zygote is one process, started on first use, that has imported them once and forks a worker
on request (a few milliseconds). It is single-threaded when it forks, and never runs model
code itself. It reports each worker's exit status, which the server would otherwise read with
``waitpid``; if the zygote itself dies, the server starts a new one (and workers from the old
one report no exit status). Models with their own interpreter (``EXECUTION_ENV_PATH``) are
started directly instead.
"""

from __future__ import annotations

import array
import contextlib
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import threading

log = logging.getLogger("inferd.scheduling")

START_TIMEOUT_S = 60.0
_PRELOAD = (
    "numpy",
    "asyncio",
    "inferd.scheduling.model_process",
    "inferd.backends.python.host",
)


class ForkedProcess:
    """A worker forked by the zygote: ``subprocess.Popen``'s ``pid``, ``wait`` and ``kill``."""

    def __init__(self, zygote: Zygote, pid: int) -> None:
        self.pid = pid
        self._zygote = zygote

    def wait(self, timeout: float | None = None) -> int | None:
        """The exit code (negative: the signal); None when the zygote died meanwhile.
        Raises ``subprocess.TimeoutExpired`` like ``Popen.wait``."""
        return self._zygote.wait(self.pid, timeout)

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)


class Zygote:
    """The server's end: fork requests out, pids and exit statuses back."""

    def __init__(self) -> None:
        from inferd.backends.spawn import start_python

        server_end, zygote_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            fd = zygote_end.fileno()
            self._proc = start_python("", __name__, (fd,), {"INFERD_ZYGOTE_FD": str(fd)})
        finally:
            zygote_end.close()
        self._sock = server_end
        self._lock = threading.Lock()  # one fork request at a time
        self._changed = threading.Condition()
        self._forked: list[int] = []
        self._exits: dict[int, int] = {}
        self.alive = True
        self._sock.settimeout(START_TIMEOUT_S)
        if self._sock.recv(16) != b"ready":
            raise OSError("the worker zygote did not start")
        self._sock.settimeout(None)
        threading.Thread(target=self._read, name="inferd-zygote", daemon=True).start()

    def _read(self) -> None:
        while True:
            try:
                data = self._sock.recv(64)
            except OSError:
                data = b""
            with self._changed:
                if not data:
                    self.alive = False
                    self._changed.notify_all()
                    return
                kind, pid, value = data.decode().split()
                if kind == "forked":
                    self._forked.append(int(pid))
                else:
                    self._exits[int(pid)] = int(value)
                self._changed.notify_all()

    def fork(self, worker_fd: int) -> ForkedProcess:
        """A new worker serving the connection ``worker_fd`` (which it inherits)."""
        with self._lock:
            rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [worker_fd]))]
            self._sock.sendmsg([b"fork"], rights)
            with self._changed:
                while not self._forked:
                    if not self.alive:
                        raise OSError("the worker zygote is gone")
                    self._changed.wait(START_TIMEOUT_S)
                return ForkedProcess(self, self._forked.pop(0))

    def wait(self, pid: int, timeout: float | None) -> int | None:
        with self._changed:
            if not self._changed.wait_for(lambda: pid in self._exits or not self.alive, timeout):
                raise subprocess.TimeoutExpired(f"worker {pid}", timeout or 0)
            return self._exits.pop(pid, None)

    def close(self) -> None:
        self._sock.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(5)


_zygote: Zygote | None = None
_zygote_lock = threading.Lock()


def fork_model_process(worker_fd: int) -> ForkedProcess:
    """Fork a worker of the server's Python from the (started on demand) zygote."""
    global _zygote
    with _zygote_lock:
        if _zygote is None or not _zygote.alive:
            _zygote = Zygote()
        zygote = _zygote
    return zygote.fork(worker_fd)


# ---------------------------------------------------------------------- the zygote process


def _exit_code(status: int) -> int:
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def _reap(sock: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        sock.send(f"exited {pid} {_exit_code(status)}".encode())


def _child(sock: socket.socket, wakes: tuple[socket.socket, ...], fd: int) -> None:
    sock.close()
    for wake in wakes:
        wake.close()
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    os.setpgid(0, 0)  # its own group, in the server's session (``spawn``)
    os.environ["INFERD_WORKER_FD"] = str(fd)
    from inferd.scheduling import model_process

    try:
        model_process.main()
    finally:
        os._exit(0)


def main() -> None:
    """The zygote: preload, then fork a worker per request until the server is gone."""
    import importlib

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sock = socket.socket(fileno=int(os.environ.pop("INFERD_ZYGOTE_FD")))
    for module in _PRELOAD:
        importlib.import_module(module)
    wake_r, wake_w = socket.socketpair()
    wake_r.setblocking(False)
    wake_w.setblocking(False)
    signal.set_wakeup_fd(wake_w.fileno())
    signal.signal(signal.SIGCHLD, lambda *_: None)
    sock.send(b"ready")
    while True:
        readable, _, _ = select.select([sock, wake_r], [], [])
        if wake_r in readable:
            with contextlib.suppress(BlockingIOError):
                wake_r.recv(4096)
            _reap(sock)
        if sock not in readable:
            continue
        try:
            data, ancdata, _, _ = sock.recvmsg(16, socket.CMSG_SPACE(4))
        except InterruptedError:
            continue
        if not data:
            os._exit(0)  # the server is gone; its workers notice on their own sockets
        fds = array.array("i")
        for level, kind, payload in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _child(sock, (wake_r, wake_w), fds[0])
        for fd in fds:
            os.close(fd)
        sock.send(f"forked {pid} 0".encode())
        _reap(sock)
