"""The bench's raw HTTP/1.1 client against a real socket server: framing, keep-alive, errors."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

from inferd.bench.encode import Workload, http_request
from inferd.bench.transport import HttpSender
from tests.support import free_port

Answer = Callable[[bytes], bytes]


async def _serve(answer: Answer) -> tuple[asyncio.Server, list[int]]:
    """A server that reads one request at a time and writes ``answer(body)``; counts connections."""
    connections: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length")
                )
                writer.write(answer(await reader.readexactly(length)))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, connections


def _sender(port: int, bodies: list[bytes]) -> HttpSender:
    requests = tuple(http_request("/x", "h", b, "application/json", None) for b in bodies)
    return HttpSender(Workload("http", "127.0.0.1", port, requests, "v2 json"))


def _run(test: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(test())


def test_content_length_keep_alive_and_status() -> None:
    def answer(body: bytes) -> bytes:
        status = b"200 OK" if body == b"good" else b"400 Bad Request"
        reply = b'{"error":"bad body"}' if body != b"good" else b"{}"
        return b"HTTP/1.1 " + status + b"\r\nContent-Length: %d\r\n\r\n" % len(reply) + reply

    async def test() -> None:
        server, connections = await _serve(answer)
        sender = _sender(server.sockets[0].getsockname()[1], [b"good", b"bad"])
        results = [await sender.send(i) for i in range(4)]
        assert results == [None, 'HTTP 400: {"error":"bad body"}'] * 2
        assert len(connections) == 1  # one keep-alive connection for every request
        concurrent = await asyncio.gather(*(sender.send(0) for _ in range(3)))
        assert concurrent == [None] * 3 and len(connections) == 3  # the pool grew to 3
        await sender.close()
        server.close()

    _run(test)


def test_chunked_and_connection_close() -> None:
    def answer(body: bytes) -> bytes:
        if body == b"chunked":
            return (
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                b"3\r\nabc\r\n2;ext=1\r\nde\r\n0\r\nX-Trailer: 1\r\n\r\n"
            )
        return b"HTTP/1.1 503 Busy\r\nConnection: close\r\nContent-Length: 4\r\n\r\nbusy"

    async def test() -> None:
        server, connections = await _serve(answer)
        sender = _sender(server.sockets[0].getsockname()[1], [b"chunked", b"close"])
        assert await sender.send(0) is None
        assert await sender.send(0) is None
        assert len(connections) == 1
        assert await sender.send(1) == "HTTP 503: busy"
        assert await sender.send(0) is None
        assert len(connections) == 2  # the closed connection was replaced
        await sender.close()
        server.close()

    _run(test)


def test_unreachable_server_is_an_error_not_an_exception() -> None:
    async def test() -> None:
        sender = _sender(free_port(), [b"x"])
        error = await sender.send(0)
        assert error is not None and error.startswith("cannot connect to 127.0.0.1:")

    _run(test)
