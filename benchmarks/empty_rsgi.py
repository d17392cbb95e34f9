"""The floor under inferd's HTTP path: an RSGI handler that reads the body and answers a
constant, on granian embedded in a uvloop event loop with inferd's own server options (one
runtime thread, HTTP/1.1 only, keep-alive). ``core_bench.py`` measures it beside inferd so the
JSON path's CPU per request can be given as a multiple of this floor on the same host.

    .venv/bin/python benchmarks/empty_rsgi.py PORT
"""

from __future__ import annotations

import asyncio
import signal
import sys
from typing import Any

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


async def serve(port: int) -> None:
    server = Server(
        EmptyApp(),
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


if __name__ == "__main__":
    uvloop.run(serve(int(sys.argv[1])))
