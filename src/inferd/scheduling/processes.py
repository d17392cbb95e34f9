"""Process instances: each execution instance of a model version is a model process.

The second implementation of ``Instances`` (``scheduling.instances``): same addressing
(``instance=i``, else the least busy), same cancellation (work whose caller left while it was
queued is not run), same restart on failure. Python models always run here (their code can
never block the event loop or hold the server's GIL); any backend can, with the config
parameter ``process_instances``.

A worker is started from a ``ProcessRecipe`` and builds its model itself; tensors cross in
shared memory (``scheduling.shm``), messages over a Unix socket (``scheduling.channel``). The
event loop reads every worker's socket itself (``add_reader``): no thread hop per answer. Each
worker holds at most ``DEPTH`` jobs (one running, the next ones queued in the worker, so it never
idles between them), the rest wait here, where a cancelled one is simply dropped. Jobs are handed
over ahead of the one running and several at a time: a worker that holds ``REFILL_AT`` jobs or
fewer gets as many as it has room for in one message, so a busy worker receives one message per
few jobs, not one per job.

A worker that dies (an exception escaping the executor, a segfault, ``os._exit``, SIGKILL, the
OOM killer) fails only the jobs it held, each with an ``InstanceFailed`` that names the model
and how the process ended; a fresh worker is started at once, and the jobs queued for it run
there. A worker that cannot start again is retried with a back-off. A model may call other
models of the server (``call`` messages), through their own schedulers.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import itertools
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

from inferd.backends.process import ProcessRecipe
from inferd.backends.spawn import ProcessHandle, describe_exit
from inferd.backends.work import CANCELLED, Executed, InstanceFailed, Work, give_up_inputs, live
from inferd.core.errors import InferdError, InternalError, Unavailable
from inferd.core.types import ModelCaller
from inferd.scheduling import process_slots as slots
from inferd.scheduling.channel import Channel
from inferd.scheduling.launch import launch, reap, stop_model_process
from inferd.scheduling.model_calls import ModelCalls
from inferd.scheduling.process_slots import Slot as _ModelProcess
from inferd.scheduling.wire import (
    decode_error,
    decode_executed,
    decode_result,
    encode_works,
    works_bytes,
)

log = logging.getLogger("inferd.scheduling")

DEPTH = 4  # jobs a worker holds at most: one running, the others queued in the worker
REFILL_AT = 1  # a worker holding this many jobs or fewer is sent more, together in one message
LARGE_DEPTH = 2  # a batch larger than COPY_OFF_LOOP_BYTES goes to a worker holding fewer jobs
RESTART_BACKOFF_MAX_S = 30.0
IDLE_FLUSH_S = 0.01  # a worker left idle gets the releases of its output blocks this soon
# A batch whose tensors are larger than this is copied into shared memory on a thread: copying
# a 120 MB body on the event loop held every other request of the process (``/ping`` too).
COPY_OFF_LOOP_BYTES = 4 << 20

# Receives the metrics a model's own code records: (model label, records).
MetricsSink = Callable[[str, list[Any]], None]


class ProcessInstances:
    """One model process per instance, built from ``recipes`` (one per instance)."""

    def __init__(
        self,
        name: str,
        recipes: Sequence[ProcessRecipe],
        call_model: ModelCaller | None = None,
        on_metrics: MetricsSink | None = None,
    ) -> None:
        if not recipes:
            raise ValueError("instances need at least one recipe")
        self.name = name
        self.count = len(recipes)
        self.restarts = 0
        self._calls = ModelCalls(name, call_model)
        self._on_metrics = on_metrics
        self._workers = [_ModelProcess(i, r) for i, r in enumerate(recipes)]
        self._ids = itertools.count(1)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False
        self._stopping = False  # closing, and the queues are drained
        self._drained: asyncio.Future[None] | None = None
        self._threads: list[threading.Thread] = []
        self._start_all()

    def _start_all(self) -> None:
        with concurrent.futures.ThreadPoolExecutor(self.count) as pool:
            started = [pool.submit(launch, self.name, w.index, w.recipe) for w in self._workers]
            errors: list[BaseException] = []
            for worker, future in zip(self._workers, started, strict=True):
                try:
                    worker.proc, worker.channel = future.result()
                    worker.state = slots.UP
                except BaseException as exc:
                    errors.append(exc)
        if errors:
            for worker in self._workers:
                if worker.proc is not None and worker.channel is not None:
                    stop_model_process(self.name, worker.proc, worker.channel)
            raise errors[0]

    # ------------------------------------------------------------------ submitting

    def try_inline(self, work: Work) -> Executed | None:
        return None  # a model process answers through its channel, never on the loop

    def submit(self, batch: list[Work], instance: int | None = None) -> asyncio.Future[Executed]:
        if self._closed:
            raise Unavailable(f"model '{self.name}' is unloading")
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self._attach(loop)
        if instance is None:
            worker = self._least_busy()
        elif 0 <= instance < self.count:
            worker = self._workers[instance]
            if worker.state is slots.BROKEN:
                raise InstanceFailed(worker.reason)
        else:
            raise ValueError(f"model '{self.name}' has no instance {instance}")
        job = slots.Job(next(self._ids), batch, loop.create_future())
        worker.queue.append(job)
        self._pump(worker)
        return job.future

    def _least_busy(self) -> _ModelProcess:
        workers = self._workers
        first = workers[0]
        if first.state is slots.UP and (self.count == 1 or first.load == 0):
            return first
        up = [w for w in workers if w.state is slots.UP]
        if up:
            return min(up, key=lambda w: w.load)
        coming = [w for w in workers if w.state in (slots.DOWN, slots.STARTING)]
        if coming:  # restarting: its queue runs once it is up
            return min(coming, key=lambda w: w.load)
        raise InstanceFailed(workers[0].reason or f"model '{self.name}' has no running instance")

    def _pump(self, worker: _ModelProcess) -> None:
        """Send queued jobs, in one message, once the worker holds ``REFILL_AT`` or fewer."""
        if len(worker.sent) > REFILL_AT:
            return
        channel = worker.channel
        ready: list[tuple[slots.Job, Any]] = []
        while (
            worker.state is slots.UP
            and len(worker.sent) + len(ready) < DEPTH
            and worker.queue
            and not worker.copying
        ):
            assert channel is not None and self._loop is not None
            job = worker.queue.popleft()
            if job.future.done():  # the caller left while it was queued: never run
                self._settled()
                continue
            wanted = live(job.batch)
            if wanted is not None and not wanted:
                job.future.set_result(Executed([CANCELLED] * len(job.batch)))
                self._settled()
                continue
            job.works = job.batch if wanted is None else wanted
            if works_bytes(job.works) > COPY_OFF_LOOP_BYTES:
                if len(worker.sent) + len(ready) >= LARGE_DEPTH:
                    worker.queue.appendleft(job)  # large bodies: as few held as ever
                    break
                self._send_jobs(worker, ready)  # the jobs before it go first, in order
                ready = []
                worker.copying = job  # the jobs behind it wait: they go out in order
                copy = self._loop.run_in_executor(None, encode_works, channel, job.works)
                copy.add_done_callback(functools.partial(self._copied, worker, job, channel))
                return
            try:
                payload = encode_works(channel, job.works)
            except Exception as exc:
                job.future.set_exception(InternalError(f"cannot send a batch to a worker: {exc}"))
                self._settled()
                continue
            ready.append((job, payload))
        self._send_jobs(worker, ready)

    def _copied(
        self, worker: _ModelProcess, job: slots.Job, channel: Channel, copy: asyncio.Future[Any]
    ) -> None:
        """A large batch is in shared memory: send it, then what waited behind it."""
        worker.copying = None
        error = copy.exception()
        if error is not None:
            if not job.future.done():
                job.future.set_exception(InternalError(f"cannot send a batch to a worker: {error}"))
            self._settled()
        elif worker.channel is channel and worker.state is slots.UP:
            self._send_jobs(worker, [(job, copy.result())])
        elif worker.state is slots.BROKEN or worker.state is slots.CLOSED:
            if not job.future.done():
                job.future.set_exception(
                    InstanceFailed(worker.reason or f"model '{self.name}' has no running instance")
                )
            self._settled()
        else:  # the worker died meanwhile (its blocks went with it): copied again for the next
            worker.queue.appendleft(job)
        self._pump(worker)

    def _send_jobs(self, worker: _ModelProcess, ready: list[tuple[slots.Job, Any]]) -> None:
        """Hand ``ready`` jobs over: one ``job`` message, or one ``jobs`` message for several."""
        for job, _ in ready:
            worker.sent[job.id] = job
            job.future.add_done_callback(functools.partial(self._cancel, worker, job.id))
        if len(ready) == 1:
            job, payload = ready[0]
            self._send(worker, "job", (job.id, payload))
        elif ready:
            self._send(worker, "jobs", [(job.id, payload) for job, payload in ready])
        for job, _ in ready:  # in shared memory now: a request that owns its inputs lets go
            for work in job.works:
                give_up_inputs(work)

    def _send(self, worker: _ModelProcess, kind: str, payload: Any) -> None:
        channel = worker.channel
        assert channel is not None and self._loop is not None
        try:
            if not channel.send_nowait(kind, payload):
                self._loop.add_writer(channel.fileno(), self._writable, worker)
        except OSError:
            pass  # the worker is gone: its reader sees the end and handles it

    def _writable(self, worker: _ModelProcess) -> None:
        channel = worker.channel
        assert channel is not None and self._loop is not None
        try:
            done = channel.flush()
        except OSError:
            done = True
        if done:
            self._loop.remove_writer(channel.fileno())

    def _cancel(self, worker: _ModelProcess, job_id: int, future: asyncio.Future[Executed]) -> None:
        if future.cancelled() and job_id in worker.sent and worker.state is slots.UP:
            self._send(worker, "cancel", job_id)

    # ------------------------------------------------------------------ answers

    def _attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """Read the workers' sockets on this loop (the first submit's)."""
        old, self._loop = self._loop, loop
        for worker in self._workers:
            if worker.state is slots.UP and worker.channel is not None:
                if old is not None and not old.is_closed():
                    with contextlib.suppress(Exception):
                        old.remove_reader(worker.channel.fileno())
                loop.add_reader(worker.channel.fileno(), self._readable, worker)

    def _readable(self, worker: _ModelProcess) -> None:
        channel = worker.channel
        assert channel is not None
        while worker.channel is channel:
            try:
                message = channel.recv(block=False)
            except EOFError:
                self._lost(worker)
                return
            except Exception:
                log.exception("model '%s': a message from instance %d", self.name, worker.index)
                self._lost(worker)
                return
            if message is None:
                return
            kind, payload = message
            if kind == "done":
                self._done(worker, *payload)
            elif kind == "response":
                self._response(worker, *payload)
            elif kind == "call":
                self._call(worker, payload)
            elif kind == "metrics" and self._on_metrics is not None:
                self._on_metrics(*payload)
            if not channel.waiting():  # mostly one message per wake-up: no receive that fails
                return

    def _done(self, worker: _ModelProcess, job_id: int, status: str, data: Any) -> None:
        job = worker.sent.pop(job_id, None)
        if job is None:
            return
        future = job.future
        if status == "ok":
            executed = decode_executed(worker.channel, data)  # type: ignore[arg-type]
            if job.works is not job.batch:  # some were cancelled before it was sent
                ran = {id(w) for w in job.works}
                answers = iter(executed.results)
                executed.results = [next(answers) if id(w) in ran else CANCELLED for w in job.batch]
            if not future.done():
                future.set_result(executed)
        elif status == "cancelled":
            if not future.done():
                future.set_result(Executed([CANCELLED] * len(job.batch)))
        else:  # the executor broke: the worker exits, and is restarted once it has
            worker.state = slots.DOWN
            if not future.done():
                future.set_exception(decode_error(*data))
        self._settled()
        self._pump(worker)
        channel = worker.channel
        idle = not worker.sent and not worker.flush_armed and channel is not None
        if idle and channel is not None and channel.mapped.outstanding and self._loop is not None:
            worker.flush_armed = True
            self._loop.call_later(IDLE_FLUSH_S, self._flush_idle, worker)

    def _response(
        self, worker: _ModelProcess, job_id: int, index: int, encoded: Any, final: bool
    ) -> None:
        """One response of a decoupled model's request, handed to the request's sink."""
        job = worker.sent.get(job_id)
        result = decode_result(worker.channel, encoded)  # type: ignore[arg-type]
        if job is None or not 0 <= index < len(job.works):
            return
        sink = job.works[index].responses
        if sink is not None:
            sink(result, final)

    def _flush_idle(self, worker: _ModelProcess) -> None:
        """Hand an idle worker back the output blocks its answers no longer need."""
        worker.flush_armed = False
        channel = worker.channel
        idle = worker.state is slots.UP and channel is not None and not worker.sent
        if idle and channel is not None and channel.mapped.released:
            self._send(worker, "release", None)

    def _settled(self) -> None:
        if self._drained is not None and not self._drained.done() and not self._busy():
            self._drained.set_result(None)

    def _busy(self) -> bool:
        return any(w.queue or w.sent or w.copying for w in self._workers)

    # ------------------------------------------------------------------ calls to other models

    def _call(self, worker: _ModelProcess, payload: Any) -> None:
        channel = worker.channel
        assert channel is not None

        def reply(answer: Any) -> None:
            self._send(worker, "called", answer)

        def alive() -> bool:
            return worker.channel is channel and worker.state is slots.UP

        self._calls.serve(channel, payload, reply, alive)

    # ------------------------------------------------------------------ failures and restarts

    def _call_soon(self, callback: Callable[..., None], *args: Any) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(callback, *args)

    def _lost(self, worker: _ModelProcess) -> None:
        """The worker's socket ended: it died. Reap it off the loop, then restart it."""
        proc, channel = worker.proc, worker.channel
        assert proc is not None and channel is not None and self._loop is not None
        self._loop.remove_reader(channel.fileno())
        self._loop.remove_writer(channel.fileno())
        worker.state = slots.DOWN
        worker.channel = None
        self._thread(self._reap_and_report, worker, proc, channel)

    def _thread(self, target: Callable[..., None], *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        self._threads = [t for t in self._threads if t.is_alive()]
        self._threads.append(thread)
        thread.start()

    def _reap_and_report(
        self, worker: _ModelProcess, proc: ProcessHandle, channel: Channel
    ) -> None:
        how = describe_exit(reap(proc))
        channel.close()
        self._call_soon(self._crashed, worker, proc.pid, how)

    def _crashed(self, worker: _ModelProcess, pid: int, how: str) -> None:
        self.restarts += 1
        error = InstanceFailed(
            f"model '{self.name}': the model process of instance {worker.index} (pid {pid}) "
            f"{how}; it is being restarted"
        )
        if worker.sent:
            log.error("%s; %d request batch(es) failed", error.message, len(worker.sent))
        else:
            log.warning("%s", error.message)
        for job in worker.sent.values():
            if not job.future.done():
                job.future.set_exception(error)
        worker.sent.clear()
        if self._closed:
            self._fail_queue(worker, Unavailable(f"model '{self.name}' is unloading"))
            worker.state = slots.CLOSED
            return
        self._thread(self._restart, worker)

    def _restart(self, worker: _ModelProcess) -> None:
        try:
            proc, channel = launch(self.name, worker.index, worker.recipe)
        except Exception as exc:
            reason = exc.message if isinstance(exc, InferdError) else str(exc)
            self._call_soon(self._restart_failed, worker, reason)
            return
        self._call_soon(self._restarted, worker, proc, channel)

    def _restarted(self, worker: _ModelProcess, proc: ProcessHandle, channel: Channel) -> None:
        if self._stopping:  # closing, past waiting for the queues: too late to serve
            self._thread(stop_model_process, self.name, proc, channel)
            worker.state = slots.CLOSED
            self._fail_queue(worker, Unavailable(f"model '{self.name}' is unloading"))
            return
        assert self._loop is not None
        worker.proc, worker.channel, worker.state = proc, channel, slots.UP
        worker.backoff_s = slots.RESTART_BACKOFF_FIRST_S
        self._loop.add_reader(channel.fileno(), self._readable, worker)
        log.info("model '%s': instance %d is running again", self.name, worker.index)
        self._pump(worker)

    def _restart_failed(self, worker: _ModelProcess, reason: str) -> None:
        assert self._loop is not None
        worker.state = slots.BROKEN
        worker.reason = f"model '{self.name}': instance {worker.index} cannot restart: {reason}"
        log.error("%s; retrying in %.1f s", worker.reason, worker.backoff_s)
        self._fail_queue(worker, InstanceFailed(worker.reason))
        if not self._closed:
            self._loop.call_later(worker.backoff_s, self._retry, worker)
            worker.backoff_s = min(RESTART_BACKOFF_MAX_S, worker.backoff_s * 2)

    def _retry(self, worker: _ModelProcess) -> None:
        if worker.state is slots.BROKEN and not self._closed:
            worker.state = slots.DOWN
            self._thread(self._restart, worker)

    def _fail_queue(self, worker: _ModelProcess, error: InferdError) -> None:
        while worker.queue:
            job = worker.queue.popleft()
            if not job.future.done():
                job.future.set_exception(error)
        self._settled()

    # ------------------------------------------------------------------ warmup and closing

    def run_blocking(self, instance: int, batch: list[Work]) -> Executed:
        """Execute now, from the calling thread, before the instances serve (warmup)."""
        worker = self._workers[instance]
        if worker.state is not slots.UP or worker.channel is None or worker.proc is None:
            raise InstanceFailed(f"instance {instance} of model '{self.name}' is not running")
        return slots.run_now(self.name, worker, next(self._ids), batch, self._count_restart)

    def _count_restart(self) -> None:
        self.restarts += 1

    async def close(self) -> None:
        """Let queued and running work finish, then stop the workers (``finalize`` runs)."""
        if self._closed:
            return
        self._closed = True
        loop = asyncio.get_running_loop()
        if self._loop is loop:
            if self._busy():
                self._drained = loop.create_future()
                await self._drained
            for worker in self._workers:
                if worker.state is slots.UP and worker.channel is not None:
                    loop.remove_reader(worker.channel.fileno())
                    loop.remove_writer(worker.channel.fileno())
        self._stopping = True
        await asyncio.to_thread(self._stop)

    def _stop(self) -> None:
        for thread in self._threads:
            thread.join()
        slots.stop_running(self.name, self._workers)

    def pids(self) -> list[int | None]:
        """The model process of each instance (None while one restarts)."""
        return [
            w.proc.pid if w.proc is not None and w.state is slots.UP else None
            for w in self._workers
        ]
