"""The hostile-client probes of the gRPC port, each a function of a target server.

Each opens its own connections, does its harm for about ``hold_s`` seconds, closes them, and
returns how many connections it used and a one-line note of what the server answered.
``measure`` runs one with the server's process-tree RSS sampled and a real client's latency
recorded, for tests/e2e/test_hostile_grpc.py and benchmarks/hostile_grpc.py.
"""

from __future__ import annotations

import gzip
import resource
import selectors
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from tests.e2e.hostile_support import (
    CONTINUATION,
    END_HEADERS,
    HEADERS,
    INFER,
    PING,
    PREFACE,
    RST_STREAM,
    SETTINGS,
    SETTINGS_INITIAL_WINDOW_SIZE,
    SETTINGS_MAX_FRAME_SIZE,
    STREAM_INFER,
    RawClient,
    RealClient,
    frame,
    grpc_message,
    infer_message,
    request_headers,
    tree_cpu_s,
    tree_rss,
)

WIDE = """backend: "echo"
max_batch_size: 8
input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [16384] }]
"""
WIDE_VALUES = 16384
CANCEL = 0x8


@dataclass
class Target:
    """The server under test: its pid, gRPC address and largest message."""

    pid: int
    host: str
    port: int
    max_message_bytes: int = 128 * 1024 * 1024
    token: str = ""  # set when the server needs one: probes then send none

    @property
    def address(self) -> tuple[str, int]:
        return (self.host, self.port)


@dataclass
class Outcome:
    name: str
    connections: int
    peak_bytes: int  # the process tree's RSS growth at its peak during the probe
    left_bytes: int  # growth still held ``settle_s`` after the probe's connections closed
    p99_idle_s: float
    p99_during_s: float
    calls_during: int  # the real client's calls answered during the probe
    note: str

    @property
    def per_connection_bytes(self) -> int:
        return self.peak_bytes // max(1, self.connections)


Probe = Callable[[Target, float], tuple[int, str]]


def wide_message(value: float = 1.0) -> bytes:
    from inferd.protocols import grpc_service_pb2 as pb

    request = pb.ModelInferRequest(model_name="wide")
    tensor = request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, WIDE_VALUES])
    tensor.contents.fp32_contents.extend([value] * WIDE_VALUES)
    return request.SerializeToString()


def _frame_size(client: RawClient) -> int:
    """The server's largest frame, once its SETTINGS arrived (16 KiB unless it says)."""
    deadline = time.monotonic() + 60  # a bound for a server gone wrong, not a wait
    while not any(kind == SETTINGS for kind, _, _ in client.seen.frames):
        if time.monotonic() > deadline:
            break
        time.sleep(0.01)
    return client.seen.settings.get(SETTINGS_MAX_FRAME_SIZE, 16384)


def unread_stream(target: Target, hold_s: float) -> tuple[int, str]:
    """ModelStreamInfer requests sent as fast as the windows allow, the answers never read."""
    client = RawClient(target.address)
    try:
        client.headers(1, request_headers(STREAM_INFER))
        message = grpc_message(wide_message())
        deadline = time.monotonic() + hold_s
        sent = 0
        while client.send_within_window(1, message, deadline):
            sent += 1
        took = hold_s
        return (
            1,
            f"{sent} messages ({sent * len(message) / 2**20:.0f} MiB) accepted in {took:.0f} s",
        )
    finally:
        client.close()


def unread_streams(target: Target, hold_s: float) -> tuple[int, str]:
    """As ``unread_stream``, on 100 streams of one connection at once."""
    client = RawClient(target.address)
    try:
        sids = list(range(1, 201, 2))
        for sid in sids:
            client.headers(sid, request_headers(STREAM_INFER))
        message = grpc_message(wide_message())
        deadline = time.monotonic() + hold_s
        sent = 0
        while time.monotonic() < deadline and not client.seen.closed:
            for sid in sids:
                if client.send_within_window(sid, message, time.monotonic() + 0.002):
                    sent += 1
        size = sent * len(message) / 2**20
        return 1, f"{sent} messages ({size:.0f} MiB) accepted on 100 streams"
    finally:
        client.close()


def header_list(target: Target, hold_s: float) -> tuple[int, str]:
    """One header block of about 9.4 MB of distinct fields, against a 16-64 KiB limit."""
    client = RawClient(target.address)
    try:
        size = _frame_size(client)
        fields = [(f"x-h{i}", "v" * 100) for i in range(90_000)]
        block = client.encoder.encode(request_headers(INFER) + fields)
        frames = [block[i : i + size] for i in range(0, len(block), size)]
        cpu = tree_cpu_s(target.pid)
        started = time.monotonic()
        for i, part in enumerate(frames):
            kind = HEADERS if i == 0 else CONTINUATION
            if not client.send(frame(kind, END_HEADERS if i == len(frames) - 1 else 0, 1, part)):
                break
        answered = _answer(client, 1, hold_s)
        took = time.monotonic() - started
        cpu = tree_cpu_s(target.pid) - cpu
        return 1, (
            f"{len(block) / 1e6:.1f} MB block in {len(frames)} frames: {answered} after "
            f"{took:.2f} s, server CPU {cpu:.2f} s"
        )
    finally:
        client.close()


def _answer(client: RawClient, sid: int, wait_s: float) -> str:
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        seen = client.seen
        if sid in seen.resets:
            return f"stream reset ({seen.resets[sid]})"
        if seen.goaway is not None:
            return f"GOAWAY ({seen.goaway})"
        if seen.closed:
            return "connection closed"
        for name, value in seen.headers.get(sid, []):
            if name == "grpc-status":
                return f"grpc-status {value}"
        time.sleep(0.01)
    return "no answer"


def unfinished_headers(target: Target, hold_s: float) -> tuple[int, str]:
    """A header block with no END_HEADERS: one 4 KB field indexed, then a frame of one-byte
    references to it (each stands for 4 KB), then silence."""
    client = RawClient(target.address)
    try:
        size = _frame_size(client)
        first = client.encoder.encode([*request_headers(INFER), ("x-big", "a" * 4000)])
        block = first + b"\xbe" * (size - len(first))  # index 62: the newest dynamic entry
        client.send(frame(HEADERS, 0, 1, block))
        closed = client.closed_within(hold_s)
        return 1, ("closed" if closed else "held") + f" (frame of {size} bytes)"
    finally:
        client.close()


def length_prefix(target: Target, hold_s: float) -> tuple[int, str]:
    """Eight streams, each only a 5-byte prefix declaring 128 MiB - 1 bytes (40 bytes)."""
    client = RawClient(target.address)
    try:
        declared = min(target.max_message_bytes, 128 * 1024 * 1024) - 1
        sids = list(range(1, 17, 2))
        for sid in sids:
            client.headers(sid, request_headers(INFER))
            client.data(sid, grpc_message(b"", declared=declared))
        deadline = time.monotonic() + hold_s  # or until every stream is answered and reset
        while time.monotonic() < deadline and not client.seen.closed:
            if all(sid in client.seen.resets and client.status(sid, 0.01) for sid in sids):
                break
            time.sleep(0.01)
        statuses = [client.status(sid, 0.01) for sid in sids]
        answered = [s for s in statuses if s is not None]
        resets = sum(1 for s in sids if s in client.seen.resets)
        return 1, f"{len(answered)} answered {sorted(set(answered))}, {resets} reset"
    finally:
        client.close()


def idle_connections(target: Target, hold_s: float) -> tuple[int, str]:
    """2,000 connections that send nothing and 200 that send only the preface."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 4096:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 8192), hard))
    sockets: list[socket.socket] = []
    try:
        for i in range(2200):
            s = socket.create_connection(target.address, timeout=10)
            if i >= 2000:
                s.sendall(PREFACE)
            s.setblocking(False)
            sockets.append(s)
        selector = selectors.DefaultSelector()
        for s in sockets:
            selector.register(s, selectors.EVENT_READ)
        closed: set[socket.socket] = set()
        deadline = time.monotonic() + hold_s
        while time.monotonic() < deadline and len(closed) < len(sockets):
            for key, _ in selector.select(timeout=0.2):
                ready = key.fileobj
                assert isinstance(ready, socket.socket)
                try:
                    data = ready.recv(65536)
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError:
                    data = b""
                if not data:
                    closed.add(ready)
                    selector.unregister(ready)
        selector.close()
        silent = sum(1 for s in sockets[:2000] if s in closed)
        preface = sum(1 for s in sockets[2000:] if s in closed)
        return len(
            sockets
        ), f"closed within {hold_s:.0f} s: {silent}/2000 silent, {preface}/200 preface-only"
    finally:
        for s in sockets:
            s.close()


def rapid_reset(target: Target, hold_s: float) -> tuple[int, str]:
    """Streams opened and reset at once, as fast as possible, reconnecting after a GOAWAY."""
    deadline = time.monotonic() + hold_s
    streams = connections = 0
    while time.monotonic() < deadline:
        client = RawClient(target.address)
        connections += 1
        try:
            sid = 1
            headers = request_headers(INFER)
            while time.monotonic() < deadline and not client.seen.closed:
                burst = []
                for _ in range(100):
                    burst.append(frame(HEADERS, END_HEADERS, sid, client.encoder.encode(headers)))
                    burst.append(frame(RST_STREAM, 0, sid, struct.pack(">I", CANCEL)))
                    sid += 2
                if not client.send(b"".join(burst)):
                    break
                streams += 100
                if client.seen.goaway is not None:
                    break
        finally:
            client.close()
    return connections, f"{streams} streams over {connections} connections"


def continuation_flood(target: Target, hold_s: float) -> tuple[int, str]:
    """A header block continued forever, one small CONTINUATION after another."""
    client = RawClient(target.address)
    try:
        client.headers(1, request_headers(INFER), end_headers=False)
        sent = 0
        deadline = time.monotonic() + hold_s
        while time.monotonic() < deadline and not client.seen.closed:
            if not client.send(
                frame(CONTINUATION, 0, 1, client.encoder.encode([("x-c", "c" * 64)]))
            ):
                break
            sent += 1
            time.sleep(0.001)
        closed = client.closed_within(30)  # at once when closed
        return 1, ("closed" if closed else "held") + f" after {sent} CONTINUATION frames"
    finally:
        client.close()


def big_prefixes(target: Target, hold_s: float) -> tuple[int, str]:
    """Prefixes declaring 4 GiB - 1 and the limit + 1, and a gzip bomb (256 MiB of zeros)."""
    bomb = gzip.compress(b"\0" * (256 << 20), compresslevel=9)  # before: it takes seconds
    client = RawClient(target.address)
    try:
        client.headers(1, request_headers(INFER))
        client.data(1, grpc_message(b"", declared=0xFFFFFFFF))
        client.headers(3, request_headers(INFER))
        client.data(3, grpc_message(b"", declared=target.max_message_bytes + 1))
        client.headers(5, request_headers(INFER, [("grpc-encoding", "gzip")]))
        size = _frame_size(client)
        message = grpc_message(bomb, compressed=True)
        deadline = time.monotonic() + hold_s + 5
        for i in range(0, len(message), size):
            part = message[i : i + size]
            if not client.send_within_window(5, part, deadline):
                break
        client.data(5, b"", end_stream=True)
        # Inflating the bomb up to the limit takes the server a CPU-second or more.
        statuses = [client.status(sid, hold_s + 15) for sid in (1, 3, 5)]
        return 1, f"4 GiB, limit+1, gzip bomb: grpc-status {statuses}"
    finally:
        client.close()


def unknown_methods(target: Target, hold_s: float) -> tuple[int, str]:
    """Calls to methods that do not exist, as fast as they are answered."""
    client = RawClient(target.address)
    try:
        deadline = time.monotonic() + hold_s
        sid = 1
        while time.monotonic() < deadline and not client.seen.closed:
            client.call(sid, b"x", path=f"/no.Such/Method{sid}")
            sid += 2
            if sid % 200 == 1:
                client.status(sid - 2, 2)
        last = client.status(sid - 2, 30)  # at once when answered
        return 1, f"{sid // 2} calls, last grpc-status {last}"
    finally:
        client.close()


def zero_window(target: Target, hold_s: float) -> tuple[int, str]:
    """A client that opens no window for answers and makes 64 KB calls it cannot read."""
    client = RawClient(target.address, settings={SETTINGS_INITIAL_WINDOW_SIZE: 0})
    try:
        message = grpc_message(wide_message())
        deadline = time.monotonic() + hold_s
        sid = 1
        while time.monotonic() < deadline and sid < 400 and not client.seen.closed:
            client.headers(sid, request_headers(INFER))
            if not client.send_within_window(sid, message, deadline):
                break
            client.data(sid, b"", end_stream=True)
            sid += 2
        remaining = max(0.0, deadline - time.monotonic())
        time.sleep(remaining)
        return 1, f"{sid // 2} calls of 64 KiB, {len(client.seen.resets)} reset"
    finally:
        client.close()


def many_streams(target: Target, hold_s: float) -> tuple[int, str]:
    """1,000 streams opened on one connection, none finished."""
    client = RawClient(target.address)
    try:
        _frame_size(client)  # the server's SETTINGS arrived
        advertised = client.seen.settings.get(0x3)
        for sid in range(1, 2001, 2):
            client.headers(sid, request_headers(INFER))
        deadline = time.monotonic() + hold_s  # or until the server refused streams
        while time.monotonic() < deadline and client.seen.goaway is None:
            if any(code == 0x7 for code in list(client.seen.resets.values())):
                break
            time.sleep(0.01)
        refused = sum(1 for code in client.seen.resets.values() if code == 0x7)
        goaway = client.seen.goaway
        return 1, (
            f"advertised {advertised}: {refused} refused, "
            + ("no GOAWAY" if goaway is None else f"GOAWAY ({goaway}) past them")
        )
    finally:
        client.close()


def compressed_without_encoding(target: Target, hold_s: float) -> tuple[int, str]:
    """A message flagged compressed on a call that names no grpc-encoding."""
    client = RawClient(target.address)
    try:
        client.headers(1, request_headers(INFER))
        client.data(1, grpc_message(infer_message(), compressed=True), end_stream=True)
        status = client.status(1, max(hold_s, 30))  # at once when answered
        message = dict(client.seen.headers.get(1, [])).get("grpc-message", "")
        return 1, f"grpc-status {status}: {message[:60]}"
    finally:
        client.close()


def ping_flood(target: Target, hold_s: float) -> tuple[int, str]:
    """PING frames every 10 ms on a connection with no call."""
    client = RawClient(target.address)
    try:
        deadline = time.monotonic() + hold_s
        sent = 0
        while time.monotonic() < deadline and not client.seen.closed:
            client.send(frame(PING, 0, 0, struct.pack(">Q", sent)))
            sent += 1
            time.sleep(0.01)
        return 1, f"{sent} pings, GOAWAY {client.seen.goaway}, closed {client.closed_within(0.5)}"
    finally:
        client.close()


PROBES: dict[str, Probe] = {
    "unread stream": unread_stream,
    "unread streams x100": unread_streams,
    "header list 9.4 MB": header_list,
    "unfinished header block": unfinished_headers,
    "length prefix 128 MiB x8": length_prefix,
    "idle connections": idle_connections,
    "rapid reset": rapid_reset,
    "CONTINUATION flood": continuation_flood,
    "big prefixes, gzip bomb": big_prefixes,
    "unknown methods": unknown_methods,
    "zero window": zero_window,
    "many streams": many_streams,
    "compressed, no encoding": compressed_without_encoding,
    "ping flood": ping_flood,
}


def measure(
    target: Target,
    name: str,
    probe: Probe,
    client: RealClient,
    hold_s: float = 5.0,
    idle_s: float = 2.0,
    settle_s: float = 3.0,
) -> Outcome:
    """Run ``probe`` with the server's RSS sampled and ``client``'s latency recorded."""
    idle_from = time.perf_counter()
    time.sleep(idle_s)
    before = tree_rss(target.pid)
    peak = before
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, tree_rss(target.pid))
            time.sleep(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    started = time.perf_counter()
    try:
        connections, note = probe(target, hold_s)
    finally:
        ended = time.perf_counter()
        done.set()
        sampler.join()
    time.sleep(settle_s)
    after = tree_rss(target.pid)
    return Outcome(
        name,
        connections,
        max(0, peak - before),
        max(0, after - before),
        client.p99(idle_from, started),
        client.p99(started, ended),
        client.count(started, ended),
        note,
    )
