"""The model process: builds its executor from a recipe and runs the batches the server sends.

One thread, one loop. A ``job`` (or each of ``jobs``, several sent in one message) is queued
and run when the one before it is done; a ``cancel`` marks a job not started yet, which is then
answered CANCELLED unrun; ``close`` lets the queue finish, closes the executor (a Python model's
``finalize``) and answers ``closed``. Outputs are copied into this end's arenas, inputs are read
in place from the server's.

A model calls another model through ``ModelProcess.call``: the request goes to the server,
which runs it through that model's own scheduler, and the model process waits for the answer,
queueing jobs that arrive meanwhile. From an ``async def execute`` the call is awaited
(``ModelProcess.call_async``) on the model's event loop, which reads the connection while it
waits, so several calls can be in flight at once.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import signal
import socket
import sys
import time
import traceback
import weakref
from collections import deque
from collections.abc import Sequence
from typing import Any

from inferd.backends.process import ProcessRecipe, attach
from inferd.backends.work import Executor, InstanceFailed, Result, as_error
from inferd.core.errors import InferdError, InternalError
from inferd.core.types import Parameters, Tensors
from inferd.scheduling.channel import Channel
from inferd.scheduling.wire import (
    Encoder,
    decode_result,
    decode_works,
    encode_error,
    encode_executed,
    encode_result,
)

log = logging.getLogger("inferd.model_process")

EXIT_BROKEN = 3  # the executor broke: the server starts a fresh worker


class ModelProcess:
    """This model process's side of its connection: the job queue and calls to other models
    (what ``inferd.backends.process.current`` gives the model's code)."""

    def __init__(self, channel: Channel, label: str) -> None:
        self.channel = channel
        self.label = label
        self._queue: deque[tuple[int, Any]] = deque()
        self.handovers = 0  # messages that brought jobs (one may bring several)
        self._cancelled: set[int] = set()
        self._running: int | None = None
        self._closing = False
        self._call_ids = itertools.count(1)
        self._answers: dict[int, Result] = {}
        self._waiters: dict[int, asyncio.Future[Result]] = {}
        self._loops: weakref.WeakSet[asyncio.AbstractEventLoop] = weakref.WeakSet()

    # ------------------------------------------------------------------ messages

    def _handle(self, kind: str, payload: Any) -> None:
        if kind == "job":
            self._queue.append(payload)
            self.handovers += 1
        elif kind == "jobs":  # several handed over at once, in order
            self._queue.extend(payload)
            self.handovers += 1
        elif kind == "cancel":
            self._cancelled.add(payload)
        elif kind == "called":
            call_id, encoded = payload
            result = decode_result(self.channel, encoded)
            waiter = self._waiters.pop(call_id, None)
            if waiter is None:
                self._answers[call_id] = result
            elif not waiter.done():
                waiter.set_result(result)
        elif kind == "close":
            self._closing = True
        # "release" carries only releases, which the channel has applied

    def _drain(self) -> None:
        """Handle every message already waiting, without blocking."""
        while self.channel.waiting():  # cheaper than a receive that fails
            message = self.channel.recv(block=False)
            if message is None:
                return
            self._handle(*message)

    def _pump(self) -> None:  # an event loop's reader callback
        try:
            self._drain()
        except EOFError:
            os._exit(0)  # the server is gone

    # ------------------------------------------------------------------ serving

    def serve(self, executor: Executor) -> int:
        """Run jobs until the server says close (or is gone); the process's exit code."""
        channel = self.channel
        while True:
            try:
                if not self._queue:
                    if self._closing:
                        break
                    message = channel.recv()
                    assert message is not None
                    self._handle(*message)
                    continue
                self._drain()  # a cancel for the next job may be waiting
            except EOFError:
                return 0  # the server is gone: nobody is waiting for anything
            job_id, works = self._queue.popleft()
            if job_id in self._cancelled:
                self._cancelled.discard(job_id)
                channel.send("done", (job_id, "cancelled", len(works)))
                continue
            code = self._run(executor, job_id, works)
            if code:
                return code
        error = None
        try:
            executor.close()
        except BaseException as exc:
            traceback.print_exc()
            error = f"{type(exc).__name__}: {exc}"
        channel.send("closed", error)
        return 0

    def _run(self, executor: Executor, job_id: int, works: Any) -> int:
        channel = self.channel
        self._running = job_id
        try:
            # An executor that hands its requests writable bodies (TorchServe's bytearrays)
            # gets its BYTES elements as such, copied once out of shared memory.
            element = bytearray if getattr(executor, "writable_bytes", False) else bytes
            batch = decode_works(channel, works, element)
            if channel.large_releases():
                channel.send("release")
            executed = executor.execute(batch)
        except BaseException as exc:  # the instance is broken: fail this job, start afresh
            error = exc if isinstance(exc, InstanceFailed) else as_error(self.label, exc)
            if not isinstance(exc, InferdError):
                traceback.print_exc()
            channel.send("done", (job_id, "raise", encode_error(error)))
            return EXIT_BROKEN
        finally:
            self._running = None
            self._cancelled.discard(job_id)
        started = time.perf_counter_ns()  # the copy into shared memory counts as output time
        encoded = encode_executed(channel, executed)
        copied_ns = time.perf_counter_ns() - started
        del batch, executed  # the inputs' blocks go back with this answer
        results, input_ns, infer_ns, output_ns = encoded
        channel.send("done", (job_id, "ok", (results, input_ns, infer_ns, output_ns + copied_ns)))
        return 0

    def send_response(self, index: int, result: Result, final: bool) -> None:
        """One response of request ``index`` of the job running now (decoupled models), sent
        to the server at once; call it from the model process's main thread only."""
        if self._running is None:
            raise RuntimeError("responses can only be sent while a job runs")
        encoded = encode_result(Encoder(self.channel), result)
        self.channel.send("response", (self._running, index, encoded, final))

    def send_metrics(self, model: str, records: list[Any]) -> None:
        """Metrics the model's own code recorded (a TorchServe handler's ``context.metrics``),
        for the server's ``/metrics``: (name, type, unit, labels, value, count) records."""
        self.channel.send("metrics", (model, records))

    def is_cancelled(self) -> bool:
        """Whether the server cancelled the job running now (its caller left)."""
        try:
            self._drain()
        except EOFError:
            return True
        return self._running is not None and self._running in self._cancelled

    # ------------------------------------------------------------------ calls to other models

    def _send_call(
        self,
        model: str,
        version: str,
        inputs: Tensors,
        outputs: Sequence[str] | None,
        request_id: str,
        parameters: Parameters,
    ) -> int:
        call_id = next(self._call_ids)
        encoded = Encoder(self.channel).tensors(inputs)
        request = (call_id, model, version, request_id, outputs, parameters, encoded)
        self.channel.send("call", request)
        return call_id

    def call(
        self,
        model: str,
        version: str,
        inputs: Tensors,
        outputs: Sequence[str] | None = None,
        request_id: str = "",
        parameters: Parameters | None = None,
    ) -> Result:
        """Infer with another model of the server, through its scheduler; waits."""
        call_id = self._send_call(model, version, inputs, outputs, request_id, parameters or {})
        while call_id not in self._answers:
            try:
                message = self.channel.recv()
            except EOFError:
                return InternalError("the server went away during a call to another model")
            assert message is not None
            self._handle(*message)
        return self._answers.pop(call_id)

    async def call_async(
        self,
        model: str,
        version: str,
        inputs: Tensors,
        outputs: Sequence[str] | None = None,
        request_id: str = "",
        parameters: Parameters | None = None,
    ) -> Result:
        """``call`` from a coroutine: other coroutines run (and call) while it waits."""
        loop = asyncio.get_running_loop()
        if loop not in self._loops:
            loop.add_reader(self.channel.fileno(), self._pump)
            self._loops.add(loop)
        future: asyncio.Future[Result] = loop.create_future()
        call_id = self._send_call(model, version, inputs, outputs, request_id, parameters or {})
        self._waiters[call_id] = future
        self._pump()  # the answer may be in already
        return await future


def _failure(exc: BaseException) -> str:
    if isinstance(exc, InferdError):
        return exc.message
    return f"{type(exc).__name__}: {exc}"


def main() -> None:
    """The model process's entry point (``spawn.BOOT`` calls it): the connection is an inherited
    descriptor named by ``INFERD_WORKER_FD``; the first message is the recipe."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the server stops its workers in order
    fd = int(os.environ.pop("INFERD_WORKER_FD"))
    channel = Channel(socket.socket(fileno=fd), trusting=True)
    try:
        message = channel.recv()
    except EOFError:
        return
    assert message is not None and message[0] == "start"
    factory, args, label, index = message[1]
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format=f"%(asctime)s %(levelname)s [{label} instance {index} pid {os.getpid()}] "
        "%(name)s: %(message)s",
    )
    side = ModelProcess(channel, label)
    attach(side)
    try:
        executor = ProcessRecipe(factory, tuple(args)).build()
    except BaseException as exc:
        if not isinstance(exc, InferdError):
            traceback.print_exc()
        channel.send("failed", _failure(exc))
        _exit(1)
    channel.send("ready", os.getpid())
    _exit(side.serve(executor))


def _exit(code: int) -> None:
    """Leave now: a model's stray non-daemon threads must not keep the model process alive."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
