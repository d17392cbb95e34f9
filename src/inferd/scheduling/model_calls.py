"""Calls a worker process makes to other models of the server (BLS): the ``call`` message is
read into an InferRequest, run through the called model's own scheduler on the server's loop,
and answered with a ``called`` message on the same channel."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from inferd.backends.work import Result
from inferd.core.errors import InferdError, InternalError
from inferd.core.types import InferRequest, ModelCaller, RequestedOutput
from inferd.scheduling.channel import Channel
from inferd.scheduling.eager import run_eagerly
from inferd.scheduling.launch import refuse_call
from inferd.scheduling.wire import Encoder, decode_tensors, encode_result

log = logging.getLogger("inferd.scheduling")

Reply = Callable[[Any], None]  # sends ``called``'s payload to the worker that asked
Alive = Callable[[], bool]  # whether that worker is still the one on the channel


class ModelCalls:
    """Serves one model's calls to others; ``call_model`` is None where calls are refused."""

    def __init__(self, name: str, call_model: ModelCaller | None) -> None:
        self.name = name
        self.call_model = call_model
        self._tasks: set[asyncio.Task[None]] = set()

    def serve(self, channel: Channel, payload: Any, reply: Reply, alive: Alive) -> None:
        call_id, model, version, request_id, outputs, parameters, inputs = payload
        if self.call_model is None:
            refuse_call(channel, call_id, "not available to this model")
            return
        try:
            tensors = decode_tensors(channel, inputs)
        except Exception as exc:
            result: Result = InternalError(f"a call to model '{model}' could not be read: {exc}")
            reply((call_id, encode_result(Encoder(channel), result)))
            return
        request = InferRequest(
            model,
            tensors,
            model_version=version,
            id=request_id,
            outputs=[RequestedOutput(n) for n in outputs] if outputs else None,
            parameters=dict(parameters),
        )
        # Most called models answer without suspending: no task, no loop iteration per call.
        task = run_eagerly(self._answer(channel, call_id, request, reply, alive))
        if task is not None:
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _answer(
        self, channel: Channel, call_id: int, request: InferRequest, reply: Reply, alive: Alive
    ) -> None:
        assert self.call_model is not None
        result: Result
        try:
            result = (await self.call_model(request)).outputs
        except InferdError as exc:
            result = exc
        except Exception as exc:
            log.exception("model '%s' calling '%s'", self.name, request.model_name)
            result = InternalError(f"calling model '{request.model_name}' failed: {exc}")
        del request
        if not alive():
            return  # the worker that asked is gone
        try:
            encoded = encode_result(Encoder(channel), result)
        except Exception as exc:
            encoded = encode_result(Encoder(channel), InternalError(str(exc)))
        reply((call_id, encoded))
