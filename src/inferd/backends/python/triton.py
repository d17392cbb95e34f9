"""Triton's form of a Python model: ``TritonPythonModel`` behind the request-level seam.

``execute`` gets the batch as ``pb_utils.InferenceRequest`` objects (ids, parameters,
requested outputs, sequence controls) and returns one ``InferenceResponse`` per request (or
sends each through ``request.get_response_sender()``). An exception in ``execute`` fails that
batch's requests and the worker lives on; an ``InferenceResponse(error=...)`` fails its one
request with the status its ``TritonError`` code names. ``async def execute`` runs on an event
loop of the worker's own, so it can ``await`` calls to other models.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from inferd.backends import process
from inferd.backends.python import pb_utils
from inferd.backends.python.modelfile import where
from inferd.backends.work import Executed, Result, Work, check_rows
from inferd.core.errors import InferdError, InternalError, ModelLoadError
from inferd.core.types import Tensors

log = logging.getLogger("inferd.scheduling")  # where a batch executor's failures are logged


def conform(label: str, name: str, value: Any, wanted: Any) -> np.ndarray:
    """An output as its config declares it: BYTES as an object array of ``bytes``, numbers
    cast to the declared type when numpy casts within the kind (float64 -> float32)."""
    array: np.ndarray = np.asarray(value)
    if wanted is None or array.dtype == wanted:
        return array
    if wanted.kind == "O":
        if array.dtype.kind in "OSU":
            converted: np.ndarray = pb_utils.Tensor(name, array).as_numpy()
            return converted
    elif array.dtype.kind not in "OSU" and np.can_cast(array.dtype, wanted, "same_kind"):
        cast: np.ndarray = array.astype(wanted)
        return cast
    raise InternalError(
        f"model '{label}' returned output '{name}' as {array.dtype}, which its config's "
        f"{np.dtype(wanted)} cannot hold"
    )


def wanted_outputs(
    label: str, wanted: Iterable[str], given: Mapping[str, Any], types: Mapping[str, Any]
) -> Tensors:
    """The ``wanted`` outputs of what a model returned, each as its config declares it; an
    InternalError names an output the model did not return."""
    outputs: Tensors = {}
    for name in wanted:
        if name not in given:
            raise InternalError(
                f"model '{label}' returned no output '{name}' (it returned "
                f"{', '.join(repr(n) for n in given) or 'none'})"
            )
        outputs[name] = conform(label, name, given[name], types.get(name))
    return outputs


def output_types(config: dict[str, Any]) -> dict[str, Any]:
    """Declared numpy dtype of each output (None: unknown)."""
    types = {}
    for output in config.get("output", ()):
        numpy = pb_utils.triton_string_to_numpy(output.get("data_type", ""))
        types[output["name"]] = None if numpy is None else np.dtype(numpy)
    return types


class TritonExecutor:
    """One instance of a ``TritonPythonModel``."""

    inline = False

    def __init__(
        self,
        model_class: type[Any],
        path: Path,
        args: dict[str, str],
        config: dict[str, Any],
        label: str,
    ) -> None:
        self.label = label
        self.path = path
        self._name = args["model_name"]
        self._version = int(args["model_version"])
        self._batching = int(config.get("max_batch_size") or 0) > 0
        self._types = output_types(config)
        try:
            self.model = model_class()
            initialize = getattr(self.model, "initialize", None)
            if initialize is not None:
                initialize(args)
        except Exception as exc:
            raise ModelLoadError(
                f"model '{label}': initialize() raised {where(exc, path)}"
            ) from None
        execute = getattr(self.model, "execute", None)
        if execute is None:
            raise ModelLoadError(f"{path}: {type(self.model).__name__} has no execute()")
        self._execute = execute
        self._loop = asyncio.new_event_loop() if inspect.iscoroutinefunction(execute) else None

    def _request(self, work: Work, host: process.ProcessSide | None) -> pb_utils.InferenceRequest:
        request = pb_utils.InferenceRequest(
            request_id=work.request_id,
            correlation_id=work.correlation_id or 0,
            inputs=[pb_utils.Tensor(name, array) for name, array in work.inputs.items()],
            requested_output_names=list(work.outputs),
            model_name=self._name,
            model_version=self._version,
            flags=work.flags,
            parameters=work.parameters,
        )
        if host is not None:
            request._cancelled = host.is_cancelled
        return request

    def execute(self, batch: Sequence[Work]) -> Executed:
        started = time.perf_counter_ns()
        host = process.current()
        requests = [self._request(w, host) for w in batch]
        built = time.perf_counter_ns()
        try:
            if self._loop is not None:
                returned = self._loop.run_until_complete(self._execute(requests))
            else:
                returned = self._execute(requests)
        except Exception as exc:
            if isinstance(exc, pb_utils.TritonModelException):
                error: InferdError = InternalError(f"model '{self.label}': {exc.message()}")
            else:
                log.error("model '%s' failed while executing", self.label, exc_info=exc)
                error = InternalError(f"model '{self.label}' failed: {where(exc, self.path)}")
            return Executed([error] * len(batch), built - started, time.perf_counter_ns() - built)
        executed = time.perf_counter_ns()
        results = self._results(batch, requests, returned)
        return Executed(
            results, built - started, executed - built, time.perf_counter_ns() - executed
        )

    def _results(
        self, batch: Sequence[Work], requests: list[pb_utils.InferenceRequest], returned: Any
    ) -> list[Result]:
        if returned is None:  # every response went through a response sender
            responses: list[Any] = [r._sent for r in requests]
        elif isinstance(returned, list | tuple) and len(returned) == len(batch):
            responses = [
                sent if response is None and (sent := request._sent) is not None else response
                for response, request in zip(returned, requests, strict=True)
            ]
        else:
            count = len(returned) if isinstance(returned, list | tuple) else type(returned).__name__
            error = InternalError(
                f"model '{self.label}': execute() returned {count} for {len(batch)} request(s); "
                "it must return one InferenceResponse per request"
            )
            return [error] * len(batch)
        return [self._result(w, r) for w, r in zip(batch, responses, strict=True)]

    def _result(self, work: Work, response: Any) -> Result:
        if not isinstance(response, pb_utils.InferenceResponse):
            got = "no response" if response is None else type(response).__name__
            return InternalError(
                f"model '{self.label}' gave {got} for request '{work.request_id}' "
                "instead of an InferenceResponse"
            )
        error = response.error()
        if error is not None:
            return error.as_inferd()
        given = {t.name(): t.as_numpy() for t in response.output_tensors()}
        try:
            outputs = wanted_outputs(self.label, work.outputs, given, self._types)
            if self._batching:
                check_rows(self.label, outputs, work.rows)
        except InferdError as exc:
            return exc
        return outputs

    def close(self) -> None:
        """``finalize()``, once the instance's work is done."""
        finalize = getattr(self.model, "finalize", None)
        try:
            if finalize is not None:
                finalize()
        finally:
            if self._loop is not None:
                self._loop.close()
