"""Binary v2 requests' JSON headers, decoded once per distinct header.

A client of the binary tensor extension (``tritonclient``, ``perf_analyzer``) sends the same
JSON header with every request of one shape: the inputs' names, datatypes, shapes and byte
sizes. Parsing and checking it again per request is most of the decode's cost; a header seen
before is looked up by its exact bytes instead, and only the tensors are read from the body.

Only headers that decoded without error are remembered, and only those whose every input is
binary data (no JSON ``data``, no shared memory region), with no request ``id`` (a client that
numbers its requests sends a new header each time) and at most ``MAX_HEADER_BYTES`` long. A
remembered header whose body does not match it (another binary size) takes the full decode,
which names the problem.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from inferd.core import datatypes
from inferd.core.datatypes import DataType
from inferd.core.types import InferRequest, Parameters, RequestedOutput
from inferd.protocols import codecs

MAX_HEADER_BYTES = 4096
KEPT = 256  # distinct headers remembered; when full, forgotten all at once


@dataclass(frozen=True, slots=True)
class HeaderPlan:
    """What a binary request's header says; read only, shared by every request sending it."""

    inputs: tuple[tuple[str, DataType, tuple[int, ...], int], ...]  # name, type, shape, bytes
    binary_bytes: int
    outputs: tuple[RequestedOutput, ...] | None
    parameters: Parameters
    input_parameters: dict[str, Parameters]

    def decode(self, binary: memoryview, model: str, version: str) -> InferRequest | None:
        """The request, reading the tensors from ``binary``; None when ``binary`` does not
        hold the bytes the header declares (the full decode then says what is wrong)."""
        if len(binary) != self.binary_bytes:
            return None
        inputs = {}
        offset = 0
        for name, datatype, shape, size in self.inputs:
            end = offset + size
            if datatype.is_bytes:
                inputs[name] = codecs.from_raw(name, datatype, shape, binary[offset:end])
            else:  # the full decode found ``size`` right for this shape: no check again
                inputs[name] = np.ndarray(shape, datatype.numpy, binary[offset:end])
            offset = end
        outputs = self.outputs
        parameters = self.parameters
        return InferRequest(
            model,
            inputs,
            version,
            "",
            None if outputs is None else list(outputs),
            dict(parameters) if parameters else {},  # handlers may add to it
            dict(self.input_parameters),
        )


class HeaderPlans:
    """Plans of the binary headers seen lately, by their bytes."""

    def __init__(self) -> None:
        self._plans: dict[bytes, HeaderPlan] = {}
        # The plan of a header, None if not remembered: the dict's own get, one call less
        # (the dict is only ever cleared in place, never replaced).
        self.get: Callable[[bytes], HeaderPlan | None] = self._plans.get

    def __len__(self) -> int:
        return len(self._plans)

    def remember(self, header: bytes, doc: dict[str, Any], request: InferRequest) -> None:
        """Keep the plan of ``header``, whose parse ``doc`` decoded into ``request`` without
        error; headers that do not qualify (module docstring) are left out."""
        if len(header) > MAX_HEADER_BYTES or request.id:
            return
        inputs = []
        size = 0
        for item in doc["inputs"]:
            params = item.get("parameters")
            if not params or "binary_data_size" not in params:
                return  # JSON data or shared memory: not planned
            name = item["name"]
            array = request.inputs[name]
            nbytes = params["binary_data_size"]
            inputs.append((name, datatypes.from_name(item["datatype"]), array.shape, nbytes))
            size += nbytes
        outputs = request.outputs
        plans = self._plans
        if len(plans) >= KEPT:
            plans.clear()
        plans[header] = HeaderPlan(
            tuple(inputs),
            size,
            None if outputs is None else tuple(outputs),
            dict(request.parameters),  # the handler may add to the request's own
            dict(request.input_parameters),
        )
