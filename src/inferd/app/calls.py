"""The values ``inferd.Server``'s calls take and give: Python values in, one ``InferRequest``
for the data plane; an ``InferResponse`` out, its arrays as a dict. Arrays pass both ways as
they are (no copies): a numpy array goes to the model as given, and what the model made comes
back. Like a protocol codec, this is an edge: it makes string tensors what the core expects
(object arrays of ``bytes``) and leaves every other check (names, datatypes, shapes) to the core.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from inferd.core.errors import InvalidInput
from inferd.core.types import InferRequest, InferResponse, Parameters, RequestedOutput, Tensors

# What ``outputs=`` takes: output names, or names with their parameters (``classification``).
OutputsWanted = Sequence[str] | Mapping[str, Mapping[str, Any]]


class Outputs(dict[str, np.ndarray]):
    """One response: each output's numpy array by name, as the model made it.

    Also carries which model version answered, the request id, and the response's
    parameters (a decoupled model's responses carry ``triton_final_response``). Arrays from a
    model with a response cache are read-only: the cache holds them too."""

    __slots__ = ("id", "model_name", "model_version", "parameters")

    def __init__(self, response: InferResponse) -> None:
        super().__init__(response.outputs)
        self.model_name = response.model_name
        self.model_version = response.model_version
        self.id = response.id
        self.parameters: Parameters = response.parameters

    def __repr__(self) -> str:
        return (
            f"Outputs({dict.__repr__(self)}, model_name={self.model_name!r}, "
            f"model_version={self.model_version!r})"
        )


def build_request(
    model: str,
    inputs: Mapping[str, Any],
    version: str | int = "",
    outputs: OutputsWanted | None = None,
    parameters: Mapping[str, Any] | None = None,
    request_id: str = "",
) -> InferRequest:
    """The request a call describes; a value that is no numpy array becomes one
    (``numpy.asarray``), and strings become the object arrays of ``bytes`` models get."""
    if not isinstance(model, str) or not model:
        raise InvalidInput(f"the model name must be a non-empty string, got {model!r}")
    if not isinstance(inputs, Mapping):
        raise InvalidInput(
            f"inputs must be a mapping of input name to array, got {type(inputs).__name__}"
        )
    arrays: Tensors = {}
    for name, value in inputs.items():
        if not isinstance(name, str):
            raise InvalidInput(f"input names must be strings, got {name!r}")
        if type(value) is not np.ndarray or value.dtype.kind in "OUS":
            value = _array(name, value)
        arrays[name] = value
    return InferRequest(
        model,
        arrays,
        str(version) if version != "" else "",
        request_id,
        None if outputs is None else _requested(outputs),
        dict(parameters) if parameters else {},
    )


def _array(name: str, value: Any) -> np.ndarray:
    array = value if isinstance(value, np.ndarray) else np.asarray(value)
    kind = array.dtype.kind
    if kind == "S":  # fixed-width bytes: numpy drops each item's trailing NULs here
        return array.astype(object)
    if kind == "U":
        return np.array([s.encode() for s in array.ravel().tolist()], object).reshape(array.shape)
    if kind != "O":
        return array
    items = array.ravel().tolist()
    if all(type(item) is bytes for item in items):
        return array
    encoded: list[bytes] = []
    for item in items:
        if isinstance(item, str):
            encoded.append(item.encode())
        elif isinstance(item, bytes | bytearray | memoryview):
            encoded.append(bytes(item))
        else:
            raise InvalidInput(
                f"input '{name}': a string tensor holds bytes or str, not {type(item).__name__}"
            )
    out = np.empty(len(encoded), object)
    out[:] = encoded
    return out.reshape(array.shape)


def _requested(outputs: OutputsWanted) -> list[RequestedOutput]:
    if isinstance(outputs, str):
        raise InvalidInput(f"outputs must be a list of output names, got the string {outputs!r}")
    if isinstance(outputs, Mapping):
        return [RequestedOutput(str(name), dict(p)) for name, p in outputs.items()]
    return [RequestedOutput(name) for name in outputs]
