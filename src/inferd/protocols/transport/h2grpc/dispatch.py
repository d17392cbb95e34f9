"""Running the calls of one native gRPC connection: starting a call once its request allows,
handing it its messages, and submitting its answer (headers, messages, trailers) to nghttp2.

A mixin of ``connection.Connection``, which owns the nghttp2 session and the transport: a call
that finishes without waiting runs on the protocol callback's stack (eager.py), the others on a
task. A call whose client does not read its answers holds its connection back: past
``Limits.connection_unsent_bytes`` unsent, streaming calls wait to write and new calls wait to
start, so the answers a client leaves unread stay bounded.
"""

from __future__ import annotations

import asyncio
import ctypes
import inspect
import logging
import types
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc

from inferd.protocols.transport.h2grpc import eager, nghttp2
from inferd.protocols.transport.h2grpc.calls import (
    CallError,
    Context,
    Stream,
    metadata_pairs,
    parse_timeout,
    percent_encode,
)
from inferd.protocols.transport.h2grpc.framing import decompress, frame
from inferd.protocols.transport.h2grpc.host import Host, Limits

log = logging.getLogger("inferd.grpc")

_RESPONSE_HEADERS = [(b":status", b"200"), (b"content-type", b"application/grpc")]
_OK_HEADERS = nghttp2.Headers(_RESPONSE_HEADERS)
_OK_TRAILERS = nghttp2.Headers([(b"grpc-status", b"0")])
_uint32 = ctypes.c_uint32
_memmove = nghttp2.memmove
_LAST_DATA = nghttp2.DATA_FLAG_EOF | nghttp2.DATA_FLAG_NO_END_STREAM  # trailers follow
STREAM_BUFFER_BYTES = 1024 * 1024  # a streaming call waits when this much of it is unsent
_OVER_LIMIT = "Concurrent RPC limit exceeded!"  # grpcio's words
_Coroutine = types.CoroutineType
Message = tuple[bool, bytes | bytearray]


def _same(data: Any) -> Any:
    """A handler without a (de)serializer takes and gives bytes, as in grpcio."""
    return data


class CallRunner:
    """The calls of a connection (mixed into ``Connection``, which sets these attributes)."""

    server: Host
    limits: Limits
    lib: Any
    loop: asyncio.AbstractEventLoop
    streams: dict[int, Stream]
    peer: str
    unsent: int  # bytes of answers not yet handed to nghttp2, every stream's
    handed: int  # request bytes handed to streaming calls since the client read every answer
    _session: Any
    _resets: list[int]
    _deferred: list[Stream]
    _provider_address: int
    flush: Callable[[], None]
    _flush_soon: Callable[[], None]
    _reopen: Callable[[Stream], None]
    _pinged_back: Callable[[], None]

    def _start(self, stream: Stream) -> None:
        if stream.started or stream.sid not in self.streams:
            return
        handler = stream.handler
        if handler is not None and not handler.request_streaming and not stream.ended:
            stream.waiting_end = True  # start once the whole request is here
            return
        stream.waiting_end = False
        if self.unsent >= self.limits.connection_unsent_bytes:
            self._deferred.append(stream)  # its client has answers to read first
            return
        stream.started = True
        server = self.server
        if server.max_concurrent_rpcs and server.active_calls >= server.max_concurrent_rpcs:
            self._fail(stream, CallError(grpc.StatusCode.RESOURCE_EXHAUSTED, _OVER_LIMIT))
            return
        if handler is not None and handler.request_streaming:
            incoming = stream.incoming = asyncio.Queue()
            for message in stream.messages:
                incoming.put_nowait(message)
            stream.messages.clear()
            if stream.ended:
                incoming.put_nowait(None)
        counted = bool(server.max_concurrent_rpcs)  # calls are counted only against a limit
        if counted:
            server.active_calls += 1
        # Named after the method: an unnamed task formats a "Task-<n>" name of its own.
        call = eager.start(self.loop, self._run(stream, handler), stream.path)
        if call is None:  # answered without waiting
            if counted:
                server.active_calls -= 1
            return
        stream.call = call
        if counted:
            call.add_done_callback(self._call_done)

    def _start_deferred(self) -> None:
        """Start the calls that waited for their client to read its answers."""
        deferred, self._deferred = self._deferred, []
        for stream in deferred:
            self._start(stream)
        self.flush()

    def _call_done(self, _: asyncio.Task[None]) -> None:
        self.server.active_calls -= 1

    async def _run(self, stream: Stream, handler: Any) -> None:
        timeout = None
        fields = stream.fields
        content_type = fields.get(b"content-type", b"")
        if b"grpc-timeout" in fields:
            timeout = parse_timeout(fields[b"grpc-timeout"].decode("latin-1"))
            if timeout is not None:
                stream.deadline = self.loop.call_later(timeout, self._expire, stream)
        context = Context(stream, self.peer, timeout)
        try:
            server = self.server
            if server.interceptors and server.intercepts(stream.path):
                handler = await server.intercepted(handler, stream, context)
            if handler is None:
                raise CallError(grpc.StatusCode.UNIMPLEMENTED, f"Method not found: {stream.path}")
            if not content_type.startswith(b"application/grpc"):
                raise CallError(
                    grpc.StatusCode.INTERNAL,
                    f"unexpected content-type '{content_type.decode('latin-1')}'",
                )
            if handler.response_streaming:
                await self._stream_out(stream, handler, context)
            else:
                if handler.request_streaming:
                    request = self._requests(stream, handler.request_deserializer or _same)
                else:
                    request = await self._unary_request(stream, handler)
                function = handler.unary_unary or handler.stream_unary
                response = function(request, context)
                if type(response) is _Coroutine or inspect.isawaitable(response):
                    response = await response
                serialize = handler.response_serializer or _same
                self._respond(stream, serialize(response), context)
        except CallError as exc:
            self._fail(stream, exc)
        except asyncio.CancelledError:
            if stream.deadline_hit:
                self._fail(
                    stream, CallError(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
                )
            elif not stream.cancelled:
                raise
        except Exception:
            log.exception("unhandled error in gRPC call %s", stream.path)
            self._fail(stream, CallError(grpc.StatusCode.UNKNOWN, "Unexpected error in the server"))
        finally:
            if stream.deadline is not None:
                stream.deadline.cancel()
            context.run_done_callbacks()
            self._flush_soon()

    async def _taken(self, stream: Stream, message: Message) -> bytes | bytearray:
        """A message handed to its call: its bytes leave the buffers, and once the call has
        taken every complete message, the stream's window opens for what it waits for. A
        compressed one is inflated on a thread (zlib lets go of the GIL): inflating up to
        the message limit takes a fraction of a second the loop owes every other call."""
        size = len(message[1]) + 5
        stream.pending -= 1
        stream.buffered -= size
        self.server.budget.release(size)
        if stream.held and not stream.pending:
            self._reopen(stream)
        compressed, data = message
        if compressed:
            encoding = stream.header(b"grpc-encoding")
            limit = self.limits.max_message_bytes
            return await asyncio.to_thread(decompress, encoding, data, limit)
        return data

    async def _unary_request(self, stream: Stream, handler: Any) -> Any:
        if len(stream.messages) != 1 or stream.reader.partial:
            raise CallError(
                grpc.StatusCode.INTERNAL,
                f"a unary call carries one message, got {len(stream.messages)}",
            )
        deserialize = handler.request_deserializer or _same
        return deserialize(await self._taken(stream, stream.messages.pop()))

    async def _requests(self, stream: Stream, deserialize: Any) -> AsyncIterator[Any]:
        """A streaming call's messages. None is handed over while its client leaves answers
        unread and has been handed ``connection_unsent_bytes`` since it last read them all: the
        requests it sends then wait in the (bounded) windows, not in the calls' work."""
        incoming = stream.incoming
        assert incoming is not None
        while True:
            await self._room(stream, reading=True)
            item = await incoming.get()
            if item is None:
                return
            self.handed += len(item[1]) + 5
            yield deserialize(await self._taken(stream, item))

    def _stalled(self) -> bool:
        """Whether the client leaves its answers unread: nothing more is taken in for it."""
        limit = self.limits.connection_unsent_bytes
        return self.unsent >= limit or (self.unsent > 0 and self.handed >= limit)

    async def _room(self, stream: Stream, reading: bool = False) -> None:
        """Wait while the stream, or its connection, has too many answers unsent (and, to
        read a request, while too much was handed to calls since the client read them all)."""
        limit = self.limits.connection_unsent_bytes
        while stream.sid in self.streams:
            if (
                stream.unsent < STREAM_BUFFER_BYTES
                and self.unsent < limit
                and (not reading or not self.unsent or self.handed < limit)
            ):
                return
            stream.wake = stream.wake or asyncio.Event()
            stream.wake.clear()
            await stream.wake.wait()

    async def _stream_out(self, stream: Stream, handler: Any, context: Context) -> None:
        serialize = handler.response_serializer or _same

        async def write(message: Any) -> None:
            await self._send_message(stream, serialize(message))

        context._write = write
        if handler.request_streaming:
            requests = self._requests(stream, handler.request_deserializer or _same)
            iterator = requests.__aiter__()

            async def read() -> Any:
                try:
                    return await iterator.__anext__()
                except StopAsyncIteration:
                    return grpc.aio.EOF

            context._read = read
            result = handler.stream_stream(requests, context)
        else:
            result = handler.unary_stream(await self._unary_request(stream, handler), context)
        if inspect.isasyncgen(result):
            try:
                async for message in result:
                    await write(message)
            finally:  # cancelled too (its client left): the handler's own cleanup runs now
                await result.aclose()
        elif inspect.isawaitable(result):
            await result
        self._finish(stream, context)

    def _queue(self, stream: Stream, payload: bytes) -> None:
        framed = frame(payload)
        stream.out.append(framed)
        stream.unsent += len(framed)
        self.unsent += len(framed)

    async def _send_message(self, stream: Stream, payload: bytes) -> None:
        self._check_size(payload)
        self._open(stream)
        self._queue(stream, payload)
        self.lib.nghttp2_session_resume_data(self._session, stream.sid)
        self.flush()
        await self._room(stream)

    def _check_size(self, payload: bytes) -> None:
        limit = self.limits.max_message_bytes
        if len(payload) > limit:
            raise CallError(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"Sent message larger than max ({len(payload)} vs. {limit})",
            )

    def _open(self, stream: Stream, initial: list[tuple[bytes, bytes]] | None = None) -> None:
        if stream.responded:
            return
        stream.responded = True
        self._pinged_back()  # the server sends: the client's pings are welcome again
        if initial:
            headers = nghttp2.Headers(_RESPONSE_HEADERS + initial)
            self.lib.nghttp2_submit_response(
                self._session, stream.sid, headers.address, headers.count, self._provider_address
            )
        else:
            self.lib.nghttp2_submit_response(
                self._session, stream.sid, _OK_HEADERS.address, 2, self._provider_address
            )

    def _respond(self, stream: Stream, payload: bytes, context: Context) -> None:
        """A unary answer: headers, the one message and the trailers go out together."""
        self._check_size(payload)
        if stream.sid not in self.streams:
            return
        self._queue(stream, payload)
        self._finish(stream, context)
        self._open(stream)

    def _finish(self, stream: Stream, context: Context) -> None:
        code = context.code()
        if code is not None and code is not grpc.StatusCode.OK:
            raise CallError(code, context.details(), context.trailing_metadata())
        trailing = context.trailing_metadata()
        if trailing:
            stream.trailers = [(b"grpc-status", b"0"), *metadata_pairs(trailing)]
        stream.eof = True
        if stream.responded:
            self.lib.nghttp2_session_resume_data(self._session, stream.sid)

    def _fail(self, stream: Stream, error: CallError) -> None:
        """End a call with an error status: trailers-only if nothing was sent yet."""
        if stream.sid not in self.streams or stream.eof:
            return
        status = [
            (b"grpc-status", str(error.code.value[0]).encode()),
            (b"grpc-message", percent_encode(error.details)),
            *metadata_pairs(error.trailing),
        ]
        stream.eof = True
        if stream.responded:
            stream.trailers = status
            self.lib.nghttp2_session_resume_data(self._session, stream.sid)
        else:
            stream.responded = True
            self._pinged_back()
            headers = nghttp2.Headers(_RESPONSE_HEADERS + status)
            self.lib.nghttp2_submit_response(
                self._session, stream.sid, headers.address, headers.count, None
            )
        if not stream.ended:  # the client is still sending: tell it to stop
            self._resets.append(stream.sid)

    def _abort(self, stream: Stream, error: CallError) -> None:
        """Fail a call the server gives up on (its call, if running, is cancelled)."""
        stream.eof = False
        stream.started = True
        self._fail(stream, error)
        if stream.call is not None and not stream.call.done():
            stream.cancelled = True
            stream.call.cancel()

    def _expire(self, stream: Stream) -> None:
        stream.deadline_hit = True
        if stream.call is not None and not stream.call.done():
            stream.call.cancel()

    def _on_read(
        self,
        session: Any,
        sid: int,
        buf: int,
        length: int,
        flags: int,
        source: Any,
        user: Any,
    ) -> int:
        stream = self.streams.get(sid)
        if stream is None:
            return nghttp2.ERR_CALLBACK_FAILURE
        written = 0
        out = stream.out
        while out and written < length:
            chunk = out[0]
            offset = stream.out_offset
            take = min(len(chunk) - offset, length - written)
            if offset:
                source = ctypes.cast(ctypes.c_char_p(chunk), ctypes.c_void_p).value or 0
                _memmove(buf + written, source + offset, take)
            else:  # ctypes passes the bytes' own buffer
                _memmove(buf + written, chunk, take)
            written += take
            if offset + take == len(chunk):
                out.popleft()
                stream.out_offset = 0
            else:
                stream.out_offset = offset + take
        stream.unsent -= written
        self.unsent -= written
        if written:
            self._pinged_back()  # DATA goes out: as grpc's core and grpc-go, strikes reset
        if not self.unsent:
            self.handed = 0  # the client read every answer
        if not out and stream.eof:
            _uint32.from_address(flags).value = _LAST_DATA
            trailers = stream.trailers
            if trailers:
                submitted = nghttp2.Headers(trailers)
                self.lib.nghttp2_submit_trailer(session, sid, submitted.address, submitted.count)
            else:
                self.lib.nghttp2_submit_trailer(session, sid, _OK_TRAILERS.address, 1)
            return written
        if written == 0:
            return nghttp2.ERR_DEFERRED
        return written
