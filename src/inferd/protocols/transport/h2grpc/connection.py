"""One HTTP/2 connection of the native gRPC server: an asyncio protocol driving an nghttp2 session.

Bytes received go to nghttp2, whose callbacks collect each stream's headers and messages; once a
unary-request call has its whole request (usually within the same read) it starts at once, and
a streaming-request call starts at its headers and reads messages from a queue (dispatch.py).
Answers are handed to nghttp2 and what it serializes is written in one write per flush.

Nothing a client sends is held past a bound (``host.Limits``): the header list is counted as its
fields arrive and the stream reset past the limit; nghttp2 opens no window by itself
(``no_auto_window_update``): a stream's window reopens only as its call takes what it was sent,
so a client that sends faster than its calls read is throttled by HTTP/2 itself; and the
server's sweep resets a stream whose request stalls, and closes a connection that never
greets, stalls in a header block, stays idle, or leaves a keep-alive ping unanswered.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
from functools import partial
from typing import Any

import grpc

from inferd.protocols.transport.h2grpc import nghttp2
from inferd.protocols.transport.h2grpc.calls import CallError, Stream
from inferd.protocols.transport.h2grpc.dispatch import STREAM_BUFFER_BYTES, CallRunner
from inferd.protocols.transport.h2grpc.host import Host

log = logging.getLogger("inferd.grpc")

_FrameHd = nghttp2.FrameHd
_bytes_at = nghttp2.bytes_at
_NO_CALLS_PING_INTERVAL_S = 7200.0  # gRPC's: pings without calls, unless permitted
_TIMED_OUT = "the request did not arrive within {:g} s (--grpc-body-timeout-s)"
# Closing with bytes unread makes the kernel answer with a reset, which can make the client
# lose the GOAWAY that says why: after one, the connection lingers half-closed this long at most.
_LINGER_S = 2.0


class Connection(CallRunner, asyncio.Protocol):
    def __init__(self, server: Host) -> None:
        self.server = server
        self.limits = limits = server.limits
        self.lib = lib = server.lib
        self.loop = asyncio.get_running_loop()
        self.streams: dict[int, Stream] = {}
        self._ready: list[Stream] = []
        self._failures: list[tuple[Stream, CallError]] = []
        self._resets: list[int] = []  # streams to reset once their status has been written
        self._deferred: list[Stream] = []  # calls waiting for their client to read answers
        self.unsent = 0
        self.handed = 0
        self.received = 0  # bytes, over the connection's life
        self._stalled_held = False  # streams wait for their client to read its answers
        self.transport: asyncio.Transport | None = None
        self.peer = "unknown"
        self._paused = False
        self._closed = False
        self._ending = False  # close once the GOAWAY just submitted is written
        self._flush_pending = False
        now = server.clock
        self.opened_at = now
        self.greeted = False  # the client's preface and SETTINGS arrived
        self.last_read = now
        self.last_activity = now  # a stream opened or closed
        self.going_away: float | None = None  # when an idle GOAWAY was sent
        self.ping_sent: float | None = None  # a keep-alive ping awaits its answer
        self.last_ping: float | None = None  # the client's last ping
        self.ping_strikes = 0
        self._block_since: float | None = None  # a header block is arriving
        self._session = ctypes.c_void_p()
        self._consume = lib.nghttp2_session_consume
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
        nghttp2.new_server_session(lib, self._session, self._callbacks)
        settings = [
            (nghttp2.SETTINGS_MAX_CONCURRENT_STREAMS, limits.max_concurrent_streams),
            (nghttp2.SETTINGS_INITIAL_WINDOW_SIZE, limits.stream_window_bytes),
            (nghttp2.SETTINGS_MAX_HEADER_LIST_SIZE, limits.max_header_list_bytes),
        ]
        entries = (nghttp2.SettingsEntry * len(settings))(
            *(nghttp2.SettingsEntry(k, v) for k, v in settings)
        )
        lib.nghttp2_submit_settings(self._session, nghttp2.FLAG_NONE, entries, len(settings))
        lib.nghttp2_session_set_local_window_size(
            self._session, nghttp2.FLAG_NONE, 0, limits.connection_window_bytes
        )

    # ------------------------------------------------------------------ transport events

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no subclass
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple):
            family = "ipv6" if ":" in str(peer[0]) else "ipv4"
            host = f"[{peer[0]}]" if family == "ipv6" else peer[0]
            self.peer = f"{family}:{host}:{peer[1]}"
        self.server.opened(self)
        self.flush()

    def data_received(self, data: bytes) -> None:
        if self._closed:
            return
        self.last_read = self.server.clock
        self.received += len(data)
        done = self.lib.nghttp2_session_mem_recv(self._session, data, len(data))
        if done < 0:  # a protocol error: nghttp2 has queued a GOAWAY
            log.debug("gRPC connection from %s: %s", self.peer, self._strerror(done))
        if self._failures:
            failures, self._failures = self._failures, []
            for stream, error in failures:
                self._abort(stream, error)
        # Calls started here mostly answer at once (see eager.py): one flush after them all.
        self._flush_pending = True
        try:
            ready, self._ready = self._ready, []
            for stream in ready:
                self._start(stream)
        finally:
            self.flush()
        if done < 0:
            self._close(linger=True)

    def eof_received(self) -> bool | None:
        self._close()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self.server.closed(self)
        for stream in list(self.streams.values()):
            self._forget(stream, credit=False)
            if stream.call is not None and not stream.call.done():
                stream.call.cancel()
        self.streams.clear()
        self._deferred.clear()
        self._receiving = None
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
        if failed or self._ending:
            if failed:
                log.debug("gRPC connection from %s: %s", self.peer, self._strerror(failed))
            self._close(linger=not failed)
            return
        if self.unsent < self.limits.connection_unsent_bytes:
            for stream in self.streams.values():
                if stream.wake is not None and stream.unsent < STREAM_BUFFER_BYTES:
                    stream.wake.set()
            if self._deferred:
                self.loop.call_soon(self._start_deferred)
        if self._stalled_held and not self._stalled():
            self._stalled_held = False
            for stream in list(self.streams.values()):
                if stream.held and not stream.pending:
                    self._reopen(stream)
        if not lib.nghttp2_session_want_read(session) and not lib.nghttp2_session_want_write(
            session
        ):
            self._close()

    def goaway(self, code: int = nghttp2.NO_ERROR, debug: bytes = b"") -> None:
        """Tell the client no new streams will be accepted (graceful shutdown)."""
        if self._closed:
            return
        last = self.lib.nghttp2_session_get_last_proc_stream_id(self._session)
        self.lib.nghttp2_submit_goaway(
            self._session, nghttp2.FLAG_NONE, last, code, debug or None, len(debug)
        )
        self.flush()

    def _close(self, linger: bool = False) -> None:
        """Close; with ``linger``, once the client has had the GOAWAY just written: half-closed,
        what still arrives dropped, until the client closes its end or ``_LINGER_S`` passed."""
        transport = self.transport
        if self._closed or transport is None:
            return
        self._closed = True  # no more is read into the session (data_received)
        if linger and transport.can_write_eof():
            transport.write_eof()
            self.loop.call_later(_LINGER_S, transport.close)
        else:
            transport.close()

    def _strerror(self, code: int) -> str:
        text = self.lib.nghttp2_strerror(code)
        return text.decode() if text else str(code)

    # ------------------------------------------------------------------ limits and timeouts

    def sweep(self, now: float) -> None:
        """Enforce the timeouts (the server calls this every ``Limits.sweep_s``)."""
        if self._closed:
            return
        limits = self.limits
        if not self.greeted:
            if now - self.opened_at > limits.header_timeout_s:
                self._close()  # no preface and SETTINGS in time
            return
        block = self._block_since
        if block is not None and now - block > limits.header_timeout_s:
            self._close()  # a header block left unfinished
            return
        for stream in list(self.streams.values()):
            if stream.waits_on_client() and now - stream.seen > limits.body_timeout_s:
                self._time_out(stream)
        if self.ping_sent is not None and now - self.ping_sent > limits.keepalive_timeout_s:
            self._close()  # the keep-alive ping went unanswered
            return
        if self.going_away is not None:
            if not self.streams:
                self._close()
            return
        if not self.streams and now - self.last_activity > limits.idle_timeout_s:
            self.going_away = now
            self.goaway()
        elif self.ping_sent is None and now - self.last_read > limits.keepalive_time_s:
            self.ping_sent = now
            self.lib.nghttp2_submit_ping(self._session, nghttp2.FLAG_NONE, None)
        self.flush()

    def _time_out(self, stream: Stream) -> None:
        if stream.headers_complete:
            error = CallError(
                grpc.StatusCode.DEADLINE_EXCEEDED, _TIMED_OUT.format(self.limits.body_timeout_s)
            )
            self._abort(stream, error)
        else:
            self.lib.nghttp2_submit_rst_stream(
                self._session, nghttp2.FLAG_NONE, stream.sid, nghttp2.CANCEL
            )

    def _on_ping(self, ack: bool) -> None:
        """gRPC's ping policy: pings closer than the interval strike; past the strikes the
        connection is closed (GOAWAY ENHANCE_YOUR_CALM, "too_many_pings")."""
        if ack:
            self.ping_sent = None
            return
        limits, now = self.limits, self.server.clock
        interval = limits.min_ping_interval_s
        if not self.streams and not limits.keepalive_permit_without_calls:
            interval = max(interval, _NO_CALLS_PING_INTERVAL_S)
        if self.last_ping is not None and now - self.last_ping < interval:
            self.ping_strikes += 1
            if self.ping_strikes > limits.max_ping_strikes:
                self._ending = True
                last = self.lib.nghttp2_session_get_last_proc_stream_id(self._session)
                self.lib.nghttp2_submit_goaway(
                    self._session, 0, last, nghttp2.ENHANCE_YOUR_CALM, b"too_many_pings", 14
                )
        self.last_ping = now

    def _pinged_back(self) -> None:
        """The server sends HEADERS or DATA: the client's next pings start a fresh count (grpc's
        clients probe the bandwidth with pings while answers flow, however long a stream
        lasts). A connection the server sends nothing on keeps the strikes it earns."""
        self.last_ping = None
        self.ping_strikes = 0

    def _reopen(self, stream: Stream) -> None:
        """Open the window of a stream whose call waits for more (if the budget has room)."""
        if not stream.held or self._closed or stream.sid not in self.streams:
            return
        if self.unsent and self._stalled():
            self._stalled_held = True  # flush reopens it once the client reads its answers
            return
        budget = self.server.budget
        if not budget.room():
            budget.waiting[stream] = partial(self._reopen, stream)
            return
        self._consume(self._session, stream.sid, stream.held)
        stream.held = 0
        self._flush_soon()

    def _forget(self, stream: Stream, credit: bool = True) -> None:
        """Free what a closed stream held: its bytes in the budget, its unsent answers."""
        if stream.held:
            if credit:
                self.lib.nghttp2_session_consume_connection(self._session, stream.held)
            stream.held = 0
        budget = self.server.budget
        if budget.waiting:
            budget.waiting.pop(stream, None)
        if stream.buffered:
            budget.release(stream.buffered)
            stream.buffered = 0
            stream.messages.clear()
        if stream.unsent:
            self.unsent -= stream.unsent
            stream.unsent = 0
            stream.out.clear()

    # ------------------------------------------------------------------ nghttp2 callbacks

    def _on_send(self, session: Any, data: int, length: int, flags: int, user: Any) -> int:
        self._parts.append(_bytes_at(data, length))  # nghttp2 reuses its buffer: a copy
        return length

    def _on_begin_headers(self, session: Any, frame: int, user: Any) -> int:
        # A header block arrives whole (HTTP/2 interleaves no frames inside one), so the
        # headers that follow are this stream's.
        sid = _FrameHd.from_address(frame).stream_id
        stream = self.streams.get(sid)
        now = self.server.clock
        if stream is None:
            stream = self.streams[sid] = Stream(sid, self.limits.max_message_bytes, now)
        self._receiving = stream
        self._block_since = self.last_activity = now
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
        size = stream.header_bytes + namelen + valuelen + 32  # as HTTP/2 counts a header list
        if size > self.limits.max_header_list_bytes:
            # nghttp2 resets the stream and skips the rest of the block without calling back.
            stream.headers.clear()
            self._receiving = None
            return nghttp2.ERR_TEMPORAL_CALLBACK_FAILURE
        stream.header_bytes = size
        stream.headers.append((key, text))
        return 0

    def _on_frame_recv(self, session: Any, frame: int, user: Any) -> int:
        hd = _FrameHd.from_address(frame)
        kind = hd.type
        if kind == nghttp2.HEADERS:
            self._block_since = None
            self._receiving = None
        elif kind != nghttp2.DATA:
            if kind == nghttp2.SETTINGS:
                self.greeted = True
            elif kind == nghttp2.PING:
                self._on_ping(bool(hd.flags & nghttp2.FLAG_ACK))
            return 0
        stream = self.streams.get(hd.stream_id)
        if stream is None:
            return 0
        ended = bool(hd.flags & nghttp2.FLAG_END_STREAM)
        if kind == nghttp2.HEADERS and not stream.headers_complete:
            self._headers_complete(stream)
        if ended:
            stream.ended = True
            if stream.incoming is not None:
                stream.incoming.put_nowait(None)
            elif stream.waiting_end:
                stream.waiting_end = False
                self._ready.append(stream)
        return 0

    def _headers_complete(self, stream: Stream) -> None:
        """The call's method and authentication are decided here, before any of its body."""
        stream.headers_complete = True
        fields = stream.fields = dict(stream.headers)  # the last of a repeated name
        stream.path = fields.get(b":path", b"").decode("latin-1")
        server = self.server
        stream.handler = server.handler_for(stream.path, stream)
        if server.refusal is not None:
            authorization = fields.get(b"authorization")
            refused = server.refusal(
                stream.path, None if authorization is None else authorization.decode("latin-1")
            )
            if refused is not None:
                stream.eof = True  # what the client still sends is dropped, not buffered
                self._failures.append((stream, CallError(*refused)))
                return
        self._ready.append(stream)

    def _on_data_chunk(
        self, session: Any, flags: int, sid: int, data: int, length: int, user: Any
    ) -> int:
        stream = self.streams.get(sid)
        if stream is None or stream.eof:
            self._consume(session, sid, length)  # dropped: its window reopens at once
            return 0
        budget = self.server.budget
        stream.seen = self.server.clock
        self._block_since = None
        received: list[tuple[bool, bytes | bytearray]] = []
        try:
            stream.reader.feed(data, length, received)
        except CallError as exc:
            self._failures.append((stream, exc))  # answered once nghttp2 returns
            stream.eof = True
            self._consume(session, sid, length)
            return 0
        if (
            not stream.pending
            and budget.buffered < budget.limit
            and not (self.unsent and self._stalled())
        ):
            self._consume(session, sid, length)  # the call waits for these: more may come
        else:
            stream.held += length  # reopened as the call takes its messages
            if not stream.pending:
                self._reopen(stream)  # which waits for the budget, or for the client to read
        budget.buffered += length
        stream.buffered += length
        if received:
            stream.pending += len(received)
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
        self.last_activity = self.server.clock
        if stream is self._receiving:
            self._receiving = None
        self._forget(stream)
        if stream.deadline is not None:
            stream.deadline.cancel()
        call = stream.call
        if call is not None and not call.done():
            stream.cancelled = True
            call.cancel()  # the client reset the stream or went away: drop its work
        return 0
