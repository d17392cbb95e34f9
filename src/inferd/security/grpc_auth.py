"""The gRPC side of access control: one ``grpc.aio.ServerInterceptor`` for every RPC of every
service on the port (KServe v2 including ModelStreamInfer, TF Serving, health, reflection).

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

_HEALTH_SERVICE = "grpc.health.v1.Health"
_HEALTH_METHODS = frozenset({"ServerLive", "ServerReady"})
# TorchServe's gRPC: its inference service's Ping is health, its management service admin.
_TORCHSERVE_INFERENCE = "org.pytorch.serve.grpc.inference.InferenceAPIsService"
_ADMIN_SERVICES = frozenset({"org.pytorch.serve.grpc.management.ManagementAPIsService"})
# Changes to the server (trace and log settings name files it writes): the admin scope.
# Shared-memory registration is part of inference, as in Triton: an inference token.
_ADMIN_METHODS = frozenset(
    {
        "RepositoryModelLoad",
        "RepositoryModelUnload",
        "TraceSetting",
        "LogSettings",
        "HandleReloadConfigRequest",  # TF Serving's ModelService
    }
)


def access_of(full_method: str) -> Access:
    """The access class of ``/package.Service/Method``; inference for anything else."""
    service, _, method = full_method.lstrip("/").rpartition("/")
    if service == _HEALTH_SERVICE or method in _HEALTH_METHODS:
        return Access.HEALTH
    if service == _TORCHSERVE_INFERENCE and method == "Ping":
        return Access.HEALTH
    if method in _ADMIN_METHODS or service in _ADMIN_SERVICES:
        return Access.ADMIN
    return Access.INFERENCE


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
    def __init__(self, policy: AccessPolicy) -> None:
        self.policy = policy
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
        return not self._checked[access_of(method)]

    def refusal(self, method: str, authorization: str | None) -> tuple[grpc.StatusCode, str] | None:
        """The status that refuses a call on its method and token alone, or None to let it
        in: the native server asks this as soon as a call's headers are complete, so an
        unauthenticated client's body is never buffered."""
        access = access_of(method)
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
        access = access_of(details.method)
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
