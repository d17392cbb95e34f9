"""A stand-in for granian, in process: what ``HttpApp.__rsgi__`` uses of RSGI's scope and
protocol objects. Benchmarks that count the server's own work (``request_opcodes.py``,
``loop_instructions.py``) call the entry point with these, so no socket and no granian code is
counted."""

from __future__ import annotations

import asyncio
import collections
from typing import Any


class Scope:
    """One POST request's scope: ``headers`` beside Host and Content-Length."""

    proto = "http"
    method = "POST"
    query_string = ""
    client = "127.0.0.1:5555"

    def __init__(self, path: str, body: bytes, headers: dict[str, str]) -> None:
        self.path = path
        self.headers = {"host": "127.0.0.1:8000", "content-length": str(len(body)), **headers}


class Protocol:
    """Hands out ``body``; counts the answers by status. ``arrives_later``: the body read waits
    one turn of the loop, as a body from granian's thread does."""

    def __init__(self, body: bytes, arrives_later: bool = False) -> None:
        self.body = body
        self.arrives_later = arrives_later
        self.answers: collections.Counter[int] = collections.Counter()

    async def __call__(self) -> bytes:
        if self.arrives_later:
            await asyncio.sleep(0)
        return self.body

    def client_disconnect(self) -> asyncio.Future[None]:
        return asyncio.get_running_loop().create_future()

    def response_bytes(self, status: int, headers: Any, body: bytes) -> None:
        self.answers[status] += 1
