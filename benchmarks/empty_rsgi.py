"""The floor under inferd's HTTP path: an RSGI handler that reads the body and answers a
constant, on granian embedded in a uvloop event loop with inferd's own server options (one
runtime thread, HTTP/1.1 only, keep-alive). ``core_bench.py`` measures it beside inferd so the
JSON path's CPU per request can be given as a multiple of this floor on the same host.

``--minimal MODEL.onnx`` adds the work no v2 JSON server can skip, and nothing else: parse the
body (orjson), make the first input's array (numpy), run the model on the event loop thread
(onnxruntime, one intra-op thread, as inferd runs half_plus_two inline), write the first output
as v2 JSON. No validation, routing, statistics, logging or error handling: a lower bound on any
server answering that request in Python on this stack, not a server.

``--busy LOOPS --processes N`` is the same floor for a Python model served by worker
processes (issue 13's CPU-bound model): parse the body, send the input array (pickled) over a
Unix socket to the least busy of N forked workers, which run the busy model's loop LOOPS times
and send the array back, then write it as v2 JSON. No queue, batching, validation, statistics
or restarts: the 1 -> 2 process scaling no server of Python models can beat on this host.

    .venv/bin/python benchmarks/empty_rsgi.py PORT [--minimal MODEL.onnx | --busy LOOPS
        [--processes N]]
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


def _busy_worker(sock: socket.socket, loops: int) -> None:
    """A worker process: receive an array, run the busy loop, send the array back."""
    while True:
        message = sock.recv(1 << 16)
        if not message:
            return
        array = pickle.loads(message)
        total = 0
        for i in range(loops):  # the busy model's loop (python_models.py BUSY)
            total += i
        sock.send(pickle.dumps(array))  # the identity's answer


class BusyApp:
    """The irreducible work of serving a CPU-bound Python model from worker processes."""

    def __init__(self, loops: int, processes: int) -> None:
        self.sockets: list[socket.socket] = []
        self.pending: list[deque[asyncio.Future[bytes]]] = []
        self.watched = False
        context = multiprocessing.get_context("fork")  # before the loop and granian's threads
        for _ in range(processes):
            mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            context.Process(target=_busy_worker, args=(theirs, loops), daemon=True).start()
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
            future = pending.popleft()
            if not future.done():  # not cancelled by a client that hung up
                future.set_result(message)

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
        future: asyncio.Future[bytes] = loop.create_future()
        self.pending[index].append(future)
        self.sockets[index].send(pickle.dumps(array))
        result = pickle.loads(await future)
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
    args = parser.parse_args()
    app: Any = EmptyApp()
    if args.minimal:
        app = MinimalApp(args.minimal)
    elif args.busy:
        app = BusyApp(args.busy, args.processes)
    uvloop.run(serve(args.port, app))


if __name__ == "__main__":
    main()
