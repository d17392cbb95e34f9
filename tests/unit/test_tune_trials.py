"""The trials inferd tune sweeps, the levels, the pick within a budget, the final config."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from inferd.config.model_config_pb2 import ModelConfig
from inferd.config.text import parse_config_text
from inferd.tune.choice import best, pick
from inferd.tune.command import concurrency_levels
from inferd.tune.trials import Measured, default_trial, final_config, grid

SERVED = parse_config_text(
    'name: "m"\nbackend: "onnxruntime"\nmax_batch_size: 8\n'
    "version_policy { all {} }\n"
    'parameters { key: "version_labels" value: { string_value: "stable=1" } }\n'
    'parameters { key: "optimize.method" value: { string_value: "int8" } }\n'
    'input { name: "x" data_type: TYPE_FP32 dims: [2] }\n'
    'output { name: "y" data_type: TYPE_FP32 dims: [2] }\n'
)


def test_grid_crosses_instances_batching_threads() -> None:
    trials = grid(SERVED, "m.tune", [1, 2], [0, 500], [1, 2], [4])
    assert len(trials) == 2 * 3 * 2
    labels = [t.label for t in trials]
    assert labels[:3] == ["i1-t1", "i1-t2", "i1-db0-t1"]
    db = next(t for t in trials if t.label == "i2-db500-t2")
    assert db.config.name == "m.tune"
    assert db.config.instance_group[0].count == 2
    assert db.config.dynamic_batching.max_queue_delay_microseconds == 500
    assert list(db.config.dynamic_batching.preferred_batch_size) == [4]
    assert db.config.parameters["intra_op_thread_count"].string_value == "2"
    assert not db.config.HasField("version_policy")
    assert "version_labels" not in db.config.parameters


def test_no_batching_trials_for_a_model_that_does_not_batch() -> None:
    served = parse_config_text('name: "m"\nbackend: "sklearn"\nmax_batch_size: 0\n')
    assert [t.label for t in grid(served, "t", [1], [0, 100], [1, 2], [])] == ["i1"]


def test_default_trial_reads_the_served_config() -> None:
    served = parse_config_text(
        'name: "m"\nbackend: "onnxruntime"\nmax_batch_size: 8\n'
        "instance_group [{ count: 3 }]\ndynamic_batching { max_queue_delay_microseconds: 70 }\n"
    )
    trial = default_trial(served, "t")
    assert (trial.label, trial.instances, trial.max_delay_us, trial.threads) == (
        "default",
        3,
        70,
        None,
    )


def test_final_config_keeps_the_models_own_fields() -> None:
    winner = grid(SERVED, "m.tune", [2], [500], [1], [])[1]
    config = final_config(SERVED, winner)
    assert config.name == "m"
    assert config.version_policy.HasField("all")
    assert config.parameters["version_labels"].string_value == "stable=1"
    assert "optimize.method" not in config.parameters
    assert config.instance_group[0].count == 2
    assert config.dynamic_batching.max_queue_delay_microseconds == 500
    assert config.parameters["intra_op_thread_count"].string_value == "1"


def test_concurrency_levels_are_powers_of_two_between() -> None:
    assert concurrency_levels("1:8") == (1, 2, 4, 8)
    assert concurrency_levels("3:12") == (3, 4, 8, 12)
    assert concurrency_levels("2") == (2,)
    with pytest.raises(argparse.ArgumentTypeError):
        concurrency_levels("4:2")


def test_pick_the_fastest_level_within_budget() -> None:
    rows = [
        {"concurrency": 1, "throughput_infer_per_s": 100.0, "latency_p99_ms": 2.0, "errors": 0},
        {"concurrency": 2, "throughput_infer_per_s": 180.0, "latency_p99_ms": 4.0, "errors": 0},
        {"concurrency": 4, "throughput_infer_per_s": 250.0, "latency_p99_ms": 9.0, "errors": 0},
        {"concurrency": 8, "throughput_infer_per_s": 300.0, "latency_p99_ms": 3.0, "errors": 2},
    ]
    best = pick(rows, 5.0)
    assert best is not None and best["concurrency"] == 2
    best = pick(rows, None)
    assert best is not None and best["concurrency"] == 4
    assert pick(rows, 1.0) is None


def _row(rate: float, p99: float, concurrency: int = 1) -> dict[str, Any]:
    return {
        "concurrency": concurrency,
        "throughput_infer_per_s": rate,
        "latency_p99_ms": p99,
        "errors": 0,
    }


def test_throughputs_within_the_noise_tie_and_the_lower_p99_wins() -> None:
    """The reported case: +0.05 % throughput at 4.5x the p99 is not better."""
    default = Measured(default_trial(ModelConfig(name="m"), "m"), [], _row(2400.0, 5.0))
    i1 = Measured(default_trial(ModelConfig(name="m"), "m"), [], _row(2636.6, 27.9))
    i2 = Measured(default_trial(ModelConfig(name="m"), "m"), [], _row(2635.3, 6.1))
    assert best([default, i1, i2]) is i2
    assert best([default, i1, i2], tie_pct=0.0) is i1  # no tolerance: the raw maximum
    # a clear gain beats a lower p99
    i3 = Measured(default_trial(ModelConfig(name="m"), "m"), [], _row(3000.0, 9.0))
    assert best([default, i1, i2, i3]) is i3
    # the same rule picks a config's level: c=8 adds 1 % for 4x the p99
    rows = [_row(1000.0, 2.0, 2), _row(1980.0, 3.0, 4), _row(2000.0, 12.0, 8)]
    level = pick(rows, None)
    assert level is not None and level["concurrency"] == 4


def test_the_plot_reads_every_line() -> None:
    """p99 on a log axis (one 2.6 s outlier squashed 17 lines) and a colour and marker each."""
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from inferd.tune.report import plot_figure

    served = ModelConfig(name="m", backend="onnxruntime", max_batch_size=8)
    trials = [default_trial(served, "m"), *grid(served, "m", (1, 2), (0, 500, 2000), (1, 2), ())]
    assert len(trials) == 17
    measured = [
        Measured(
            t, [_row(100.0 * i, 2.0 + i), _row(150.0 * i, 2600.0 if i == 3 else 4.0 + i)], None
        )
        for i, t in enumerate(trials)
    ]
    figure = plot_figure(measured, 50.0, "m")
    try:
        (axes,) = figure.axes
        assert axes.get_xscale() == "log"
        lines = [line for line in axes.get_lines() if line.get_label() in {t.label for t in trials}]
        assert len(lines) == 17
        styles = {
            (str(line.get_color()), line.get_linestyle(), line.get_marker()) for line in lines
        }
        assert len(styles) == 17
    finally:
        plt.close(figure)
