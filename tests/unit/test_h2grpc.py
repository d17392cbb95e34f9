"""The native gRPC server (HTTP/2 from libnghttp2) against grpcio's own client: statuses and
messages, deadlines, cancellation, streaming both ways, compression, metadata, interceptors,
message limits and a graceful stop."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import pytest

from inferd.protocols.transport.grpc_services import GrpcService, access_table
from inferd.protocols.transport.h2grpc.server import NativeGrpcServer
from inferd.security.access import Access

SERVICE = "test.Echo"
identity: Callable[[bytes], bytes] = bytes


class Servicer:
    def __init__(self) -> None:
        self.cancelled = asyncio.Event()
        self.started = asyncio.Event()
        self.metadata: dict[str, Any] = {}

    async def unary(self, request: bytes, context: Any) -> bytes:
        self.metadata = dict(context.invocation_metadata())
        if request == b"abort":
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "bad input: ünïcode 100%")
        if request == b"code":
            context.set_code(grpc.StatusCode.NOT_FOUND)
            context.set_details("set, not raised")
            return b""
        if request == b"crash":
            raise ValueError("a bug")
        if request == b"slow":
            self.started.set()
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                self.cancelled.set()
                raise
        context.set_trailing_metadata((("x-trailer", "t"), ("x-blob-bin", b"\x00\x01")))
        return request[::-1]

    async def server_stream(self, request: bytes, context: Any) -> AsyncIterator[bytes]:
        for i in range(int(request)):
            yield str(i).encode()

    async def bidi(self, requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
        async for request in requests:
            yield request.upper()

    async def client_stream(self, requests: AsyncIterator[bytes], context: Any) -> bytes:
        return b"+".join([r async for r in requests])


def _handlers(servicer: Servicer) -> dict[str, Any]:
    kw: dict[str, Any] = {"request_deserializer": identity, "response_serializer": identity}
    return {
        "Unary": grpc.unary_unary_rpc_method_handler(servicer.unary, **kw),
        "ServerStream": grpc.unary_stream_rpc_method_handler(servicer.server_stream, **kw),
        "Bidi": grpc.stream_stream_rpc_method_handler(servicer.bidi, **kw),
        "ClientStream": grpc.stream_unary_rpc_method_handler(servicer.client_stream, **kw),
    }


_INFERENCE = {m: Access.INFERENCE for m in ("Unary", "ServerStream", "Bidi", "ClientStream")}


class Counting(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    def __init__(self) -> None:
        self.methods: list[str] = []

    async def intercept_service(
        self, continuation: Callable[[Any], Awaitable[Any]], details: Any
    ) -> Any:
        self.methods.append(details.method)
        if dict(details.invocation_metadata).get("authorization") == "deny":
            return None
        return await continuation(details)


async def _serve(
    body: Callable[[grpc.aio.Channel, Servicer, NativeGrpcServer], Awaitable[None]],
    *,
    max_message_bytes: int = 1 << 20,
    interceptors: list[Any] | None = None,
) -> None:
    servicer = Servicer()
    server = NativeGrpcServer(max_message_bytes=max_message_bytes, interceptors=interceptors or [])
    server.add_registered_method_handlers(SERVICE, _handlers(servicer))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            await body(channel, servicer, server)
    finally:
        await server.stop(0)


def _unary(channel: grpc.aio.Channel, method: str = "Unary") -> Any:
    return channel.unary_unary(f"/{SERVICE}/{method}")


def test_unary_answers_and_carries_metadata_both_ways() -> None:
    async def body(channel: grpc.aio.Channel, servicer: Servicer, _: Any) -> None:
        call = _unary(channel)(b"abc", metadata=(("x-key", "v"), ("x-raw-bin", b"\xff\x00")))
        assert await call == b"cba"
        trailing = dict(await call.trailing_metadata())
        assert trailing["x-trailer"] == "t" and trailing["x-blob-bin"] == b"\x00\x01"
        assert servicer.metadata["x-key"] == "v" and servicer.metadata["x-raw-bin"] == b"\xff\x00"
        # many calls on one connection, concurrently
        answers = await asyncio.gather(*(_unary(channel)(str(i).encode()) for i in range(50)))
        assert answers == [str(i).encode()[::-1] for i in range(50)]

    asyncio.run(_serve(body))


@pytest.mark.parametrize(
    ("request_", "code", "details"),
    [
        (b"abort", grpc.StatusCode.INVALID_ARGUMENT, "bad input: ünïcode 100%"),
        (b"code", grpc.StatusCode.NOT_FOUND, "set, not raised"),
        (b"crash", grpc.StatusCode.UNKNOWN, "Unexpected error in the server"),
    ],
)
def test_errors_carry_their_code_and_message(
    request_: bytes, code: grpc.StatusCode, details: str
) -> None:
    async def body(channel: grpc.aio.Channel, *_: Any) -> None:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await _unary(channel)(request_)
        assert info.value.code() == code and info.value.details() == details
        assert await _unary(channel)(b"ok") == b"ko"  # the connection serves on

    asyncio.run(_serve(body))


def test_unknown_method_is_unimplemented() -> None:
    async def body(channel: grpc.aio.Channel, *_: Any) -> None:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await channel.unary_unary("/test.Echo/Nope")(b"")
        assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
        assert "/test.Echo/Nope" in (info.value.details() or "")

    asyncio.run(_serve(body))


def test_a_deadline_and_a_client_cancel_stop_the_handler() -> None:
    async def body(channel: grpc.aio.Channel, servicer: Servicer, _: Any) -> None:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await _unary(channel)(b"slow", timeout=0.2)
        assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        await asyncio.wait_for(servicer.cancelled.wait(), 5)
        servicer.cancelled.clear()
        servicer.started.clear()
        call = _unary(channel)(b"slow")
        await asyncio.wait_for(servicer.started.wait(), 5)
        call.cancel()
        await asyncio.wait_for(servicer.cancelled.wait(), 5)  # the server dropped the work

    asyncio.run(_serve(body))


def test_streams_in_every_direction() -> None:
    async def body(channel: grpc.aio.Channel, *_: Any) -> None:
        out = [m async for m in channel.unary_stream(f"/{SERVICE}/ServerStream")(b"4")]
        assert out == [b"0", b"1", b"2", b"3"]
        bidi = channel.stream_stream(f"/{SERVICE}/Bidi")()
        for word in (b"a", b"bc", b"def"):
            await bidi.write(word)
            assert await bidi.read() == word.upper()
        await bidi.done_writing()
        assert await bidi.read() == grpc.aio.EOF

        async def words() -> AsyncIterator[bytes]:
            for w in (b"x", b"y", b"z"):
                yield w

        assert await channel.stream_unary(f"/{SERVICE}/ClientStream")(words()) == b"x+y+z"

    asyncio.run(_serve(body))


def test_compressed_requests_and_big_messages() -> None:
    async def body(channel: grpc.aio.Channel, *_: Any) -> None:
        payload = bytes(range(256)) * 2048  # 512 KiB: many DATA frames
        assert await _unary(channel)(payload, compression=grpc.Compression.Gzip) == payload[::-1]
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await _unary(channel)(b"x" * (1 << 21))  # 2 MiB over the 1 MiB limit
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "larger than max" in (info.value.details() or "")
        assert await _unary(channel)(b"still") == b"llits"

    asyncio.run(_serve(body))


def test_interceptors_see_every_call_and_can_refuse() -> None:
    counting = Counting()

    async def body(channel: grpc.aio.Channel, *_: Any) -> None:
        assert await _unary(channel)(b"ab") == b"ba"
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await _unary(channel)(b"ab", metadata=(("authorization", "deny"),))
        assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
        assert counting.methods == [f"/{SERVICE}/Unary"] * 2

    asyncio.run(_serve(body, interceptors=[counting]))


def test_a_graceful_stop_lets_calls_in_flight_finish() -> None:
    async def run() -> None:
        servicer = Servicer()
        server = NativeGrpcServer(max_message_bytes=1 << 20)
        server.add_registered_method_handlers(SERVICE, _handlers(servicer))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stream = channel.unary_stream(f"/{SERVICE}/ServerStream")(b"3")
            first = await stream.read()
            await server.stop(5)
            assert first == b"0"
        assert await server.wait_for_termination(1) is True

    asyncio.run(run())


def test_a_port_in_use_is_refused() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = NativeGrpcServer(max_message_bytes=1024)
        with pytest.raises(RuntimeError, match="Failed to bind"):
            server.add_insecure_port(f"127.0.0.1:{port}")


def test_the_auth_interceptor_answers_its_codes() -> None:
    """inferd's interceptor refuses with a handler that aborts and has no deserializer: the
    request is never parsed, and the status reaches the client."""
    from inferd.security.access import AccessPolicy
    from inferd.security.grpc_auth import AuthInterceptor
    from inferd.security.tokens import TokenStore

    policy = AccessPolicy(TokenStore(["inference-token"], ["admin-token"]))

    async def body(channel: grpc.aio.Channel, servicer: Servicer, _: Any) -> None:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await _unary(channel)(b"ab")
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert "needs a token" in (info.value.details() or "")
        bidi = channel.stream_stream(f"/{SERVICE}/Bidi")(
            metadata=(("authorization", "Bearer wrong"),)
        )
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await bidi.read()
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        good = (("authorization", "Bearer inference-token"),)
        assert await _unary(channel)(b"ab", metadata=good) == b"ba"
        assert servicer.metadata["authorization"] == "Bearer inference-token"

    access_of = access_table([GrpcService(SERVICE, _handlers(Servicer()), _INFERENCE)])
    asyncio.run(_serve(body, interceptors=[AuthInterceptor(policy, access_of)]))


def test_calls_past_the_concurrency_limit_are_refused_at_once() -> None:
    async def run() -> None:
        servicer = Servicer()
        server = NativeGrpcServer(max_message_bytes=1 << 20, max_concurrent_rpcs=1)
        server.add_registered_method_handlers(SERVICE, _handlers(servicer))
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                slow = _unary(channel)(b"slow")
                await asyncio.wait_for(servicer.started.wait(), 5)
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await _unary(channel)(b"ab")
                assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
                slow.cancel()
                await asyncio.wait_for(servicer.cancelled.wait(), 5)
                await asyncio.sleep(0.05)
                assert server.active_calls == 0
                assert await _unary(channel)(b"ab") == b"ba"  # a place is free again
        finally:
            await server.stop(0)

    asyncio.run(run())


def test_an_interceptor_is_skipped_only_for_the_methods_it_passes() -> None:
    """With no tokens and the admin API off, inferd's interceptor passes inference calls
    (the server skips it for them) and still refuses admin ones."""
    from inferd.security.access import AccessPolicy
    from inferd.security.grpc_auth import AuthInterceptor
    from inferd.security.tokens import TokenStore

    access = _INFERENCE | {"RepositoryModelLoad": Access.ADMIN}
    handlers = _handlers(Servicer())
    handlers["RepositoryModelLoad"] = handlers["Unary"]
    auth = AuthInterceptor(
        AccessPolicy(TokenStore()), access_table([GrpcService(SERVICE, handlers, access)])
    )
    assert auth.active
    assert auth.passes(f"/{SERVICE}/Unary")
    assert not auth.passes(f"/{SERVICE}/RepositoryModelLoad")

    async def run() -> None:
        servicer = Servicer()
        server = NativeGrpcServer(max_message_bytes=1 << 20, interceptors=[auth])
        handlers = _handlers(servicer)
        handlers["RepositoryModelLoad"] = handlers["Unary"]
        server.add_registered_method_handlers(SERVICE, handlers)
        assert not server.intercepts(f"/{SERVICE}/Unary")
        assert server.intercepts(f"/{SERVICE}/RepositoryModelLoad")
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                assert await _unary(channel)(b"ab") == b"ba"
                load = channel.unary_unary(f"/{SERVICE}/RepositoryModelLoad")
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await load(b"ab")
                assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
                assert "admin API is off" in (info.value.details() or "")
        finally:
            await server.stop(0)

    asyncio.run(run())

    counting = NativeGrpcServer(max_message_bytes=1 << 20, interceptors=[auth, Counting()])
    counting.add_registered_method_handlers(SERVICE, _handlers(Servicer()))
    assert counting.intercepts(f"/{SERVICE}/Unary")  # an interceptor without passes() runs
