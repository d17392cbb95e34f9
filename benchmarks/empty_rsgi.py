"""The floor under inferd's HTTP path: an RSGI handler that reads the body and answers a
constant, on granian embedded in a uvloop event loop with inferd's own server options (one
runtime thread, HTTP/1.1 only, keep-alive). ``core_bench.py`` measures it beside inferd so the
JSON path's CPU per request can be given as a multiple of this floor on the same host.

``--minimal MODEL.onnx`` adds the work no v2 JSON server can skip, and nothing else: parse the
body (orjson), make the first input's array (numpy), run the model on the event loop thread
(onnxruntime's C session, as inferd runs half_plus_two inline), write the first output
as v2 JSON. No validation, routing, statistics, logging or error handling: a lower bound on any
server answering that request in Python on this stack, not a server.

``--busy LOOPS --processes N`` is the same floor for a Python model served by worker
processes (python_models.py's CPU-bound model): parse the body, send the input array
(pickled) over a Unix socket to the least busy of N forked workers, which run the busy model's
loop LOOPS times and send the array back, then write it as v2 JSON. No queue, batching,
validation, statistics or restarts: the 1 -> 2 process scaling of a server that costs
nothing beyond that.
With ``--minimal MODEL.onnx --calls K`` each worker also calls MODEL K times per request (BLS):
it sends a ``[1, 1]`` FP32 array to the server, which runs MODEL on the event loop and sends
the output back, so the latency each nested call adds has the same floor.

``--batch MODEL.onnx [--rows 64] [--delay-ms 50]`` is the floor under dynamic batching: each
v2 binary request (one input, Inference-Header-Content-Length) is parsed and queued; ``rows``
queued requests, or the delay after the first, send one batch to MODEL (onnxruntime with
its default threads, spinning off, as the in-process reference runs) on a worker thread, one
batch at a time, and each request gets its rows back as binary output.

    .venv/bin/python benchmarks/empty_rsgi.py PORT [--minimal MODEL.onnx] [--busy LOOPS
        [--processes N] [--calls K]] [--batch MODEL.onnx [--rows N] [--delay-ms MS]]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import pickle
import signal
import socket
from collections import deque
from typing import Any

import numpy as np
import orjson
import uvloop
from granian.constants import HTTPModes, Interfaces
from granian.http import HTTP1Settings
from granian.server.embed import Server

ANSWER = b'{"model_name":"empty","outputs":[]}'
HEADERS = [("content-type", "application/json")]


class EmptyApp:
    async def __rsgi__(self, scope: Any, protocol: Any) -> None:
        if scope.proto != "http":
            return
        await protocol()  # the body, read as any handler must
        protocol.response_bytes(200, HEADERS, ANSWER)


class MinimalApp:
    """The irreducible work of a v2 JSON inference on a one-input, one-output model."""

    def __init__(self, model: str) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        session = ort.InferenceSession(model, sess_options=options)
        self.input = session.get_inputs()[0].name
        self.output = session.get_outputs()[0].name
        self.run = session._sess.run  # the C session, as inferd calls it on the CPU provider

    async def __rsgi__(self, scope: Any, protocol: Any) -> None:
        if scope.proto != "http":
            return
        request = orjson.loads(await protocol())
        tensor = request["inputs"][0]
        array = np.asarray(tensor["data"], dtype=np.float32).reshape(tensor["shape"])
        (result,) = self.run([self.output], {tensor["name"]: array.reshape(-1)}, None)
        answer = {
            "model_name": "minimal",
            "outputs": [
                {
                    "name": self.output,
                    "datatype": "FP32",
                    "shape": list(array.shape),
                    "data": result.tolist(),
                }
            ],
        }
        protocol.response_bytes(200, HEADERS, orjson.dumps(answer))


def _busy_worker(sock: socket.socket, loops: int, calls: int) -> None:
    """A worker process: receive an array, run the busy loop, call the server's model
    ``calls`` times, send the array back."""
    one = np.ones((1, 1), np.float32)
    while True:
        message = sock.recv(1 << 16)
        if not message:
            return
        array = pickle.loads(message)
        total = 0
        for i in range(loops):  # the busy model's loop (python_models.py BUSY)
            total += i
        for _ in range(calls):  # the caller model's nested calls (python_models.py CALLER)
            sock.send(pickle.dumps(("call", one)))
            pickle.loads(sock.recv(1 << 16))
        sock.send(pickle.dumps(("done", array)))  # the identity's answer


class BusyApp:
    """The irreducible work of serving a CPU-bound Python model from worker processes."""

    def __init__(
        self, loops: int, processes: int, calls: int = 0, model: MinimalApp | None = None
    ) -> None:
        self.model = model
        self.sockets: list[socket.socket] = []
        self.pending: list[deque[asyncio.Future[np.ndarray]]] = []
        self.watched = False
        context = multiprocessing.get_context("fork")  # before the loop and granian's threads
        for _ in range(processes):
            mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            worker = context.Process(target=_busy_worker, args=(theirs, loops, calls), daemon=True)
            worker.start()
            theirs.close()
            mine.setblocking(False)
            self.sockets.append(mine)
            self.pending.append(deque())

    def _readable(self, index: int) -> None:
        sock, pending = self.sockets[index], self.pending[index]
        while True:
            try:
                message = sock.recv(1 << 16)
            except BlockingIOError:
                return
            if not message:
                os._exit(1)  # a worker died: this floor has no restarts
            kind, array = pickle.loads(message)
            if kind == "call" and self.model is not None:
                model = self.model
                (result,) = model.run([model.output], {model.input: array.reshape(-1)}, None)
                sock.send(pickle.dumps(("called", result)))
                continue
            future = pending.popleft()
            if not future.done():  # not cancelled by a client that hung up
                future.set_result(array)

    async def __rsgi__(self, scope: Any, protocol: Any) -> None:
        if scope.proto != "http":
            return
        loop = asyncio.get_running_loop()
        if not self.watched:
            for index, sock in enumerate(self.sockets):
                loop.add_reader(sock.fileno(), self._readable, index)
            self.watched = True
        request = orjson.loads(await protocol())
        tensor = request["inputs"][0]
        array = np.asarray(tensor["data"], dtype=np.float32).reshape(tensor["shape"])
        index = min(range(len(self.pending)), key=lambda i: len(self.pending[i]))
        future: asyncio.Future[np.ndarray] = loop.create_future()
        self.pending[index].append(future)
        self.sockets[index].send(pickle.dumps(array))
        result = await future
        answer = {
            "model_name": "busy",
            "outputs": [
                {
                    "name": "OUTPUT0",
                    "datatype": "FP32",
                    "shape": list(result.shape),
                    "data": result.ravel().tolist(),
                }
            ],
        }
        protocol.response_bytes(200, HEADERS, orjson.dumps(answer))


class BatchApp:
    """The irreducible work of serving one-input rows through a dynamic batcher."""

    def __init__(self, model: str, rows: int, delay_s: float) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        session = ort.InferenceSession(model, options)
        self.input = session.get_inputs()[0].name
        self.output = session.get_outputs()[0].name
        self.run = session._sess.run
        self.rows, self.delay_s = rows, delay_s
        self.queue: list[tuple[np.ndarray, asyncio.Future[np.ndarray]]] = []
        self.running = False
        self.timer: asyncio.TimerHandle | None = None
        self.tasks: set[asyncio.Task[None]] = set()

    def _maybe_ship(self) -> None:
        if self.running or not self.queue:
            return
        if len(self.queue) < self.rows and self.timer is not None:
            return  # the timer ships a partial batch
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        batch, self.queue = self.queue[: self.rows], self.queue[self.rows :]
        self.running = True
        task = asyncio.get_running_loop().create_task(self._execute(batch))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def _expire(self) -> None:
        self.timer = None
        self._maybe_ship()

    async def _execute(self, batch: list[tuple[np.ndarray, asyncio.Future[np.ndarray]]]) -> None:
        stacked = np.concatenate([array for array, _ in batch])
        try:
            feeds = {self.input: stacked}
            (result,) = await asyncio.to_thread(self.run, [self.output], feeds, None)
            start = 0
            for array, future in batch:
                stop = start + len(array)
                if not future.done():
                    future.set_result(result[start:stop])
                start = stop
        except Exception as exc:
            for _, future in batch:
                if not future.done():
                    future.set_exception(exc)
        finally:
            self.running = False
        if self.queue and len(self.queue) < self.rows:
            self.timer = asyncio.get_running_loop().call_later(self.delay_s, self._expire)
        self._maybe_ship()

    async def __rsgi__(self, scope: Any, protocol: Any) -> None:
        if scope.proto != "http":
            return
        body = await protocol()
        split = int(scope.headers.get("inference-header-content-length"))
        header = orjson.loads(body[:split])
        tensor = header["inputs"][0]
        array = np.frombuffer(body, np.float32, offset=split).reshape(tensor["shape"])
        loop = asyncio.get_running_loop()
        future: asyncio.Future[np.ndarray] = loop.create_future()
        self.queue.append((array, future))
        if len(self.queue) == 1 and not self.running:
            self.timer = loop.call_later(self.delay_s, self._expire)
        self._maybe_ship()
        result = await future
        raw = result.tobytes()
        out = {
            "model_name": "batch",
            "outputs": [
                {
                    "name": self.output,
                    "datatype": "FP32",
                    "shape": list(result.shape),
                    "parameters": {"binary_data_size": len(raw)},
                }
            ],
        }
        head = orjson.dumps(out)
        headers = [
            ("content-type", "application/octet-stream"),
            ("inference-header-content-length", str(len(head))),
        ]
        protocol.response_bytes(200, headers, head + raw)


async def serve(port: int, app: Any) -> None:
    server = Server(
        app,
        address="127.0.0.1",
        port=port,
        interface=Interfaces.RSGI,
        runtime_threads=1,
        backlog=2048,
        log_enabled=False,
        http=HTTPModes.http1,
        http1_settings=HTTP1Settings(keep_alive=True),
    )
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, server.stop)
    loop.add_signal_handler(signal.SIGINT, server.stop)
    await server.serve()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("port", type=int)
    parser.add_argument("--minimal", metavar="MODEL.onnx", help="do the irreducible work")
    parser.add_argument("--busy", type=int, metavar="LOOPS", help="a busy Python model's floor")
    parser.add_argument("--processes", type=int, default=1, help="--busy worker processes")
    parser.add_argument("--calls", type=int, default=0, help="--busy: nested calls per request")
    parser.add_argument("--batch", metavar="MODEL.onnx", help="a dynamic batcher's floor")
    parser.add_argument("--rows", type=int, default=64, help="--batch: requests per batch")
    parser.add_argument("--delay-ms", type=float, default=50.0, help="--batch: queue delay")
    args = parser.parse_args()
    if args.calls and not (args.minimal and args.busy is not None):
        parser.error("--calls needs --busy and --minimal (the model the calls run)")
    model = MinimalApp(args.minimal) if args.minimal else None
    app: Any
    if args.batch:
        app = BatchApp(args.batch, args.rows, args.delay_ms / 1e3)
    elif args.busy is not None:
        app = BusyApp(args.busy, args.processes, args.calls, model)
    else:
        app = model or EmptyApp()
    uvloop.run(serve(args.port, app))


if __name__ == "__main__":
    main()
