"""One HTTP/2 connection of the native gRPC server: an asyncio protocol driving an nghttp2 session.

Bytes received go to nghttp2, whose callbacks collect each stream's headers and messages; once a
unary-request call has its whole request (usually within the same read) it starts at once
(eager.py: a task carries on only a call that waits), and a streaming-request call starts at its
headers and reads messages from a queue. Answers are handed to nghttp2 (headers, a data
provider reading the framed messages, trailers) and what it serializes is written in one write
per flush.
"""

from __future__ import annotations

import asyncio
import ctypes
import inspect
import logging
import types
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import grpc

from inferd.protocols.h2grpc import eager, nghttp2
from inferd.protocols.h2grpc.calls import (
    CallError,
    Context,
    Stream,
    decompress,
    frame,
    metadata_pairs,
    parse_timeout,
    percent_encode,
)

if TYPE_CHECKING:
    from inferd.protocols.h2grpc.server import NativeGrpcServer

log = logging.getLogger("inferd.grpc")

_RESPONSE_HEADERS = [(b":status", b"200"), (b"content-type", b"application/grpc")]
_OK_TRAILERS = nghttp2.Headers([(b"grpc-status", b"0")])
_OK_HEADERS = nghttp2.Headers(_RESPONSE_HEADERS)
STREAM_BUFFER_BYTES = 4 * 1024 * 1024  # a streaming call waits when this much is unsent
_OVER_LIMIT = "Concurrent RPC limit exceeded!"  # grpcio's words
_FrameHd = nghttp2.FrameHd
_uint32 = ctypes.c_uint32
_memmove = nghttp2.memmove
_bytes_at = nghttp2.bytes_at
_Coroutine = types.CoroutineType
_LAST_DATA = nghttp2.DATA_FLAG_EOF | nghttp2.DATA_FLAG_NO_END_STREAM  # trailers follow


def _same(data: Any) -> Any:
    """A handler without a (de)serializer takes and gives bytes, as in grpcio."""
    return data


class Connection(asyncio.Protocol):
    def __init__(self, server: NativeGrpcServer) -> None:
        self.server = server
        self.lib = lib = server.lib
        self.loop = asyncio.get_running_loop()
        self.streams: dict[int, Stream] = {}
        self._ready: list[Stream] = []
        self._failures: list[tuple[Stream, CallError]] = []
        self._resets: list[int] = []  # streams to reset once their status has been written
        self.transport: asyncio.Transport | None = None
        self.peer = "unknown"
        self._paused = False
        self._closed = False
        self._flush_pending = False
        self._session = ctypes.c_void_p()
        # ctypes callbacks must outlive the session: keep them on the connection.
        self._callbacks = (
            nghttp2.FrameCallback(self._on_begin_headers),
            nghttp2.HeaderCallback(self._on_header),
            nghttp2.FrameCallback(self._on_frame_recv),
            nghttp2.DataChunkCallback(self._on_data_chunk),
            nghttp2.StreamCloseCallback(self._on_stream_close),
            nghttp2.SendCallback(self._on_send),
        )
        self._receiving: Stream | None = None  # the stream whose header block is arriving
        self._read_callback = nghttp2.ReadCallback(self._on_read)
        self._provider = nghttp2.DataProvider(nghttp2.DataSource(0), self._read_callback)
        self._provider_address = ctypes.addressof(self._provider)
        self._parts: list[bytes] = []  # what nghttp2 serialized during one flush
        callbacks = ctypes.c_void_p()
        lib.nghttp2_session_callbacks_new(ctypes.byref(callbacks))
        try:
            for name, callback in zip(
                ("on_begin_headers", "on_header", "on_frame_recv", "on_data_chunk_recv"),
                self._callbacks,
                strict=False,
            ):
                setter = getattr(lib, f"nghttp2_session_callbacks_set_{name}_callback")
                setter(callbacks, ctypes.cast(callback, ctypes.c_void_p))
            lib.nghttp2_session_callbacks_set_on_stream_close_callback(
                callbacks, ctypes.cast(self._callbacks[4], ctypes.c_void_p)
            )
            lib.nghttp2_session_callbacks_set_send_callback(
                callbacks, ctypes.cast(self._callbacks[5], ctypes.c_void_p)
            )
            if lib.nghttp2_session_server_new(ctypes.byref(self._session), callbacks, None) != 0:
                raise MemoryError("nghttp2_session_server_new failed")
        finally:
            lib.nghttp2_session_callbacks_del(callbacks)
        settings = [
            (nghttp2.SETTINGS_MAX_CONCURRENT_STREAMS, server.max_concurrent_streams),
            (nghttp2.SETTINGS_INITIAL_WINDOW_SIZE, server.window_bytes),
            (nghttp2.SETTINGS_MAX_FRAME_SIZE, 1 << 20),
            (nghttp2.SETTINGS_MAX_HEADER_LIST_SIZE, server.max_header_bytes),
        ]
        entries = (nghttp2.SettingsEntry * len(settings))(
            *(nghttp2.SettingsEntry(k, v) for k, v in settings)
        )
        lib.nghttp2_submit_settings(self._session, nghttp2.FLAG_NONE, entries, len(settings))
        lib.nghttp2_session_set_local_window_size(
            self._session, nghttp2.FLAG_NONE, 0, server.connection_window_bytes
        )

    # ------------------------------------------------------------------ transport events

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no subclass
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple):
            family = "ipv6" if ":" in str(peer[0]) else "ipv4"
            host = f"[{peer[0]}]" if family == "ipv6" else peer[0]
            self.peer = f"{family}:{host}:{peer[1]}"
        self.server.connections.add(self)
        self.flush()

    def data_received(self, data: bytes) -> None:
        if self._closed:
            return
        done = self.lib.nghttp2_session_mem_recv(self._session, data, len(data))
        if done < 0:  # a protocol error: nghttp2 has queued a GOAWAY
            log.debug("gRPC connection from %s: %s", self.peer, self._strerror(done))
        if self._failures:
            failures, self._failures = self._failures, []
            for stream, error in failures:
                stream.eof = False
                stream.started = True
                self._fail(stream, error)
                if stream.call is not None and not stream.call.done():
                    stream.cancelled = True
                    stream.call.cancel()
        # Calls started here mostly answer at once (see eager.py): one flush after them all.
        self._flush_pending = True
        try:
            ready, self._ready = self._ready, []
            for stream in ready:
                self._start(stream)
        finally:
            self.flush()
        if done < 0:
            self._close()

    def eof_received(self) -> bool | None:
        self._close()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self.server.connections.discard(self)
        for stream in list(self.streams.values()):
            if stream.call is not None and not stream.call.done():
                stream.call.cancel()
        self.streams.clear()
        if self._session:
            self.lib.nghttp2_session_del(self._session)
            self._session = ctypes.c_void_p()

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        self.flush()

    def _flush_soon(self) -> None:
        """Flush once the loop has run what is ready (calls that finish in the same loop
        iteration share one flush)."""
        if not self._flush_pending:
            self._flush_pending = True
            self.loop.call_soon(self.flush)

    def flush(self) -> None:
        """Write what nghttp2 has serialized, in one write."""
        self._flush_pending = False
        if self._paused or self._closed or self.transport is None:
            return
        lib, session = self.lib, self._session
        failed = lib.nghttp2_session_send(session)  # each frame goes to _on_send
        if self._resets and not failed:
            # nghttp2 would send a reset ahead of the status headers: only now, after them.
            for sid in self._resets:
                lib.nghttp2_submit_rst_stream(session, nghttp2.FLAG_NONE, sid, nghttp2.NO_ERROR)
            self._resets.clear()
            failed = lib.nghttp2_session_send(session)
        parts = self._parts
        if parts:
            self.transport.write(parts[0] if len(parts) == 1 else b"".join(parts))
            parts.clear()
        if failed:
            log.debug("gRPC connection from %s: %s", self.peer, self._strerror(failed))
            self._close()
            return
        for stream in self.streams.values():
            if stream.wake is not None and stream.out_bytes() < STREAM_BUFFER_BYTES:
                stream.wake.set()
        if not lib.nghttp2_session_want_read(session) and not lib.nghttp2_session_want_write(
            session
        ):
            self._close()

    def goaway(self) -> None:
        """Tell the client no new streams will be accepted (graceful shutdown)."""
        if self._closed:
            return
        last = self.lib.nghttp2_session_get_last_proc_stream_id(self._session)
        self.lib.nghttp2_submit_goaway(self._session, nghttp2.FLAG_NONE, last, 0, None, 0)
        self.flush()

    def _close(self) -> None:
        if not self._closed and self.transport is not None:
            self._closed = True
            self.transport.close()

    def _strerror(self, code: int) -> str:
        text = self.lib.nghttp2_strerror(code)
        return text.decode() if text else str(code)

    # ------------------------------------------------------------------ nghttp2 callbacks

    def _on_send(self, session: Any, data: int, length: int, flags: int, user: Any) -> int:
        self._parts.append(_bytes_at(data, length))  # nghttp2 reuses its buffer: a copy
        return length

    def _on_begin_headers(self, session: Any, frame: int, user: Any) -> int:
        # A header block arrives whole (HTTP/2 interleaves no frames inside one), so the
        # headers that follow are this stream's.
        sid = _FrameHd.from_address(frame).stream_id
        stream = self.streams.get(sid)
        if stream is None:
            stream = self.streams[sid] = Stream(sid, self.server.max_message_bytes)
        self._receiving = stream
        return 0

    def _on_header(
        self,
        session: Any,
        frame: Any,
        key: bytes,
        namelen: int,
        text: bytes,
        valuelen: int,
        flags: int,
        user: Any,
    ) -> int:
        # nghttp2 validates every field before this callback (HTTP messaging is on): a name or
        # value holding a NUL, which c_char_p would cut short, never gets here.
        stream = self._receiving
        if stream is None:
            return nghttp2.ERR_TEMPORAL_CALLBACK_FAILURE
        stream.headers.append((key, text))
        return 0

    def _on_frame_recv(self, session: Any, frame: int, user: Any) -> int:
        hd = _FrameHd.from_address(frame)
        if hd.type not in (nghttp2.HEADERS, nghttp2.DATA):
            return 0
        stream = self.streams.get(hd.stream_id)
        if stream is None:
            return 0
        ended = bool(hd.flags & nghttp2.FLAG_END_STREAM)
        if hd.type == nghttp2.HEADERS and not stream.headers_complete:
            stream.headers_complete = True
            fields = stream.fields = dict(stream.headers)  # the last of a repeated name
            stream.path = fields.get(b":path", b"").decode("latin-1")
            self._ready.append(stream)
        if ended:
            stream.ended = True
            if stream.incoming is not None:
                stream.incoming.put_nowait(None)
            elif stream.waiting_end:
                stream.waiting_end = False
                self._ready.append(stream)
        return 0

    def _on_data_chunk(
        self, session: Any, flags: int, sid: int, data: int, length: int, user: Any
    ) -> int:
        stream = self.streams.get(sid)
        if stream is None or stream.eof:
            return 0
        received: list[tuple[bool, bytes | bytearray]] = []
        try:
            stream.reader.feed(data, length, received)
        except CallError as exc:
            self._failures.append((stream, exc))  # answered once nghttp2 returns
            stream.eof = True
            return 0
        if stream.incoming is not None:
            for message in received:
                stream.incoming.put_nowait(message)
        else:
            stream.messages.extend(received)
        return 0

    def _on_stream_close(self, session: Any, sid: int, error_code: int, user: Any) -> int:
        stream = self.streams.pop(sid, None)
        if stream is None:
            return 0
        if stream is self._receiving:
            self._receiving = None
        if stream.deadline is not None:
            stream.deadline.cancel()
        call = stream.call
        if call is not None and not call.done():
            stream.cancelled = True
            call.cancel()  # the client reset the stream or went away: drop its work
        return 0

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

    # ------------------------------------------------------------------ calls

    def _start(self, stream: Stream) -> None:
        if stream.started or stream.sid not in self.streams:
            return
        handler = self.server.handler_for(stream.path, stream)
        if handler is not None and not handler.request_streaming and not stream.ended:
            stream.waiting_end = True  # start once the whole request is here
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
                    request = self._unary_request(stream, handler)
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

    def _message(self, stream: Stream, item: tuple[bool, bytes | bytearray]) -> bytes | bytearray:
        compressed, data = item
        if compressed:
            encoding = stream.header(b"grpc-encoding") or "identity"
            return decompress(encoding, data, self.server.max_message_bytes)
        return data

    def _unary_request(self, stream: Stream, handler: Any) -> Any:
        if len(stream.messages) != 1 or stream.reader.partial:
            raise CallError(
                grpc.StatusCode.INTERNAL,
                f"a unary call carries one message, got {len(stream.messages)}",
            )
        deserialize = handler.request_deserializer or _same
        return deserialize(self._message(stream, stream.messages.pop()))

    async def _requests(self, stream: Stream, deserialize: Any) -> AsyncIterator[Any]:
        incoming = stream.incoming
        assert incoming is not None
        while (item := await incoming.get()) is not None:
            yield deserialize(self._message(stream, item))

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
            result = handler.unary_stream(self._unary_request(stream, handler), context)
        if inspect.isasyncgen(result):
            async for message in result:
                await write(message)
        elif inspect.isawaitable(result):
            await result
        self._finish(stream, context)

    async def _send_message(self, stream: Stream, payload: bytes) -> None:
        self._check_size(payload)
        self._open(stream)
        stream.out.append(frame(payload))
        self.lib.nghttp2_session_resume_data(self._session, stream.sid)
        self.flush()
        while stream.out_bytes() >= STREAM_BUFFER_BYTES and stream.sid in self.streams:
            stream.wake = stream.wake or asyncio.Event()
            stream.wake.clear()
            await stream.wake.wait()

    def _check_size(self, payload: bytes) -> None:
        limit = self.server.max_message_bytes
        if len(payload) > limit:
            raise CallError(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"Sent message larger than max ({len(payload)} vs. {limit})",
            )

    def _open(self, stream: Stream, initial: list[tuple[bytes, bytes]] | None = None) -> None:
        if stream.responded:
            return
        stream.responded = True
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
        stream.out.append(frame(payload))
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
            headers = nghttp2.Headers(_RESPONSE_HEADERS + status)
            self.lib.nghttp2_submit_response(
                self._session, stream.sid, headers.address, headers.count, None
            )
        if not stream.ended:  # the client is still sending: tell it to stop
            self._resets.append(stream.sid)

    def _expire(self, stream: Stream) -> None:
        stream.deadline_hit = True
        if stream.call is not None and not stream.call.done():
            stream.call.cancel()
