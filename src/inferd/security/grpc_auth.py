"""The gRPC side of access control: one ``grpc.aio.ServerInterceptor`` for every RPC of every
service on the port (KServe v2 including ModelStreamInfer, TF Serving, health, reflection).
Each method's access class comes from the service that serves it (``access_of``, built by
``inferd.protocols.transport.grpc_services.access_table`` from the classes each service declares).

A call without the token its RPC needs gets UNAUTHENTICATED, one with the wrong scope
PERMISSION_DENIED, before any handler or deserializer runs. The token is the ``authorization``
metadata (``Bearer <token>`` or the bare token).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from inferd.core.errors import ErrorCode, InferdError
from inferd.security.access import Access, AccessPolicy

# The statuses of the two refusals ``AccessPolicy.check`` raises (as every gRPC servicer answers
# these codes: ``inferd.protocols.grpc_common.STATUS_OF``).
REFUSAL_STATUS: dict[ErrorCode, grpc.StatusCode] = {
    ErrorCode.UNAUTHENTICATED: grpc.StatusCode.UNAUTHENTICATED,
    ErrorCode.PERMISSION_DENIED: grpc.StatusCode.PERMISSION_DENIED,
}


def _denial(handler: Any, code: grpc.StatusCode, message: str) -> Any:
    """A handler of the same kind as ``handler`` that only answers ``code``."""

    async def deny(request: Any, context: Any) -> Any:
        await context.abort(code, message)

    if handler is None:
        return None
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(deny)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(deny)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(deny)
    return grpc.unary_unary_rpc_method_handler(deny)


class AuthInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    def __init__(self, policy: AccessPolicy, access_of: Callable[[str], Access]) -> None:
        """``access_of``: ``/package.Service/Method`` -> the access class of its calls."""
        self.policy = policy
        self.access_of = access_of
        self._checked = {
            a: policy.needs_token(a) or (a is Access.ADMIN and policy.admin_off()) for a in Access
        }

    @property
    def active(self) -> bool:
        """Whether any call can be refused (else the server runs without the interceptor)."""
        return any(self._checked.values())

    def passes(self, method: str) -> bool:
        """Whether calls to ``method`` pass unchecked (the native server then skips this
        interceptor for them; it would only call its continuation)."""
        return not self._checked[self.access_of(method)]

    def refusal(self, method: str, authorization: str | None) -> tuple[grpc.StatusCode, str] | None:
        """The status that refuses a call on its method and token alone, or None to let it
        in: the native server asks this as soon as a call's headers are complete, so an
        unauthenticated client's body is never buffered."""
        access = self.access_of(method)
        if not self._checked[access]:
            return None
        try:
            self.policy.check(access, authorization)
        except InferdError as exc:
            return REFUSAL_STATUS[exc.code], exc.message
        return None

    async def intercept_service(
        self,
        continuation: Callable[[Any], Awaitable[Any]],
        details: Any,
    ) -> Any:
        access = self.access_of(details.method)
        if not self._checked[access]:
            return await continuation(details)
        authorization = None
        for key, value in details.invocation_metadata or ():
            if key == "authorization":
                authorization = value if isinstance(value, str) else value.decode("latin-1")
                break
        try:
            self.policy.check(access, authorization)
        except InferdError as exc:
            return _denial(await continuation(details), REFUSAL_STATUS[exc.code], exc.message)
        return await continuation(details)
