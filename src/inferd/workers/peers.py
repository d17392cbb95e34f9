"""The workers of one server talking to each other: one Unix socket per worker in a run folder.

A worker asks its peers for their figures (metrics, statistics) at scrape time and tells them
of each repository change it made, waiting for every answer. A message is a 4-byte length and
an orjson document, and so is the answer (``{"ok": value}`` or ``{"error": message}``). A peer
whose socket does not answer (dead, or restarting) is skipped: a restarted worker replays the
run folder's journal (``Journal``) before it serves, so it misses no change.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from inferd.core.errors import InferdError
from inferd.scheduling.wire import decode_error, encode_error
from inferd.workers.journal import Journal

log = logging.getLogger("inferd.workers")

_LENGTH = struct.Struct("!I")
FIGURES_TIMEOUT_S = 5.0  # a peer that does not send its figures in this time is left out
JOURNAL_FILE = "journal.jsonl"

Handler = Callable[[dict[str, Any]], Awaitable[Any]]


class PeerError(Exception):
    """A peer answered a message with an error (``kind``: the class of the peer's
    ``InferdError``, as ``scheduling.wire`` names it)."""

    def __init__(self, message: str, kind: str = "InternalError") -> None:
        super().__init__(message)
        self.kind = kind

    def error(self) -> InferdError:
        """The peer's error as the same ``InferdError`` class."""
        return decode_error(self.kind, str(self))


@dataclass(frozen=True, slots=True)
class WorkerRole:
    """Which worker this process is: its index, how many there are, and their run folder."""

    index: int
    count: int
    run_dir: Path
    restarted: bool = False  # a replacement for a worker that died
    started_unix_s: float = 0.0  # when the server (its supervisor) started

    def socket_path(self, index: int) -> Path:
        return self.run_dir / f"worker-{index}.sock"

    @property
    def journal(self) -> Journal:
        return Journal(self.run_dir / JOURNAL_FILE)


async def _send(writer: asyncio.StreamWriter, doc: Any) -> None:
    data = orjson.dumps(doc)
    writer.write(_LENGTH.pack(len(data)) + data)
    await writer.drain()


async def _receive(reader: asyncio.StreamReader) -> Any:
    (size,) = _LENGTH.unpack(await reader.readexactly(_LENGTH.size))
    return orjson.loads(await reader.readexactly(size))


class Peers:
    """This worker's socket, and calls to every other worker's."""

    def __init__(self, role: WorkerRole) -> None:
        self.role = role
        self._server: asyncio.AbstractServer | None = None

    async def serve(self, handler: Handler) -> None:
        path = self.role.socket_path(self.role.index)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # left by the worker this one replaces

        async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                message = await _receive(reader)
                try:
                    reply: dict[str, Any] = {"ok": await handler(message)}
                except InferdError as exc:  # the asking worker reports it
                    reply = {"error": exc.message, "kind": encode_error(exc)[0]}
                except Exception as exc:
                    reply = {"error": str(exc) or repr(exc)}
                await _send(writer, reply)
            except (asyncio.IncompleteReadError, ConnectionError):
                pass
            finally:
                writer.close()

        self._server = await asyncio.start_unix_server(answer, path=str(path))

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def ask(self, index: int, message: dict[str, Any], timeout_s: float | None) -> Any:
        """One peer's answer (PeerError: it answered an error; OSError: it is not there)."""

        async def call() -> Any:
            path = str(self.role.socket_path(index))
            reader, writer = await asyncio.open_unix_connection(path)
            try:
                await _send(writer, message)
                reply = await _receive(reader)
            finally:
                writer.close()
            if "error" in reply:
                raise PeerError(str(reply["error"]), str(reply.get("kind", "InternalError")))
            return reply["ok"]

        return await asyncio.wait_for(call(), timeout_s)

    async def ask_all(
        self, message: dict[str, Any], timeout_s: float | None = None
    ) -> dict[int, Any]:
        """Every reachable peer's answer by worker index; a peer that is not listening, or
        (with ``timeout_s``) too slow, is left out. PeerError names the first that failed."""
        others = [i for i in range(self.role.count) if i != self.role.index]
        results = await asyncio.gather(
            *(self.ask(i, message, timeout_s) for i in others), return_exceptions=True
        )
        answers: dict[int, Any] = {}
        failures: list[str] = []
        for index, result in zip(others, results, strict=True):
            if isinstance(result, PeerError):
                failures.append(f"worker {index}: {result}")
            elif isinstance(result, OSError | TimeoutError | asyncio.IncompleteReadError):
                log.debug("worker %d did not answer %s: %s", index, message.get("op"), result)
            elif isinstance(result, BaseException):
                raise result
            else:
                answers[index] = result
        if failures:
            raise PeerError("; ".join(failures))
        return answers
