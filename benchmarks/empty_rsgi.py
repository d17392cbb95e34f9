"""The floor under inferd's HTTP path: an RSGI handler that reads the body and answers a
constant, on granian embedded in a uvloop event loop with inferd's own server options (one
runtime thread, HTTP/1.1 only, keep-alive). ``core_bench.py`` measures it beside inferd so the
JSON path's CPU per request can be given as a multiple of this floor on the same host.

``--minimal MODEL.onnx`` adds the work no v2 JSON server can skip, and nothing else: parse the
body (orjson), make the first input's array (numpy), run the model on the event loop thread
(onnxruntime, one intra-op thread, as inferd runs half_plus_two inline), write the first output
as v2 JSON. No validation, routing, statistics, logging or error handling: a lower bound on any
server answering that request in Python on this stack, not a server.

    .venv/bin/python benchmarks/empty_rsgi.py PORT [--minimal MODEL.onnx]
"""

from __future__ import annotations

import argparse
import asyncio
import signal
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
    args = parser.parse_args()
    app = MinimalApp(args.minimal) if args.minimal else EmptyApp()
    uvloop.run(serve(args.port, app))


if __name__ == "__main__":
    main()
