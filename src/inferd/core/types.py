"""The one request/response representation every protocol decodes into and encodes from."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

# Tensors inside the server: name -> numpy array. BYTES are object arrays of ``bytes``.
Tensors = dict[str, np.ndarray]
Parameters = dict[str, Any]

LABEL_PARAMETER = "version_label"  # request parameter naming a version label (routing reads it)


@dataclass(slots=True)
class RequestedOutput:
    """An output the client asked for, with its per-output wire parameters (e.g. binary_data)."""

    name: str
    parameters: Parameters = field(default_factory=dict)


@dataclass(slots=True)
class Handover:
    """A request whose inputs are its own alone (a TorchServe body): a worker-process instance
    that has copied them into shared memory empties their bytearrays, so that a large body is
    held once on its way to the model, not until the answer. ``taken``: it did; the request
    cannot run again (no second try on another version, no shadow copy)."""

    taken: bool = False


@dataclass(slots=True)
class InferRequest:
    model_name: str
    inputs: Tensors
    model_version: str = ""  # "" selects the model's default version
    id: str = ""
    # None: every output of the model. Otherwise only these, in this order.
    outputs: list[RequestedOutput] | None = None
    parameters: Parameters = field(default_factory=dict)
    # Per-input parameters the client sent (passed through; the core ignores them).
    input_parameters: dict[str, Parameters] = field(default_factory=dict)
    handover: Handover | None = None  # set by a protocol that gives up its inputs

    def output_names(self) -> list[str] | None:
        return None if self.outputs is None else [o.name for o in self.outputs]


@dataclass(slots=True)
class Timings:
    """``perf_counter_ns`` timestamps of one request's phases in a model (0: not reached)."""

    queue_start_ns: int = 0
    compute_start_ns: int = 0
    compute_end_ns: int = 0


@dataclass(slots=True)
class InferResponse:
    model_name: str
    model_version: str
    outputs: Tensors
    id: str = ""
    parameters: Parameters = field(default_factory=dict)
    timings: Timings | None = None


# Infer with any loaded model of the server, through its scheduler (a Python model's calls).
ModelCaller = Callable[[InferRequest], Awaitable[InferResponse]]
