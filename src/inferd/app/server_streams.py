"""``inferd.Server``'s streaming calls: the responses to one request as the model sends them,
read from another thread (an iterator) or on the server's loop (an async iterator)."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from inferd.app.calls import Outputs, OutputsWanted, build_request
from inferd.app.server_loop import ServerLoop
from inferd.core.types import InferRequest

if TYPE_CHECKING:
    from inferd.plane.dataplane import DataPlane

_END = object()  # what ``_next`` returns when a stream has ended


class StreamCalls(ServerLoop):
    """``infer_stream`` and ``async_infer_stream``, through the server's data plane."""

    plane: DataPlane

    def infer_stream(
        self,
        model: str,
        inputs: Mapping[str, Any],
        *,
        version: str | int = "",
        outputs: OutputsWanted | None = None,
        parameters: Mapping[str, Any] | None = None,
        request_id: str = "",
    ) -> Iterator[Outputs]:
        """The responses to one request as the model sends them: a decoupled model's 0..N,
        any other model's one. Leaving the loop early cancels the request."""
        request = build_request(model, inputs, version, outputs, parameters, request_id)
        stream = self._stream(request)
        try:
            while True:
                item = self._block(_next(stream))
                if item is _END:
                    return
                assert isinstance(item, Outputs)
                yield item
        finally:
            if self._loop is not None and not self._stopped and not self._loop.is_closed():
                self._block(stream.aclose())

    def async_infer_stream(
        self,
        model: str,
        inputs: Mapping[str, Any],
        *,
        version: str | int = "",
        outputs: OutputsWanted | None = None,
        parameters: Mapping[str, Any] | None = None,
        request_id: str = "",
    ) -> AsyncIterator[Outputs]:
        """``infer_stream`` as an async iterator on the server's event loop."""
        self._check_loop()
        return self._stream(build_request(model, inputs, version, outputs, parameters, request_id))

    async def _stream(self, request: InferRequest) -> AsyncGenerator[Outputs, None]:
        async for response in self.plane.infer_stream(request):
            if response.outputs or not response.parameters.get("triton_final_response"):
                yield Outputs(response)  # a bare final flag ends the stream: not a response


async def _next(stream: AsyncIterator[Outputs]) -> object:
    try:
        return await stream.__anext__()
    except StopAsyncIteration:
        return _END
