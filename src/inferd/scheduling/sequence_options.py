"""What the sequence batcher reads from ``sequence_batching``: the strategy and its limits, the
control inputs it feeds the model, and the implicit state it keeps per sequence; plus the
sequence parameters of a request (``sequence_id``, ``sequence_start``, ``sequence_end``).

Control tensors and state tensors are built here, already shaped for one request (a batching
model gets ``[rows, ...]``), so the batcher only adds them to the request's inputs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from inferd.config.model_config_pb2 import ModelConfig, ModelSequenceBatching
from inferd.config.spec import datatype_of
from inferd.core.errors import ConfigError, InvalidInput
from inferd.core.types import Tensors

Control = ModelSequenceBatching.Control
DEFAULT_IDLE_US = 1_000_000  # Triton's default max_sequence_idle_microseconds

SequenceId = int | str


@dataclass(frozen=True, slots=True)
class ControlInput:
    name: str
    kind: int  # Control.Kind
    dtype: np.dtype[Any]
    false_true: tuple[Any, Any]  # values for false and true (START, END, READY)


@dataclass(frozen=True, slots=True)
class StateSpec:
    input_name: str
    output_name: str
    dtype: np.dtype[Any]
    dims: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class SequenceOptions:
    oldest: bool  # the oldest strategy (else direct: a sequence pinned to one instance)
    max_batch_size: int
    max_queue_delay_us: int
    minimum_slot_utilization: float  # direct
    max_candidate_sequences: int  # oldest; 0: as many as the instances have batch slots
    preferred_batch_size: int  # oldest; 0: max_batch_size
    max_sequence_idle_us: int
    controls: tuple[ControlInput, ...]
    states: tuple[StateSpec, ...]

    @classmethod
    def from_config(cls, config: ModelConfig) -> SequenceOptions:
        seq = config.sequence_batching
        oldest = seq.WhichOneof("strategy_choice") == "oldest"
        if oldest:
            delay_us = seq.oldest.max_queue_delay_microseconds
            preferred = max(seq.oldest.preferred_batch_size, default=0)
        else:
            delay_us = seq.direct.max_queue_delay_microseconds
            preferred = 0
        if not 0.0 <= seq.direct.minimum_slot_utilization <= 1.0:
            raise ConfigError("sequence_batching.direct.minimum_slot_utilization must be in 0..1")
        return cls(
            oldest=oldest,
            max_batch_size=config.max_batch_size,
            max_queue_delay_us=delay_us,
            minimum_slot_utilization=seq.direct.minimum_slot_utilization,
            max_candidate_sequences=max(seq.oldest.max_candidate_sequences, 0),
            preferred_batch_size=preferred,
            max_sequence_idle_us=seq.max_sequence_idle_microseconds or DEFAULT_IDLE_US,
            controls=tuple(_controls(seq)),
            states=tuple(_state(s) for s in seq.state),
        )

    def feed(
        self, rows: int, corr_id: SequenceId, start: bool, end: bool, state: Tensors
    ) -> Tensors:
        """The control and state inputs of one request (``rows`` 0: the model does not batch)."""
        fed: Tensors = {}
        lead = (rows,) if rows else ()
        for control in self.controls:
            if control.kind == Control.CONTROL_SEQUENCE_CORRID:
                value: Any = corr_id
                if control.dtype.kind != "O" and not isinstance(corr_id, int):
                    raise InvalidInput(
                        f"control input '{control.name}' takes a numeric sequence_id, "
                        f"got '{corr_id}'"
                    )
                if control.dtype.kind == "O":
                    value = str(corr_id).encode()
            else:
                on = (
                    start
                    if control.kind == Control.CONTROL_SEQUENCE_START
                    else end
                    if control.kind == Control.CONTROL_SEQUENCE_END
                    else True  # READY: this request is there
                )
                value = control.false_true[1 if on else 0]
            fed[control.name] = np.full((*lead, 1), value, dtype=control.dtype)
        for spec in self.states:
            fed[spec.input_name] = state[spec.input_name]
        return fed

    def initial_state(self, rows: int) -> Tensors:
        """Every state input at its start: zeros of its dims."""
        lead = (rows,) if rows else ()
        return {s.input_name: np.zeros((*lead, *s.dims), dtype=s.dtype) for s in self.states}


def _controls(seq: ModelSequenceBatching) -> list[ControlInput]:
    found = []
    for control_input in seq.control_input:
        if len(control_input.control) != 1:
            raise ConfigError(
                f"sequence_batching control_input '{control_input.name}' must have exactly one "
                "control"
            )
        control = control_input.control[0]
        name = control_input.name
        if control.kind == Control.CONTROL_SEQUENCE_CORRID:
            if not control.data_type:
                raise ConfigError(f"control input '{name}' (CORRID) needs a data_type")
            dtype = datatype_of(control.data_type, f"control input '{name}'").numpy
            found.append(ControlInput(name, control.kind, dtype, (0, 0)))
            continue
        pairs: list[tuple[np.dtype[Any], tuple[Any, ...]]] = [
            (np.dtype(np.int32), tuple(control.int32_false_true)),
            (np.dtype(np.float32), tuple(control.fp32_false_true)),
            (np.dtype(np.bool_), tuple(control.bool_false_true)),
        ]
        given = [(dtype, values) for dtype, values in pairs if values]
        if len(given) != 1 or len(given[0][1]) != 2:
            raise ConfigError(
                f"control input '{name}' needs one of int32_false_true, fp32_false_true or "
                "bool_false_true with two values (false, true)"
            )
        dtype, values = given[0]
        found.append(ControlInput(name, control.kind, dtype, (values[0], values[1])))
    return found


def _state(state: ModelSequenceBatching.State) -> StateSpec:
    where = f"sequence_batching state '{state.input_name}'"
    if not state.input_name or not state.output_name:
        raise ConfigError(f"{where} needs an input_name and an output_name")
    if not state.data_type:
        raise ConfigError(f"{where} needs a data_type")
    dims = tuple(state.dims)
    for initial in state.initial_state:
        if not initial.zero_data:
            raise ConfigError(f"{where}: initial_state supports zero_data only")
        dims = tuple(initial.dims) or dims
    if any(d < 0 for d in dims):
        raise ConfigError(f"{where}: dims {list(dims)} must be fixed (or give initial_state dims)")
    dtype = datatype_of(state.data_type, where).numpy
    return StateSpec(state.input_name, state.output_name, dtype, dims)


def sequence_parameters(params: Mapping[str, Any]) -> tuple[SequenceId, bool, bool]:
    """``sequence_id`` (a non-zero integer or a non-empty string), ``sequence_start`` and
    ``sequence_end`` of a request to a sequence model."""
    corr_id = params.get("sequence_id")
    if isinstance(corr_id, bool) or not isinstance(corr_id, int | str) or corr_id in (0, ""):
        raise InvalidInput(
            "a request to a sequence model must give a non-zero 'sequence_id' (an integer or a "
            "string)"
        )
    flags = []
    for key in ("sequence_start", "sequence_end"):
        value = params.get(key, False)
        if not isinstance(value, bool):
            raise InvalidInput(f"parameter '{key}' must be a boolean")
        flags.append(value)
    return corr_id, flags[0], flags[1]
