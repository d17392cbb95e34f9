"""One end of the connection between the server and a worker process.

A ``SOCK_SEQPACKET`` Unix socket carries small messages, one datagram each: a pickled tuple
``(new arenas, unmapped arenas, kind, payload, releases)`` with the descriptors of new arenas
attached (``SCM_RIGHTS``). Tensors travel in the arenas (``scheduling.shm``); only tensors of
a few KB ride inline in the message, where a copy costs less than a block. A message that would
not fit one datagram goes through an arena too. The server unpickles what a worker sends with
an unpickler that refuses every class: plain data only.
"""

from __future__ import annotations

import array
import contextlib
import io
import os
import pickle
import select
import socket
import threading
from collections import deque
from typing import Any

from inferd.scheduling.shm import GIVE_BACK_BYTES, Arenas, Mapped

MAX_MESSAGE_BYTES = 60 << 10  # larger pickles go through an arena
SOCKET_BUFFER_BYTES = 1 << 20
MAX_FDS = 16
_BIG = "big"
# Plain ints: the socket module's flags are enums, and enum arithmetic costs microseconds.
_DONTWAIT = int(socket.MSG_DONTWAIT)
_CUT = int(socket.MSG_TRUNC | socket.MSG_CTRUNC)
_ANCILLARY_BYTES = socket.CMSG_SPACE(MAX_FDS * 4)
_RECEIVE_BYTES = MAX_MESSAGE_BYTES + 4096

Message = tuple[str, Any]


class _PlainUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"a worker may send plain data only, not {module}.{name}")


def _loads_plain(data: bytes) -> Any:
    return _PlainUnpickler(io.BytesIO(data)).load()


def socket_pair() -> tuple[socket.socket, socket.socket]:
    """(server end, worker end), with buffers for bursts of small messages."""
    pair = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    for sock in pair:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER_BYTES)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SOCKET_BUFFER_BYTES)
    return pair


class Channel:
    """Messages both ways, tensors in arenas. ``trusting``: unpickle anything (the worker
    trusts the server); the server's end accepts plain data only."""

    def __init__(self, sock: socket.socket, *, trusting: bool) -> None:
        self.sock = sock
        self.arenas = Arenas()  # what this end writes
        self.mapped = Mapped()  # what the peer wrote
        self._loads = pickle.loads if trusting else _loads_plain
        self._send_lock = threading.Lock()
        self._outbox: deque[tuple[bytes, list[int]]] = deque()  # waiting for socket space
        self._poll = select.poll()
        self._poll.register(sock.fileno(), select.POLLIN)
        self.closed = False

    def fileno(self) -> int:
        return self.sock.fileno()

    # ------------------------------------------------------------------ sending

    def _pack(self, kind: str, payload: Any) -> tuple[bytes, list[int]]:
        """One datagram: (new arenas, unmapped arenas, kind, payload, releases)."""
        releases = self.mapped.releases()
        new, fds, retired = self.arenas.announcements()
        data = pickle.dumps((new, retired, kind, payload, releases), protocol=5)
        if len(data) > MAX_MESSAGE_BYTES:  # the message itself goes through an arena
            ref = self.arenas.put_bytes(pickle.dumps((kind, payload, releases), protocol=5))
            more, more_fds, more_retired = self.arenas.announcements()
            fds = fds + more_fds
            data = pickle.dumps((new + more, retired + more_retired, _BIG, ref, []), protocol=5)
        return data, fds

    def send(self, kind: str, payload: Any = None) -> None:
        """Send, waiting for socket space (the worker's way)."""
        with self._send_lock:
            data, fds = self._pack(kind, payload)
            self._sendmsg(data, fds, 0)

    def send_nowait(self, kind: str, payload: Any = None) -> bool:
        """Send without blocking; a message that does not fit waits in an outbox (in order)
        until ``flush``. Returns whether everything is out."""
        with self._send_lock:
            self._outbox.append(self._pack(kind, payload))
            return self._flush_locked()

    def flush(self) -> bool:
        with self._send_lock:
            return self._flush_locked()

    def _flush_locked(self) -> bool:
        outbox = self._outbox
        while outbox:
            data, fds = outbox[0]
            try:
                self._sendmsg(data, fds, _DONTWAIT)
            except BlockingIOError:
                return False
            outbox.popleft()
        return True

    def _sendmsg(self, data: bytes, fds: list[int], flags: int) -> None:
        if fds:
            rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))]
            self.sock.sendmsg([data], rights, flags)
            self.arenas.sent(fds)
        else:
            self.sock.sendmsg([data], [], flags)

    # ------------------------------------------------------------------ receiving

    def large_releases(self) -> bool:
        """Whether the peer's blocks read here and not yet handed back are large enough to
        hand back now, in a ``release`` message (which carries only releases), rather than
        with the answer: the peer then gives their memory back while the request runs
        (``shm.GIVE_BACK_BYTES``)."""
        try:
            return sum(ref[2] for ref in self.mapped.released) >= GIVE_BACK_BYTES
        except RuntimeError:  # appended to meanwhile (from another thread)
            return False

    def waiting(self) -> bool:
        """Whether a message (or the end) is waiting: a poll, a fifth of a receive that fails."""
        return bool(self._poll.poll(0))

    def recv(self, block: bool = True) -> Message | None:
        """The next message (None: nothing waiting and ``block`` is false). EOFError when the
        peer is gone."""
        try:
            data, ancdata, flags, _ = self.sock.recvmsg(
                _RECEIVE_BYTES, _ANCILLARY_BYTES, 0 if block else _DONTWAIT
            )
        except BlockingIOError:
            return None
        except OSError as exc:  # reset, or this end was closed
            raise EOFError(str(exc)) from None
        fds = _received_fds(ancdata) if ancdata else []
        if not data:
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
            raise EOFError("the peer closed the connection")
        if flags & _CUT:
            raise EOFError("a message was cut short")
        new, retired, kind, payload, releases = self._loads(data)
        if new:
            self.mapped.add(new, fds)
        if kind == _BIG:
            kind, payload, releases = self._loads(self.mapped.read(payload))
        if releases:
            self.arenas.release(releases)
        if retired:
            self.mapped.retire(retired)
        return kind, payload

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.sock.close()
        self.arenas.close()
        self.mapped.close()


def _received_fds(ancdata: list[tuple[int, int, bytes]]) -> list[int]:
    fds: list[int] = []
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            found = array.array("i")
            found.frombytes(data[: len(data) - len(data) % found.itemsize])
            fds.extend(found)
    return fds
