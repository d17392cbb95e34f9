"""Tensors that name a system shared-memory region (``shared_memory_region``, ``_offset``,
``_byte_size`` parameters, on HTTP and gRPC alike): inputs become numpy views over the region,
outputs are written into it, and neither crosses the socket."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from inferd.core.datatypes import DataType
from inferd.core.errors import InvalidInput
from inferd.core.types import InferResponse, RequestedOutput
from inferd.plane.shared_memory import SystemSharedMemory
from inferd.protocols import codecs

REGION = "shared_memory_region"
OFFSET = "shared_memory_offset"
BYTE_SIZE = "shared_memory_byte_size"


def names_region(params: Mapping[str, Any] | None) -> bool:
    return params is not None and REGION in params


def _window(name: str, params: Mapping[str, Any]) -> tuple[str, int, int]:
    region = params[REGION]
    if not isinstance(region, str) or not region:
        raise InvalidInput(f"tensor '{name}': '{REGION}' must be a region name")
    if BYTE_SIZE not in params:
        raise InvalidInput(f"tensor '{name}': '{BYTE_SIZE}' is missing")
    numbers = []
    for key, value in ((OFFSET, params.get(OFFSET, 0)), (BYTE_SIZE, params[BYTE_SIZE])):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise InvalidInput(f"tensor '{name}': '{key}' must be a non-negative integer")
        numbers.append(value)
    return region, numbers[0], numbers[1]


def read_input(
    regions: SystemSharedMemory,
    name: str,
    datatype: DataType,
    shape: tuple[int, ...],
    params: Mapping[str, Any],
) -> np.ndarray:
    """The input as a numpy view over its region (BYTES elements are read out)."""
    region, offset, byte_size = _window(name, params)
    return codecs.from_raw(name, datatype, shape, regions.window(region, offset, byte_size, name))


def write_outputs(
    regions: SystemSharedMemory,
    response: InferResponse,
    requested: Sequence[RequestedOutput] | None,
) -> list[str]:
    """Write every output asked for in shared memory into its region; the names written (the
    rest of the outputs travel on the wire)."""
    written: list[str] = []
    for output in requested or ():
        if not names_region(output.parameters) or output.name not in response.outputs:
            continue
        region, offset, byte_size = _window(output.name, output.parameters)
        raw = codecs.to_raw(response.outputs[output.name])
        if len(raw) > byte_size:
            raise InvalidInput(
                f"output '{output.name}' needs {len(raw)} bytes but its shared memory window "
                f"'{region}' has {byte_size}"
            )
        regions.window(region, offset, byte_size, output.name)[: len(raw)] = raw
        written.append(output.name)
    return written
