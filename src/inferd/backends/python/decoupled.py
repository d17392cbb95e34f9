"""Decoupled Triton Python models (``model_transaction_policy { decoupled: true }``): each
request's responses go to the server as the model sends them, 0..N per request.

``execute`` sends through ``request.get_response_sender()`` and returns None; responses sent
on the worker's main thread leave at once, those sent from the model's own threads are queued
and sent by the main thread, which waits after ``execute`` until every request's final flag.
Each request's own result is then empty: its responses have already reached the server.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Sequence
from typing import Any

from inferd.backends import process
from inferd.backends.python import pb_utils
from inferd.backends.python.modelfile import where
from inferd.backends.python.triton import TritonExecutor, log
from inferd.backends.work import Executed, Result, Work
from inferd.core.errors import InternalError

# How long a request may wait for its final flag after execute() returned.
FINAL_WAIT_S = 300.0


class DecoupledExecutor(TritonExecutor):
    """A ``TritonPythonModel`` whose requests get any number of responses."""

    def execute(self, batch: Sequence[Work]) -> Executed:
        host = process.current()
        if host is None:
            error = InternalError(f"model '{self.label}': decoupled models run in worker processes")
            return Executed([error] * len(batch))
        started = time.perf_counter_ns()
        main = threading.get_ident()
        later: queue.SimpleQueue[tuple[int, Any, int]] = queue.SimpleQueue()
        finals = [False] * len(batch)
        requests = [self._request(w, host) for w in batch]

        def emitter(index: int) -> Any:
            def emit(response: pb_utils.InferenceResponse | None, flags: int) -> None:
                if threading.get_ident() == main:
                    self._forward(host, batch, finals, index, response, flags)
                else:
                    later.put((index, response, flags))

            return emit

        for index, request in enumerate(requests):
            request._emit = emitter(index)
        built = time.perf_counter_ns()
        try:
            returned = (
                self._loop.run_until_complete(self._execute(requests))
                if self._loop is not None
                else self._execute(requests)
            )
        except Exception as exc:
            log.error("model '%s' failed while executing", self.label, exc_info=exc)
            failed = InternalError(f"model '{self.label}' failed: {where(exc, self.path)}")
            return Executed([failed] * len(batch), built - started)
        if returned is not None:
            wrong = InternalError(
                f"model '{self.label}' is decoupled: execute() must return None and send "
                "responses through request.get_response_sender()"
            )
            return Executed([wrong] * len(batch), built - started)
        deadline = time.monotonic() + FINAL_WAIT_S
        while not all(finals):
            try:
                item = later.get(timeout=max(deadline - time.monotonic(), 0.0))
            except queue.Empty:
                break
            self._forward(host, batch, finals, *item)
        results: list[Result] = [
            {}
            if done
            else InternalError(
                f"model '{self.label}' sent no final response for request "
                f"'{batch[i].request_id}' within {FINAL_WAIT_S:.0f} s"
            )
            for i, done in enumerate(finals)
        ]
        return Executed(results, built - started, time.perf_counter_ns() - built)

    def _forward(
        self,
        host: process.ProcessSide,
        batch: Sequence[Work],
        finals: list[bool],
        index: int,
        response: pb_utils.InferenceResponse | None,
        flags: int,
    ) -> None:
        final = bool(flags & pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        result: Result = {} if response is None else self._result(batch[index], response)
        if response is None and not final:
            return  # nothing to send
        host.send_response(index, result, final)
        finals[index] = finals[index] or final
