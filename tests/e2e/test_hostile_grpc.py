"""Hostile clients against the native gRPC server (the default): each probe of
``hostile_probes`` reproduces one way a client on the network could make the server hold memory
or stall, and the server must bound it, answer it and free it.

Probes are frame-level HTTP/2 clients on loopback; each is bounded in time and closes what it
opened. Memory is the RSS of the server's whole process tree (psutil), compared before and
after each probe; latencies are printed, never asserted. Timeouts are shortened (1-3 s) so the
closes they cause happen within the test; docs/security/limits.md gives the defaults.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from inferd.protocols import grpc_service_pb2 as pb
from inferd.protocols import grpc_service_pb2_grpc as pb_grpc
from tests.e2e.hostile_probes import (
    WIDE,
    Target,
    big_prefixes,
    compressed_without_encoding,
    continuation_flood,
    header_list,
    length_prefix,
    many_streams,
    rapid_reset,
    unfinished_headers,
    unknown_methods,
    unread_stream,
    unread_streams,
    zero_window,
)
from tests.e2e.hostile_support import (
    PING,
    PREFACE,
    STREAM_INFER,
    RawClient,
    frame,
    infer_message,
    request_headers,
    tree_rss,
    write_echo_model,
)
from tests.support import ServerProcess

MIB = 1024 * 1024
SHORT = [
    "--grpc-server",
    "native",
    "--grpc-header-timeout-s",
    "1",
    "--grpc-body-timeout-s",
    "1",
    "--grpc-idle-timeout-s",
    "2",
    "--grpc-keepalive-time",
    "1000",
    "--grpc-keepalive-timeout",
    "1000",
]


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = write_echo_model(tmp_path_factory.mktemp("hostile") / "models")
    write_echo_model(root, "wide")
    (root / "wide" / "config.pbtxt").write_text(WIDE)
    return root


@pytest.fixture(scope="module")
def native(repo: Path) -> Iterator[ServerProcess]:
    server = ServerProcess(repo, extra_args=SHORT).start()
    yield server
    server.stop()


def _target(server: ServerProcess) -> Target:
    assert server.proc is not None
    return Target(server.proc.pid, server.host, server.grpc_port)


def _serves(server: ServerProcess) -> None:
    """A real client's call still answers."""
    with grpc.insecure_channel(server.grpc_address) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)  # type: ignore[no-untyped-call]
        request = pb.ModelInferRequest.FromString(infer_message())
        assert stub.ModelInfer(request, timeout=60).outputs[0].name == "OUTPUT0"


def _settled(pid: int, baseline: int, slack: int, wait_s: float = 30.0) -> int:
    """The tree's RSS growth over ``baseline``, once it is under ``slack`` or after wait_s."""
    deadline = time.monotonic() + wait_s
    grown = tree_rss(pid) - baseline
    while grown > slack and time.monotonic() < deadline:
        time.sleep(0.2)
        grown = tree_rss(pid) - baseline
    return grown


def test_a_stream_never_read_is_throttled_by_flow_control(native: ServerProcess) -> None:
    target = _target(native)
    before = tree_rss(target.pid)
    _, note = unread_stream(target, 2.0)
    messages = int(note.split()[0])
    # 64 KiB requests: the window (1 MiB) and the unread answers (1 MiB) bound what a call
    # takes; the old server took every one of them (thousands in 2 s).
    assert messages * 64 * 1024 < 16 * MIB, note
    _, note = unread_streams(target, 2.0)
    print(f"\n{note}")
    # 100 such streams on one connection: a few tens of MiB at the peak (grpcio: gigabytes),
    # of which each process that held the messages (with several workers, the frontend that
    # took the connection and the model host that ran the calls) keeps what its allocator took.
    slack = 32 * MIB * min(2, native.workers())
    assert _settled(target.pid, before, slack) < slack
    _serves(native)


def test_the_header_list_limit_is_enforced_as_fields_arrive(native: ServerProcess) -> None:
    target = _target(native)
    before = tree_rss(target.pid)
    _, note = header_list(target, 30.0)  # returns once answered
    print(f"\n{note}")
    assert "reset" in note or "GOAWAY" in note or "closed" in note, note
    _, note = unfinished_headers(target, 30.0)  # returns once closed
    assert note.startswith("closed"), note  # within --grpc-header-timeout-s (1 s) and a sweep
    assert _settled(target.pid, before, 8 * MIB) < 8 * MIB
    with grpc.insecure_channel(native.grpc_address) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)  # type: ignore[no-untyped-call]
        request = pb.ModelInferRequest.FromString(infer_message())
        assert stub.ModelInfer(request, metadata=[("x-ok", "a" * 8000)], timeout=60).outputs
        with pytest.raises(grpc.RpcError):  # 32 KiB of metadata, past the 16 KiB list
            stub.ModelInfer(request, metadata=[("x-big", "a" * 32000)], timeout=60)
    _serves(native)


def test_a_length_prefix_allocates_only_what_arrived(native: ServerProcess) -> None:
    target = _target(native)
    before = tree_rss(target.pid)
    _, note = length_prefix(target, 30.0)  # returns once all are answered
    # Eight prefixes declaring 128 MiB each: nothing allocated for them, and each stream
    # answered DEADLINE_EXCEEDED once its request stalled past --grpc-body-timeout-s.
    assert note.startswith("8 answered ['4']"), note
    assert tree_rss(target.pid) - before < 32 * MIB
    _, note = big_prefixes(target, 5.0)
    assert note.endswith("['8', '8', '8']"), note  # 4 GiB, limit + 1, gzip bomb
    _serves(native)


def test_authentication_is_decided_on_the_headers(repo: Path) -> None:
    token = "s3cret"
    server = ServerProcess(repo, extra_args=[*SHORT, "--auth-token", token]).start()
    try:
        target = _target(server)
        before = tree_rss(target.pid)
        _, note = length_prefix(target, 30.0)
        assert note.startswith("8 answered ['16'], 8 reset"), note  # UNAUTHENTICATED at once
        assert tree_rss(target.pid) - before < 16 * MIB
    finally:
        server.stop()


def test_silent_greeting_only_and_idle_connections_are_closed(native: ServerProcess) -> None:
    silent = [RawClient((native.host, native.grpc_port), preface=False) for _ in range(50)]
    preface_only = [RawClient((native.host, native.grpc_port), preface=False) for _ in range(20)]
    for client in preface_only:
        client.send(PREFACE)
    greeted = [RawClient((native.host, native.grpc_port)) for _ in range(20)]
    try:
        for client in silent + preface_only:
            client.sock.settimeout(30)
        assert all(_peer_closed(c) for c in silent)  # --grpc-header-timeout-s 1
        assert all(_peer_closed(c) for c in preface_only)
        assert all(c.closed_within(30) for c in greeted)  # --grpc-idle-timeout-s 2
        assert all(c.seen.goaway == 0 for c in greeted)  # a GOAWAY (NO_ERROR) first
    finally:
        for client in silent + preface_only + greeted:
            client.close()
    _serves(native)


def _peer_closed(client: RawClient) -> bool:
    try:
        while client.sock.recv(65536):
            pass
    except TimeoutError:
        return False
    except OSError:
        pass
    return True


def test_keepalive_closes_a_connection_that_does_not_answer_pings(native: ServerProcess) -> None:
    answering = RawClient((native.host, native.grpc_port))
    silent = RawClient((native.host, native.grpc_port), answer_pings=False)
    try:
        for client in (answering, silent):  # an open call: the idle timeout does not apply
            client.headers(1, request_headers(STREAM_INFER))
        assert silent.closed_within(30)  # --grpc-keepalive-time 1 s + --grpc-keepalive-timeout 1 s
        assert not answering.seen.closed
    finally:
        answering.close()
        silent.close()


def test_streams_and_pings_past_their_limits(native: ServerProcess) -> None:
    target = _target(native)
    _, note = many_streams(target, 30.0)  # returns once refused
    assert note.startswith("advertised 100:"), note
    assert "GOAWAY" in note or " 0 refused" not in note, note
    client = RawClient((native.host, native.grpc_port))
    try:
        for i in range(10):
            client.send(frame(PING, 0, 0, i.to_bytes(8, "big")))
        assert client.closed_within(30)
        assert client.seen.goaway == 0xB  # ENHANCE_YOUR_CALM: too_many_pings
    finally:
        client.close()


def test_a_compressed_message_without_an_encoding_is_internal(native: ServerProcess) -> None:
    _, note = compressed_without_encoding(_target(native), 1.0)
    assert note.startswith("grpc-status 13:"), note


def test_what_already_held_still_holds(native: ServerProcess) -> None:
    target = _target(native)
    before = tree_rss(target.pid)
    connections, note = rapid_reset(target, 2.0)
    print(f"\nrapid reset: {note}")
    assert connections > 1  # each connection is ended (GOAWAY) after its burst of resets
    _, note = continuation_flood(target, 2.0)
    assert note.startswith("closed"), note
    _, note = unknown_methods(target, 1.0)
    assert note.endswith("grpc-status 12"), note
    _, note = zero_window(target, 1.0)
    print(f"zero window: {note}")
    # Hundreds of connections came and went: what stays (14-17 MiB measured, 2 MiB when glibc
    # trims) is the allocator's free lists, not theirs; far under 16 MiB per connection.
    assert _settled(target.pid, before, 32 * MIB) < 32 * MIB
    _serves(native)
