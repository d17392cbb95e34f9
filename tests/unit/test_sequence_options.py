"""sequence_batching read from a config: control inputs fed as Triton feeds them, implicit state
at its start, config errors named, and a request's sequence parameters checked."""

from __future__ import annotations

import numpy as np
import pytest

from inferd.config.text import parse_config_text
from inferd.core.errors import ConfigError, InvalidInput
from inferd.scheduling.sequence_options import SequenceOptions, sequence_parameters

CONFIG = """
name: "m"
max_batch_size: 8
sequence_batching {
  max_sequence_idle_microseconds: 5000
  oldest { max_candidate_sequences: 3 preferred_batch_size: [ 2, 4 ]
           max_queue_delay_microseconds: 100 }
  control_input [
    { name: "S" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
    { name: "E" control [ { kind: CONTROL_SEQUENCE_END fp32_false_true: [ 0.5, 2.5 ] } ] },
    { name: "R" control [ { kind: CONTROL_SEQUENCE_READY bool_false_true: [ false, true ] } ] },
    { name: "C" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_INT64 } ] }
  ]
  state [ { input_name: "h" output_name: "h_out" data_type: TYPE_FP32 dims: [ 2, 3 ] } ]
}
"""


def test_controls_and_state_as_the_model_sees_them() -> None:
    options = SequenceOptions.from_config(parse_config_text(CONFIG))
    assert options.oldest and options.max_candidate_sequences == 3
    assert options.preferred_batch_size == 4 and options.max_queue_delay_us == 100
    assert options.max_sequence_idle_us == 5000
    state = options.initial_state(rows=2)
    assert state["h"].shape == (2, 2, 3) and not state["h"].any()
    fed = options.feed(2, 77, start=True, end=False, state=state)
    assert fed["S"].tolist() == [[1], [1]] and fed["S"].dtype == np.int32
    assert fed["E"].tolist() == [[0.5], [0.5]] and fed["E"].dtype == np.float32
    assert fed["R"].tolist() == [[True], [True]]
    assert fed["C"].tolist() == [[77], [77]] and fed["C"].dtype == np.int64
    assert fed["h"] is state["h"]
    with pytest.raises(InvalidInput, match="numeric sequence_id"):
        options.feed(1, "text", start=False, end=True, state=options.initial_state(1))


@pytest.mark.parametrize(
    ("fragment", "config"),
    [
        ("exactly one control", 'control_input [ { name: "S" } ]'),
        (
            "two values",
            'control_input [ { name: "S" control [ { kind: CONTROL_SEQUENCE_START '
            "int32_false_true: [ 1 ] } ] } ]",
        ),
        (
            "needs a data_type",
            'control_input [ { name: "C" control [ { kind: CONTROL_SEQUENCE_CORRID } ] } ]',
        ),
        (
            "must be fixed",
            'state [ { input_name: "a" output_name: "b" data_type: TYPE_FP32 dims: [ -1 ] } ]',
        ),
        (
            "zero_data only",
            'state [ { input_name: "a" output_name: "b" data_type: TYPE_FP32 dims: [ 1 ] '
            'initial_state { name: "x" } } ]',
        ),
    ],
)
def test_config_errors_name_the_field(fragment: str, config: str) -> None:
    text = f'name: "m"\nmax_batch_size: 1\nsequence_batching {{ {config} }}'
    with pytest.raises(ConfigError, match=fragment):
        SequenceOptions.from_config(parse_config_text(text))


def test_sequence_parameters() -> None:
    assert sequence_parameters({"sequence_id": 5, "sequence_start": True}) == (5, True, False)
    assert sequence_parameters({"sequence_id": "a", "sequence_end": True}) == ("a", False, True)
    for bad in ({}, {"sequence_id": 0}, {"sequence_id": ""}, {"sequence_id": True}):
        with pytest.raises(InvalidInput, match="non-zero 'sequence_id'"):
            sequence_parameters(bad)
    with pytest.raises(InvalidInput, match="'sequence_start' must be a boolean"):
        sequence_parameters({"sequence_id": 1, "sequence_start": 1})
