"""The model host: worker 0 of several, the one process that loads the models and runs them.

The host serves HTTP and gRPC like every worker, and also listens on a socket in the run folder
for the frontend workers (``workers.forward``). A frontend's request arrives as its validated
inputs and is run through the version's own scheduler, exactly as a request decoded here: one
dynamic batcher per version sees every worker's requests, and each model's weights and worker
processes exist once. The answers of one event-loop iteration go back as one message.

The host also keeps every frontend's model table current: a frontend that connects gets every
record once startup loading is over, then the records that changed (checked every
``TICK_S``, and at once by ``sync`` after a repository change, which waits until every frontend
has applied them). The repository's status and the host's readiness go out every ``STATUS_S``.

With lazy serving (``workers.demand_host``) the host also tells ``uses`` of each forwarded
request while it runs (the budget's in-flight count and last use), and sends what the frontends
need of the budget with every status (``extra``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from inferd.backends.work import Result, Work
from inferd.core.errors import InferdError, InternalError, NotFound, Unavailable
from inferd.core.types import Timings
from inferd.plane.model import ModelVersion
from inferd.plane.registry import Registry, unknown_model
from inferd.plane.validate import shape_outputs
from inferd.repository.manager import RepositoryStatus
from inferd.repository.memory import AfterBursts
from inferd.scheduling.channel import SOCKET_BUFFER_BYTES, Channel
from inferd.scheduling.eager import run_eagerly
from inferd.scheduling.wire import Encoder, decode_tensors, encode_result
from inferd.workers.forward import HOST_SOCKET, IDLE_FLUSH_S
from inferd.workers.queues import QueueBoard
from inferd.workers.status import status_doc
from inferd.workers.table import Fingerprints, Serials

log = logging.getLogger("inferd.workers")

TICK_S = 0.25  # how often the host looks for records that changed without a repository call
STATUS_S = 1.0
SYNC_TIMEOUT_S = 10.0  # a frontend that has not applied a change by then is left behind


class Uses(Protocol):
    """Who is told of forwarded requests while they run (lazy serving's residency)."""

    def hold(self, name: str, requests: int = 1) -> None: ...

    def release(self, name: str, requests: int = 1) -> None: ...


def _nothing() -> None:
    return None


@dataclass(eq=False, slots=True)
class _Frontend:
    """One frontend's connection as the host sees it."""

    channel: Channel
    index: int = -1  # -1 until it said hello
    acked: int = 0  # the last table it applied
    table: int = 0  # the last table sent to it
    tasks: dict[int, tuple[Work, asyncio.Task[None]]] = field(default_factory=dict)
    running: int = 0  # its calls not answered yet
    outbox: list[tuple[Any, ...]] = field(default_factory=list)
    encoder: Encoder | None = None
    flush_armed: bool = False
    idle_armed: bool = False
    closed: bool = False


class ModelHost:
    """The host's side of the frontends' links (module doc)."""

    def __init__(
        self,
        registry: Registry,
        run_dir: Path,
        status: Callable[[], RepositoryStatus],
        models_ready: Callable[[], bool],
        copy_bytes: int = 0,
    ) -> None:
        """``copy_bytes``: --http-workers-copy-bytes (workers.copies)."""
        self.registry = registry
        self.path = run_dir / HOST_SOCKET
        self.status = status
        self.models_ready = models_ready
        self.queues = QueueBoard(run_dir)
        self.serials = Serials(self.queues.slot)
        self.fingerprints = Fingerprints(copy_bytes)
        self.frontends: list[_Frontend] = []
        self.open = False  # startup loading is over: frontends get the table
        self.arrivals = 0  # requests the frontends forwarded
        self.uses: Uses | None = None
        self.extra: Callable[[], Any] = _nothing  # sent with the status (workers.demand_host)
        self._seq = 0
        self._waiters: list[asyncio.Future[None]] = []  # syncs waiting for acks
        self._after_bursts = AfterBursts()  # free heap memory back once a burst is over
        self._listener: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ticker: asyncio.Task[None] | None = None
        self._gone = asyncio.Event()  # every frontend has disconnected

    # ------------------------------------------------------------------ life

    async def start(self) -> None:
        """Listen for frontends (before the models load: they wait for the table)."""
        self._loop = asyncio.get_running_loop()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()  # left by the host this one replaces
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        listener.bind(str(self.path))
        listener.listen(64)
        listener.setblocking(False)
        self._listener = listener
        self._loop.add_reader(listener.fileno(), self._accept)

    def open_table(self) -> None:
        """Startup loading is over: send every frontend the table, then keep it current."""
        self.open = True
        docs = self.fingerprints.everything(self.registry, self.serials)
        self._seq += 1
        for frontend in self.frontends:
            if frontend.index >= 0:
                self._send_table(frontend, docs, [], True)
        assert self._loop is not None
        self._ticker = self._loop.create_task(self._tick(), name="model table")

    async def wait_frontends(self, timeout_s: float) -> None:
        """Wait (at most ``timeout_s``) until every frontend has disconnected: they drain
        their own requests, which need this host until they stop."""
        if not self.frontends:
            return
        self._gone.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._gone.wait(), timeout_s)

    async def close(self) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
            await asyncio.gather(self._ticker, return_exceptions=True)
        loop = self._loop
        if self._listener is not None and loop is not None:
            loop.remove_reader(self._listener.fileno())
            self._listener.close()
            self._listener = None
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
        for frontend in list(self.frontends):
            self._drop(frontend)

    def _accept(self) -> None:
        assert self._listener is not None and self._loop is not None
        while True:
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                log.warning("the model host could not accept a frontend: %s", exc)
                return
            sock.setblocking(True)  # the channel chooses per call
            for option in (socket.SO_SNDBUF, socket.SO_RCVBUF):
                sock.setsockopt(socket.SOL_SOCKET, option, SOCKET_BUFFER_BYTES)
            frontend = _Frontend(Channel(sock, trusting=True))  # a process of this server
            self.frontends.append(frontend)
            self._loop.add_reader(sock.fileno(), self._readable, frontend)

    def _drop(self, frontend: _Frontend) -> None:
        if frontend.closed:
            return
        frontend.closed = True
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.remove_reader(frontend.channel.fileno())
            loop.remove_writer(frontend.channel.fileno())
        for work, task in frontend.tasks.values():
            work.cancelled = True
            task.cancel()
        frontend.tasks.clear()
        frontend.channel.close()
        if frontend in self.frontends:
            self.frontends.remove(frontend)
        if frontend.index >= 0:
            log.info("worker %d unlinked from the model host", frontend.index)
        if not self.frontends:
            self._gone.set()
        self._wake()

    # ------------------------------------------------------------------ messages

    def _readable(self, frontend: _Frontend) -> None:
        channel = frontend.channel
        while not frontend.closed:
            try:
                message = channel.recv(block=False)
            except EOFError:
                self._drop(frontend)
                return
            except Exception:
                log.exception("a message from worker %d", frontend.index)
                self._drop(frontend)
                return
            if message is None:
                return
            kind, payload = message
            if kind == "calls":
                for item in payload:
                    if item[0] == "r":
                        self._run(frontend, item)
                    else:
                        self._cancel(frontend, item[1])
            elif kind == "ack":
                frontend.acked = int(payload)
                self._wake()
            elif kind == "hello":
                if self.open:  # what the others have not seen yet goes to them first
                    self._publish(only_changes=True)
                frontend.index = int(payload)
                log.info("worker %d linked to the model host", frontend.index)
                if self.open:
                    docs = self.fingerprints.everything(self.registry, self.serials)
                    self._seq += 1
                    self._send_table(frontend, docs, [], True)
            if not channel.waiting():
                return

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def _run(self, frontend: _Frontend, item: tuple[Any, ...]) -> None:
        call_id, name, number, rows, outputs, request_id, parameters, signature = item[1:9]
        inputs, stream, requests = item[9], item[10], item[11]
        frontend.running += 1
        self.arrivals += 1
        version = self.registry.ready_version(name, number)
        if version is None:
            # Retired since the frontend routed it (a swap): the record that says so goes out
            # before the answer, which names that table, so that the frontend applies it and
            # then routes the request again (``HostLink.run``).
            self._publish(only_changes=True, names=(name,))
            error = _missing(self.registry, name, number)
            self._answer(frontend, call_id, error, Timings(), frontend.table)
            return
        try:
            tensors = decode_tensors(frontend.channel, inputs)
        except Exception as exc:
            error = InternalError(f"a request for model '{name}' could not be read: {exc}")
            self._answer(frontend, call_id, error, Timings())
            return
        if frontend.channel.large_releases():
            self._send(frontend, "release", None)
        work = Work(tensors, rows, tuple(outputs), request_id, parameters)
        work.requests = requests  # several, when a frontend joined them (workers.rows)
        if signature:
            work.signature = signature
        if stream:
            work.responses = lambda result, final: self._part(frontend, call_id, result, final)
        del tensors, inputs, item
        key = None
        cache = version.cache
        if cache is not None and not stream:  # the server's one response cache is here
            started = time.perf_counter_ns()
            key = version.cache_key(work.inputs, work.outputs, work.signature)
            hit = cache.get(key)
            stats = version.stats
            (stats.cache_miss if hit is None else stats.cache_hit).add(
                time.perf_counter_ns() - started
            )
            if hit is not None:
                if self.uses is not None:
                    self.uses.hold(name, requests)
                    self.uses.release(name, requests)
                self._answer(frontend, call_id, hit, Timings())
                return
        task = run_eagerly(self._execute(frontend, call_id, version, work, key))
        if task is not None:
            frontend.tasks[call_id] = (work, task)

    async def _execute(
        self,
        frontend: _Frontend,
        call_id: int,
        version: ModelVersion,
        work: Work,
        key: bytes | None,
    ) -> None:
        timings = Timings()
        result: Result
        uses, requests = self.uses, work.requests
        if uses is not None:
            uses.hold(version.name, requests)
        try:
            result = await version.scheduler.run(work, timings)
            if key is not None and version.cache is not None:
                spec = version.signature_spec(work.signature) if work.signature else version.spec
                result = shape_outputs(spec, result, work.rows)
                version.cache.put(key, result)
        except InferdError as exc:
            result = exc
        except asyncio.CancelledError:
            frontend.tasks.pop(call_id, None)
            frontend.running -= 1
            return  # the frontend's caller left: nobody reads an answer
        except Exception as exc:
            log.exception("a forwarded request failed")
            result = InternalError(f"the request failed on the model host: {exc}")
        finally:
            if uses is not None:
                uses.release(version.name, requests)
        frontend.tasks.pop(call_id, None)
        del work
        self._answer(frontend, call_id, result, timings)

    def _cancel(self, frontend: _Frontend, call_id: int) -> None:
        found = frontend.tasks.pop(call_id, None)
        if found is not None:
            work, task = found
            work.cancelled = True  # an instance that has it skips it
            task.cancel()

    def _answer(
        self, frontend: _Frontend, call_id: int, result: Result, timings: Timings, table: int = 0
    ) -> None:
        """``table``: the request's version was retired, as that table (sent before) says."""
        frontend.running -= 1
        if frontend.closed:
            return
        times = (timings.queue_start_ns, timings.compute_start_ns, timings.compute_end_ns)
        encoded = self._encode(frontend, result)
        self._queue(
            frontend,
            ("m", call_id, encoded, times, table) if table else ("d", call_id, encoded, times),
        )

    def _part(self, frontend: _Frontend, call_id: int, result: Result, final: bool) -> None:
        """One response of a decoupled model, as the model sends it."""
        if not frontend.closed:
            self._queue(frontend, ("p", call_id, self._encode(frontend, result), final))

    def _encode(self, frontend: _Frontend, result: Result) -> tuple[Any, ...]:
        encoder = frontend.encoder
        if encoder is None:
            encoder = frontend.encoder = Encoder(frontend.channel)
        try:
            return encode_result(encoder, result)
        except Exception as exc:
            return encode_result(encoder, InternalError(f"an answer could not be sent: {exc}"))

    def _queue(self, frontend: _Frontend, item: tuple[Any, ...]) -> None:
        frontend.outbox.append(item)
        if not frontend.flush_armed:
            frontend.flush_armed = True
            assert self._loop is not None
            self._loop.call_soon(self._flush, frontend)

    def _flush(self, frontend: _Frontend) -> None:
        frontend.flush_armed = False
        frontend.encoder = None
        items, frontend.outbox = frontend.outbox, []
        if items and not frontend.closed:
            self._send(frontend, "answers", items)
        channel = frontend.channel
        if (
            not frontend.running
            and not frontend.idle_armed
            and not frontend.closed
            and channel.mapped.outstanding
        ):
            frontend.idle_armed = True
            assert self._loop is not None
            self._loop.call_later(IDLE_FLUSH_S, self._flush_idle, frontend)

    def _flush_idle(self, frontend: _Frontend) -> None:
        """Hand an idle frontend back the request blocks the models no longer need."""
        frontend.idle_armed = False
        if not frontend.closed and not frontend.running and frontend.channel.mapped.released:
            self._send(frontend, "release", None)

    def _send(self, frontend: _Frontend, kind: str, payload: Any) -> None:
        channel = frontend.channel
        try:
            if not channel.send_nowait(kind, payload):
                assert self._loop is not None
                self._loop.add_writer(channel.fileno(), self._writable, frontend)
        except OSError:
            pass  # gone: its reader sees the end

    def _writable(self, frontend: _Frontend) -> None:
        try:
            done = frontend.channel.flush()
        except OSError:
            done = True
        if done and self._loop is not None and not frontend.closed:
            self._loop.remove_writer(frontend.channel.fileno())

    # ------------------------------------------------------------------ the table

    def _status_payload(self) -> tuple[Any, ...]:
        return (status_doc(self.status()), self.models_ready(), self.extra())

    def _send_table(
        self, frontend: _Frontend, docs: list[dict[str, Any]], gone: list[str], full: bool
    ) -> None:
        frontend.table = self._seq
        self._send(frontend, "table", (self._seq, full, docs, gone, self._status_payload()))

    def activity(self) -> tuple[int, int]:
        """Forwarded requests in flight, and how many have arrived (for a drain)."""
        return sum(f.running for f in self.frontends), self.arrivals

    def _publish(self, only_changes: bool = False, names: tuple[str, ...] | None = None) -> int:
        """Send the records that changed (of ``names``, or all) to every frontend; the table's
        number (0: nothing changed, and ``only_changes`` asked not to send an empty table)."""
        docs, gone = self.fingerprints.changes(self.registry, self.serials, names)
        if only_changes and not docs and not gone:
            return 0
        self._seq += 1
        for frontend in self.frontends:
            if frontend.index >= 0:
                self._send_table(frontend, docs, gone, False)
        return self._seq

    def publish(self) -> int:
        """Send every frontend what changed now (an empty table if nothing did, so that every
        frontend gets this number): the table's number, for ``HostLink.caught_up``."""
        return self._publish() if self.open else 0

    async def sync(self) -> None:
        """Publish what changed and wait until every frontend has applied it (a repository
        change answers once every worker serves it)."""
        if not self.open:
            return
        seq = self._publish()
        deadline = time.monotonic() + SYNC_TIMEOUT_S

        def applied() -> bool:
            return all(f.acked >= seq for f in self.frontends if f.index >= 0)

        assert self._loop is not None
        while not applied():
            left = deadline - time.monotonic()
            if left <= 0:
                late = [f.index for f in self.frontends if f.index >= 0 and f.acked < seq]
                log.warning("worker(s) %s did not apply a model change in time", late)
                return
            waiter = self._loop.create_future()
            self._waiters.append(waiter)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(waiter, left)

    async def _tick(self) -> None:
        last_status = 0.0
        while True:
            await asyncio.sleep(TICK_S)
            try:
                now = time.monotonic()
                if self._publish(only_changes=True):
                    last_status = now
                elif now - last_status >= STATUS_S:
                    payload = self._status_payload()
                    for frontend in self.frontends:
                        if frontend.index >= 0:
                            self._send(frontend, "status", payload)
                    last_status = now
                for frontend in self.frontends:  # a burst is over: what it took goes back
                    frontend.channel.arenas.trim()
                self._after_bursts()
            except Exception:
                log.exception("keeping the frontends' model table current")


def _missing(registry: Registry, name: str, number: int) -> InferdError:
    try:
        record = registry.record(name)
    except NotFound as exc:
        return exc
    status = record.status.get(number)
    if status is None:
        return NotFound(unknown_model(name, number))
    why = f": {status.reason}" if status.reason else ""
    return Unavailable(f"version {number} of model '{name}' is {status.state.value}{why}")
