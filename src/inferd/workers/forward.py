"""A frontend worker's link to the model host: every inference goes there, the model table
comes back.

The link is one ``SOCK_SEQPACKET`` connection to the host's socket in the run folder, with
the framing and shared-memory arenas of a Python model's worker connection
(``scheduling.channel``): a tensor of a few KB rides in the message, a larger one is copied once
into an arena the host reads in place (and the host's answers come back the same way). The
requests and answers of one event-loop iteration travel as one message each way.

Each model version here is a stand-in (``workers.table``) whose scheduler is a
``RemoteScheduler`` (``workers.remote_scheduler``): the frontend validates a request and keeps
the request's statistics; the host runs it through the version's own scheduler (its dynamic
batcher sees the requests of every worker), answers it from its response cache when the model
has one, and keeps the execution statistics. A client that leaves cancels its request on the
host too. A request for a version the host retired since the frontend routed it (a swap) comes
back with the number of the host's table that says so, and fails here only once that table is
applied: the stand-in is then retired too, and the data plane routes the request again. Both
ends are processes of the same server, so messages are unpickled as they come.

When the host goes away (it died and is being restarted), requests fail at once with
``Unavailable``, the frontend reports not ready, and the link reconnects; the host's first
table after that replaces every record.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import socket
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inferd.backends.work import CANCELLED, Result, Work, join, split
from inferd.core.errors import InternalError, Unavailable
from inferd.core.types import Tensors, Timings
from inferd.plane.registry import Registry
from inferd.repository.manager import RepositoryStatus
from inferd.repository.memory import AfterBursts
from inferd.scheduling.channel import SOCKET_BUFFER_BYTES, Channel
from inferd.scheduling.processes import COPY_OFF_LOOP_BYTES
from inferd.scheduling.wire import Encoder, decode_result, works_bytes
from inferd.workers import rows
from inferd.workers.mirror import Mirror
from inferd.workers.queues import QueueView
from inferd.workers.remote_scheduler import RemoteScheduler
from inferd.workers.status import status_from_doc

log = logging.getLogger("inferd.workers")

RECONNECT_S = 0.2  # how often a frontend tries to reach a host that is not there
IDLE_FLUSH_S = 0.01  # an idle link hands back the host's answer blocks this soon
HOST_SOCKET = "host.sock"


def host_gone(index: int) -> Unavailable:
    return Unavailable(
        f"worker {index} cannot reach the model host (worker 0): it is restarting; retry shortly"
    )


@dataclass(eq=False, slots=True)
class _Call:
    """A request sent (or about to be) and not answered yet."""

    future: asyncio.Future[Result]
    timings: Timings
    responses: Callable[[Result, bool], None] | None
    table: int = 0  # the host retired the version: the table that says so, to apply first


@dataclass(eq=False, slots=True)
class _Out:
    """A request waiting for the next message to the host."""

    call_id: int
    scheduler: RemoteScheduler
    work: Work


class HostLink:
    """The frontend's end of the link (module doc)."""

    def __init__(self, run_dir: Path, index: int, registry: Registry) -> None:
        self.path = run_dir / HOST_SOCKET
        self.index = index
        self.queues = QueueView(run_dir)
        self.mirror = Mirror(registry, self.scheduler, index)
        self.channel: Channel | None = None
        self.status = RepositoryStatus(None, (), (), 0)  # the host's, sent every second
        self.models_ready = False  # the host's own --strict-readiness verdict
        self.extra: Any = None  # what else the host sends with its status (ModelHost.extra)
        self.has_table = asyncio.Event()  # the first full table of this connection came
        self.applied = 0  # the number of the last table applied, on this connection
        self._catching: list[asyncio.Future[None]] = []  # caught_up's waiters
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ids = itertools.count(1)
        self._calls: dict[int, _Call] = {}
        self._joined: dict[int, list[tuple[int, int]]] = {}  # sent as one: (call id, rows)
        self._outbox: list[_Out | tuple[Any, ...]] = []
        self._flush_armed = False
        self._idle_armed = False
        self._after_bursts = AfterBursts()  # free heap memory back once a burst is over
        self._reconnect: asyncio.Task[None] | None = None
        self._tables: deque[tuple[Channel, tuple[Any, ...]]] = deque()  # to apply, in order
        self._applying: asyncio.Task[None] | None = None
        self._closed = False

    # ------------------------------------------------------------------ connecting

    async def start(self) -> None:
        """Connect (retrying while the host starts) and wait for the host's first table."""
        self._loop = asyncio.get_running_loop()
        await self._connect_loop()
        await self.has_table.wait()

    async def _connect_loop(self) -> None:
        while not self._closed:
            try:
                sock = await asyncio.to_thread(self._dial)
            except OSError:
                await asyncio.sleep(RECONNECT_S)
                continue
            self._attach(sock)
            return

    def _dial(self) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            for option in (socket.SO_SNDBUF, socket.SO_RCVBUF):
                sock.setsockopt(socket.SOL_SOCKET, option, SOCKET_BUFFER_BYTES)
            sock.connect(str(self.path))
        except OSError:
            sock.close()
            raise
        return sock

    def _attach(self, sock: socket.socket) -> None:
        assert self._loop is not None
        channel = self.channel = Channel(sock, trusting=True)
        self.has_table.clear()
        self._loop.add_reader(channel.fileno(), self._readable, channel)
        self._send("hello", self.index)
        log.debug("worker %d: linked to the model host", self.index)

    @property
    def up(self) -> bool:
        """Linked to the host, with its table."""
        return self.channel is not None and self.has_table.is_set()

    def ready(self) -> bool:
        """What this frontend's readiness adds: the host is there, and (strict readiness)
        every model it should serve is READY."""
        return self.up and self.models_ready

    async def close(self) -> None:
        self._closed = True
        if self._reconnect is not None:
            self._reconnect.cancel()
            await asyncio.gather(self._reconnect, return_exceptions=True)
        channel, self.channel = self.channel, None
        if channel is not None:
            self._detach(channel)
        self._fail_calls(Unavailable(f"worker {self.index} is stopping"))
        self._tables.clear()
        self._wake_catching()
        if self._applying is not None:
            await asyncio.gather(self._applying, return_exceptions=True)
        await self.mirror.close()

    def _detach(self, channel: Channel) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.remove_reader(channel.fileno())
            loop.remove_writer(channel.fileno())
        channel.close()

    def _lost(self, channel: Channel) -> None:
        """The host went away: fail what it held and reach for its replacement."""
        if self.channel is not channel:
            return
        self.channel = None
        self.has_table.clear()
        self._outbox.clear()
        self._joined.clear()
        self._tables.clear()
        self.applied = 0
        self._wake_catching()
        self._detach(channel)
        error = host_gone(self.index)
        self._fail_calls(error)
        self.mirror.lost(error.message)
        if not self._closed and self._loop is not None:
            log.warning("worker %d: the model host went away; reconnecting", self.index)
            self._reconnect = self._loop.create_task(self._connect_loop())

    def _fail_calls(self, error: Unavailable) -> None:
        calls, self._calls = self._calls, {}
        for call in calls.values():
            if not call.future.done():
                call.future.set_exception(error)

    # ------------------------------------------------------------------ requests

    def scheduler(
        self, name: str, version: int, rows: int, queue: list[Any] | None = None
    ) -> RemoteScheduler:
        return RemoteScheduler(self, name, version, rows, queue)

    async def run(self, scheduler: RemoteScheduler, work: Work, timings: Timings) -> Tensors:
        """Run ``work`` on the host's version of the stand-in ``scheduler`` is for: its
        outputs (a decoupled model's responses go to ``work.responses`` as they come)."""
        channel = self.channel
        if channel is None or not self.has_table.is_set():
            raise host_gone(self.index)
        loop = self._loop
        assert loop is not None
        call_id = next(self._ids)
        future: asyncio.Future[Result] = loop.create_future()
        call = self._calls[call_id] = _Call(future, timings, work.responses)
        self._queue(_Out(call_id, scheduler, work))
        try:
            result = await future
        except asyncio.CancelledError:
            if self._calls.pop(call_id, None) is not None and self.channel is channel:
                self._queue(("c", call_id))  # not sent yet, or alone: the host drops it
            raise
        if isinstance(result, dict):
            return result
        if result is CANCELLED:
            raise Unavailable("the request was cancelled on the model host")
        if call.table:
            # The host retired the version since this frontend routed the request to it (a
            # swap): once the host's table that says so is applied here, the stand-in is
            # retired too and the data plane routes the request again (``DataPlane.run``).
            await self.caught_up(call.table)
        raise result

    def _queue(self, item: _Out | tuple[Any, ...]) -> None:
        self._outbox.append(item)
        if not self._flush_armed:
            self._flush_armed = True
            assert self._loop is not None
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        """Send this loop iteration's requests as one message; those that may travel as one
        (``workers.rows``) do."""
        self._flush_armed = False
        items, self._outbox = self._outbox, []
        channel = self.channel
        if not items or channel is None:
            return
        encoder = Encoder(channel)
        calls = self._calls
        sent: list[tuple[Any, ...]] = []
        groups: dict[tuple[Any, ...], list[_Out]] = {}
        for item in items:
            if isinstance(item, tuple):
                sent.append(item)
                continue
            if item.call_id not in calls:
                continue  # its caller left before it went out
            if works_bytes((item.work,)) > COPY_OFF_LOOP_BYTES:  # travels alone
                self._copy_off_loop(channel, item)
                continue
            joint = rows.key(item.work) if item.scheduler.rows else None
            if joint is None:
                sent.append(self._encode(encoder, item.call_id, item.scheduler, item.work))
            else:
                groups.setdefault((id(item.scheduler), *joint), []).append(item)
        for members in groups.values():
            for chunk in _chunks(members, members[0].scheduler.rows):
                sent.append(self._encode_joined(encoder, chunk))
        if sent:
            self._send("calls", sent)

    def _copy_off_loop(self, channel: Channel, item: _Out) -> None:
        """Copy a large request into shared memory on a thread (on the loop, the copy held
        every other request of this process), then send it."""
        assert self._loop is not None
        copy = self._loop.run_in_executor(
            None, self._encode, Encoder(channel), item.call_id, item.scheduler, item.work
        )
        copy.add_done_callback(functools.partial(self._copied, channel, item.call_id))

    def _copied(self, channel: Channel, call_id: int, copy: asyncio.Future[Any]) -> None:
        error = copy.exception()
        if error is not None:
            call = self._calls.pop(call_id, None)
            if call is not None and not call.future.done():
                call.future.set_exception(InternalError(f"cannot send a request: {error}"))
        elif self.channel is channel:  # else the host went away, and the call failed with it
            # A caller that left meanwhile: the host frees the request's blocks and drops it.
            gone = [] if call_id in self._calls else [("c", call_id)]
            self._send("calls", [copy.result(), *gone])

    def _encode(
        self,
        encoder: Encoder,
        call_id: int,
        scheduler: RemoteScheduler,
        work: Work,
        requests: int = 1,
    ) -> tuple[Any, ...]:
        return (
            "r",
            call_id,
            scheduler.name,
            scheduler.version,
            work.rows,
            work.outputs,
            work.request_id,
            work.parameters,
            work.signature,
            encoder.tensors(work.inputs),
            work.responses is not None,
            requests,
        )

    def _encode_joined(self, encoder: Encoder, chunk: list[_Out]) -> tuple[Any, ...]:
        first = chunk[0]
        if len(chunk) == 1:
            return self._encode(encoder, first.call_id, first.scheduler, first.work)
        works = [item.work for item in chunk]
        joined = Work(join(works), sum(w.rows for w in works), first.work.outputs)
        joint_id = next(self._ids)
        self._joined[joint_id] = [(item.call_id, item.work.rows) for item in chunk]
        return self._encode(encoder, joint_id, first.scheduler, joined, len(chunk))

    def _send(self, kind: str, payload: Any) -> None:
        channel = self.channel
        if channel is None:
            return
        try:
            if not channel.send_nowait(kind, payload):
                assert self._loop is not None
                self._loop.add_writer(channel.fileno(), self._writable, channel)
        except OSError:
            pass  # the host is gone: the reader sees the end and handles it

    def _writable(self, channel: Channel) -> None:
        try:
            done = channel.flush()
        except OSError:
            done = True
        if done and self._loop is not None:
            self._loop.remove_writer(channel.fileno())

    # ------------------------------------------------------------------ what the host sends

    def _readable(self, channel: Channel) -> None:
        while self.channel is channel:
            try:
                message = channel.recv(block=False)
            except EOFError:
                self._lost(channel)
                return
            except Exception:
                log.exception("worker %d: a message from the model host", self.index)
                self._lost(channel)
                return
            if message is None:
                return
            kind, payload = message
            if kind == "answers":
                self._answers(channel, payload)
            elif kind == "table":
                self._table(channel, payload)
            elif kind == "status":
                self._status(payload)
            # the host writes every second or so: once a burst is over, what it took goes back
            channel.arenas.trim()
            self._after_bursts()
            if not channel.waiting():
                return

    def _answers(self, channel: Channel, items: list[tuple[Any, ...]]) -> None:
        calls = self._calls
        for item in items:
            tag, call_id = item[0], item[1]
            if tag == "d" or tag == "m":  # done: (call id, result, timings[, table])
                parts = self._joined.pop(call_id, None)
                if parts is None and call_id not in calls:
                    continue
                try:
                    result = decode_result(channel, item[2])
                except Exception as exc:
                    result = InternalError(f"an answer of the model host could not be read: {exc}")
                table = item[4] if tag == "m" else 0  # "m": the version moved on (retired)
                if parts is None:
                    self._done(calls.pop(call_id), result, item[3], table)
                    continue
                shares = split(result, [n for _, n in parts]) if isinstance(result, dict) else None
                for i, (part_id, _) in enumerate(parts):
                    call = calls.pop(part_id, None)
                    if call is not None:
                        self._done(call, result if shares is None else shares[i], item[3], table)
            elif tag == "p":
                call = calls.get(call_id)
                if call is not None and call.responses is not None:
                    call.responses(decode_result(channel, item[2]), bool(item[3]))
        if not calls and channel.mapped.outstanding and not self._idle_armed:
            self._idle_armed = True
            assert self._loop is not None
            self._loop.call_later(IDLE_FLUSH_S, self._flush_idle, channel)

    @staticmethod
    def _done(call: _Call, result: Result, times: tuple[int, int, int], table: int = 0) -> None:
        timings = call.timings
        timings.queue_start_ns, timings.compute_start_ns, timings.compute_end_ns = times
        call.table = table
        if not call.future.done():
            call.future.set_result(result)

    def _flush_idle(self, channel: Channel) -> None:
        """Hand the host back the answer blocks an idle frontend no longer needs."""
        self._idle_armed = False
        if self.channel is channel and not self._calls and channel.mapped.released:
            self._send("release", None)

    def _table(self, channel: Channel, payload: tuple[Any, ...]) -> None:
        """Apply the host's table messages in order, each before its ack (a copy of a small
        model loads first, on a worker thread)."""
        self._tables.append((channel, payload))
        if self._applying is None or self._applying.done():
            assert self._loop is not None
            self._applying = self._loop.create_task(self._apply_tables(), name="model table")

    async def _apply_tables(self) -> None:
        while self._tables:
            channel, (seq, full, docs, gone, status) = self._tables.popleft()
            try:
                await self.mirror.apply(docs, gone, full)
            except Exception:
                log.exception("worker %d: the model host's table could not be applied", self.index)
            if self.channel is not channel:
                continue  # the host went away meanwhile: its next table replaces it all
            self._status(status)
            self._send("ack", seq)
            if full:
                self.has_table.set()
            self.applied = seq
            self._wake_catching()

    def _status(self, payload: tuple[Any, ...]) -> None:
        doc, models_ready, self.extra = payload
        with contextlib.suppress(Exception):
            self.status = status_from_doc(doc)
        self.models_ready = bool(models_ready)

    async def caught_up(self, seq: int) -> None:
        """Return once the host's table ``seq`` (``ModelHost.publish``) is applied here;
        Unavailable when the link drops first."""
        channel = self.channel
        while self.applied < seq:
            if channel is None or self.channel is not channel or self._closed:
                raise host_gone(self.index)
            assert self._loop is not None
            waiter = self._loop.create_future()
            self._catching.append(waiter)
            await waiter

    def _wake_catching(self) -> None:
        waiters, self._catching = self._catching, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)


def _chunks(members: list[_Out], most_rows: int) -> list[list[_Out]]:
    """Consecutive groups of at most ``most_rows`` rows (a request with more goes alone)."""
    chunks: list[list[_Out]] = []
    current: list[_Out] = []
    total = 0
    for item in members:
        count = item.work.rows
        if current and total + count > most_rows:
            chunks.append(current)
            current, total = [], 0
        current.append(item)
        total += count
    if current:
        chunks.append(current)
    return chunks
