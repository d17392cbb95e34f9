"""Hostile HTTP/2 clients for the gRPC port, shared by tests/e2e/test_hostile_grpc.py and
benchmarks/hostile_grpc.py: a frame-level client (hand-made frames, HPACK from the ``hpack``
package, frames read back with ``hyperframe``), a real client measuring its latency, and the
memory of the server's whole process tree (psutil)."""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import psutil
from hpack import Decoder, Encoder
from hyperframe.frame import Frame

from inferd.protocols import grpc_service_pb2 as pb
from inferd.protocols import grpc_service_pb2_grpc as pb_grpc

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = (
    0x0,
    0x1,
    0x3,
    0x4,
    0x6,
    0x7,
    0x8,
    0x9,
)
END_STREAM, ACK, END_HEADERS = 0x1, 0x1, 0x4
SETTINGS_INITIAL_WINDOW_SIZE, SETTINGS_MAX_FRAME_SIZE = 0x4, 0x5
INFER = "/inference.GRPCInferenceService/ModelInfer"
STREAM_INFER = "/inference.GRPCInferenceService/ModelStreamInfer"
DEFAULT_WINDOW = 65535

ECHO = """backend: "echo"
max_batch_size: 8
input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [1] }]
"""


def write_echo_model(root: Path, name: str = "fast") -> Path:
    """A model repository holding one echo model (FP32 [1]) named ``name``."""
    (root / name / "1").mkdir(parents=True, exist_ok=True)
    (root / name / "config.pbtxt").write_text(ECHO)
    return root


def tree_rss(pid: int) -> int:
    """RSS of a process and all its descendants, in bytes."""
    try:
        root = psutil.Process(pid)
        processes = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0
    total = 0
    for process in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            total += process.memory_info().rss
    return total


class Peak:
    """The tree's highest RSS, sampled every ``every_s`` while in the ``with`` block."""

    def __init__(self, pid: int, every_s: float = 0.01) -> None:
        self.pid, self.every_s = pid, every_s
        self.start = self.peak = tree_rss(pid)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Peak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self.peak = max(self.peak, tree_rss(self.pid))


def tree_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process and its descendants."""
    root = psutil.Process(pid)
    total = 0.0
    for process in [root, *root.children(recursive=True)]:
        with contextlib.suppress(psutil.NoSuchProcess):
            times = process.cpu_times()
            total += times.user + times.system
    return total


def infer_message(model: str = "fast", value: float = 1.0) -> bytes:
    request = pb.ModelInferRequest(model_name=model)
    tensor = request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 1])
    tensor.contents.fp32_contents.append(value)
    return request.SerializeToString()


def grpc_message(payload: bytes, compressed: bool = False, declared: int | None = None) -> bytes:
    """A length-prefixed gRPC message; ``declared`` overrides the length in the prefix."""
    length = len(payload) if declared is None else declared
    return struct.pack(">BI", 1 if compressed else 0, length) + payload


def frame(kind: int, flags: int, sid: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + struct.pack(">BBI", kind, flags, sid) + payload


def settings_frame(values: dict[int, int] | None = None, ack: bool = False) -> bytes:
    body = b"".join(struct.pack(">HI", k, v) for k, v in (values or {}).items())
    return frame(SETTINGS, ACK if ack else 0, 0, body)


def request_headers(
    path: str = INFER, extra: Sequence[tuple[str, str]] = (), authority: str = "localhost"
) -> list[tuple[str, str]]:
    return [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", path),
        (":authority", authority),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
        *extra,
    ]


@dataclass
class Seen:
    """What a raw client read back from the server."""

    frames: list[tuple[int, int, int]] = field(default_factory=list)  # (type, flags, sid)
    headers: dict[int, list[tuple[str, str]]] = field(default_factory=dict)
    resets: dict[int, int] = field(default_factory=dict)  # sid -> error code
    goaway: int | None = None  # its error code
    closed: bool = False
    send_window: int = DEFAULT_WINDOW  # the connection's, as the server opened it
    stream_windows: dict[int, int] = field(default_factory=dict)
    initial_window: int = DEFAULT_WINDOW
    settings: dict[int, int] = field(default_factory=dict)
    data_bytes: int = 0


class RawClient:
    """An HTTP/2 client that writes whatever frames it is told to, and a thread that reads the
    server's frames, answers SETTINGS and PING (unless told not to) and tracks the windows the
    server grants. It never sends WINDOW_UPDATE: the server's answers stall at 64 KiB."""

    def __init__(
        self,
        address: tuple[str, int],
        settings: dict[int, int] | None = None,
        preface: bool = True,
        answer_pings: bool = True,
    ) -> None:
        self.sock = socket.create_connection(address, timeout=10)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.encoder = Encoder()
        self.seen = Seen()
        self.answer_pings = answer_pings
        self._lock = threading.Lock()
        self._granted = threading.Condition()
        self._reader: threading.Thread | None = None
        if preface:
            self.send(PREFACE + settings_frame(settings))
            self._reader = threading.Thread(target=self._read, daemon=True)
            self._reader.start()

    def send(self, data: bytes) -> bool:
        with self._lock:
            try:
                self.sock.sendall(data)
                return True
            except OSError:
                self.seen.closed = True
                return False

    def headers(
        self,
        sid: int,
        fields: Sequence[tuple[str, str]],
        end_stream: bool = False,
        end_headers: bool = True,
    ) -> bool:
        flags = (END_STREAM if end_stream else 0) | (END_HEADERS if end_headers else 0)
        return self.send(frame(HEADERS, flags, sid, self.encoder.encode(list(fields))))

    def data(self, sid: int, payload: bytes, end_stream: bool = False) -> bool:
        return self.send(frame(DATA, END_STREAM if end_stream else 0, sid, payload))

    def call(
        self, sid: int, payload: bytes, path: str = INFER, extra: Sequence[tuple[str, str]] = ()
    ) -> None:
        self.headers(sid, request_headers(path, extra))
        self.data(sid, grpc_message(payload), end_stream=True)

    def send_within_window(self, sid: int, payload: bytes, deadline: float) -> bool:
        """Send ``payload`` in DATA frames as the server's windows let it; False at the
        deadline or when the connection closed."""
        most = self.seen.settings.get(SETTINGS_MAX_FRAME_SIZE, 16384)
        for start in range(0, len(payload), most):
            part = payload[start : start + most]
            with self._granted:
                while True:
                    seen = self.seen
                    stream = seen.stream_windows.get(sid, seen.initial_window)
                    if seen.closed or time.monotonic() >= deadline:
                        return False
                    if min(seen.send_window, stream) >= len(part):
                        seen.send_window -= len(part)
                        seen.stream_windows[sid] = stream - len(part)
                        break
                    self._granted.wait(0.05)
            if not self.data(sid, part):
                return False
        return True

    def status(self, sid: int, timeout_s: float = 5.0) -> str | None:
        """The grpc-status the server answered on ``sid`` (None: none within the time)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for name, value in self.seen.headers.get(sid, []):
                if name == "grpc-status":
                    return value
            if sid in self.seen.resets or self.seen.closed:
                for name, value in self.seen.headers.get(sid, []):
                    if name == "grpc-status":
                        return value
                return None
            time.sleep(0.01)
        return None

    def closed_within(self, seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self.seen.closed:
                return True
            time.sleep(0.02)
        return self.seen.closed

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        if self._reader is not None:
            self._reader.join(timeout=5)

    def _read(self) -> None:
        decoder = Decoder()
        decoder.max_header_list_size = 1 << 24
        buffer = b""
        blocks: dict[int, bytes] = {}
        self.sock.settimeout(None)
        while True:
            try:
                chunk = self.sock.recv(1 << 16)
            except OSError:
                chunk = b""
            if not chunk:
                self.seen.closed = True
                with self._granted:
                    self._granted.notify_all()
                return
            buffer += chunk
            while len(buffer) >= 9:
                head, length = Frame.parse_frame_header(memoryview(buffer[:9]))
                if len(buffer) < 9 + length:
                    break
                body, buffer = buffer[9 : 9 + length], buffer[9 + length :]
                names = {str(f) for f in head.flags}
                self._on_frame(head.type or 0, names, head.stream_id, body, decoder, blocks)

    def _on_frame(
        self,
        kind: int,
        flags: set[str],
        sid: int,
        body: bytes,
        decoder: Decoder,
        blocks: dict[int, bytes],
    ) -> None:
        seen = self.seen
        seen.frames.append((kind, 0, sid))
        if kind == SETTINGS and "ACK" not in flags:
            for i in range(0, len(body), 6):
                key, value = struct.unpack(">HI", body[i : i + 6])
                seen.settings[key] = value
                if key == SETTINGS_INITIAL_WINDOW_SIZE:
                    with self._granted:
                        delta = value - seen.initial_window
                        seen.initial_window = value
                        for s in seen.stream_windows:
                            seen.stream_windows[s] += delta
                        self._granted.notify_all()
            self.send(settings_frame(ack=True))
        elif kind == PING and "ACK" not in flags and self.answer_pings:
            self.send(frame(PING, ACK, 0, body))
        elif kind == WINDOW_UPDATE:
            (increment,) = struct.unpack(">I", body)
            with self._granted:
                if sid == 0:
                    seen.send_window += increment
                else:
                    window = seen.stream_windows.get(sid, seen.initial_window)
                    seen.stream_windows[sid] = window + increment
                self._granted.notify_all()
        elif kind in (HEADERS, CONTINUATION):
            blocks[sid] = blocks.get(sid, b"") + _unpad(body, flags, kind == HEADERS)
            if "END_HEADERS" in flags:
                fields = decoder.decode(blocks.pop(sid))
                seen.headers.setdefault(sid, []).extend((str(n), str(v)) for n, v in fields)
        elif kind == RST_STREAM:
            seen.resets[sid] = struct.unpack(">I", body)[0]
        elif kind == GOAWAY:
            seen.goaway = struct.unpack(">I", body[4:8])[0]
        elif kind == DATA:
            seen.data_bytes += len(body)


def _unpad(body: bytes, flags: set[str], headers: bool) -> bytes:
    start, end = 0, len(body)
    if "PADDED" in flags:
        start, end = 1, len(body) - body[0]
    if headers and "PRIORITY" in flags:
        start += 5
    return body[start:end]


class RealClient:
    """A real client (grpcio) calling ModelInfer in a loop, recording each call's latency."""

    def __init__(self, address: str, model: str = "fast") -> None:
        self.channel = grpc.insecure_channel(address)
        self.stub = pb_grpc.GRPCInferenceServiceStub(self.channel)  # type: ignore[no-untyped-call]
        self.request = pb.ModelInferRequest.FromString(infer_message(model))
        self.samples: list[tuple[float, float]] = []  # (when, seconds)
        self.failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> RealClient:
        self.stub.ModelInfer(self.request, timeout=10)  # connected before timing starts
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=15)
        self.channel.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.perf_counter()
            try:
                self.stub.ModelInfer(self.request, timeout=10)
            except grpc.RpcError:
                self.failures += 1
                time.sleep(0.01)
                continue
            self.samples.append((started, time.perf_counter() - started))
            time.sleep(0.005)

    def p99(self, since: float, until: float | None = None) -> float:
        """The 99th percentile latency of calls started in [since, until), in seconds."""
        end = until if until is not None else float("inf")
        values = sorted(s for when, s in self.samples if since <= when < end)
        if not values:
            return float("nan")
        return values[min(len(values) - 1, int(len(values) * 0.99))]

    def count(self, since: float, until: float | None = None) -> int:
        end = until if until is not None else float("inf")
        return sum(1 for when, _ in self.samples if since <= when < end)


@contextlib.contextmanager
def clients(address: tuple[str, int], count: int, **kw: object) -> Iterator[list[RawClient]]:
    opened: list[RawClient] = []
    try:
        for _ in range(count):
            opened.append(RawClient(address, **kw))  # type: ignore[arg-type]
        yield opened
    finally:
        for c in opened:
            c.close()
