"""Ensemble configs for the tests: chains and diamonds over the demo half_plus_two and echo."""

from __future__ import annotations

from pathlib import Path

from inferd.demo.models import write_demo_repository


def step(model: str, inputs: dict[str, str], outputs: dict[str, str]) -> str:
    def pairs(field: str, mapping: dict[str, str]) -> str:
        return " ".join(f'{field} {{ key: "{k}" value: "{v}" }}' for k, v in mapping.items())

    return (
        f'{{ model_name: "{model}" model_version: -1 '
        f"{pairs('input_map', inputs)} {pairs('output_map', outputs)} }}"
    )


def ensemble(name: str, steps: list[str], inputs: list[str], outputs: list[str]) -> str:
    def tensors(names: list[str]) -> str:
        return ", ".join(f'{{ name: "{n}" data_type: TYPE_FP32 dims: [1] }}' for n in names)

    return (
        f'name: "{name}"\nplatform: "ensemble"\nmax_batch_size: 64\n'
        f"input [ {tensors(inputs)} ]\noutput [ {tensors(outputs)} ]\n"
        f"ensemble_scheduling {{ step [ {', '.join(steps)} ] }}\n"
    )


# y = 0.5 * (0.5 * x + 2) + 2, through two half_plus_two steps.
CHAIN = ensemble(
    "chain",
    [
        step("half_plus_two", {"x": "IN"}, {"y": "mid"}),
        step("half_plus_two", {"x": "mid"}, {"y": "OUT"}),
    ],
    ["IN"],
    ["OUT"],
)
# Two independent half_plus_two steps, joined by a two-input echo step.
DIAMOND = ensemble(
    "diamond",
    [
        step("join", {"INPUT0": "a", "INPUT1": "b"}, {"OUTPUT0": "A", "OUTPUT1": "B"}),
        step("half_plus_two", {"x": "IN"}, {"y": "a"}),
        step("half_plus_two", {"x": "a"}, {"y": "b"}),
    ],
    ["IN"],
    ["A", "B"],
)
JOIN = """name: "join"
backend: "echo"
max_batch_size: 64
input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [1] },
       { name: "INPUT1" data_type: TYPE_FP32 dims: [1] }]
dynamic_batching { max_queue_delay_microseconds: 2000 }
"""
CYCLE = ensemble(
    "cycle",
    [
        step("half_plus_two", {"x": "b"}, {"y": "a"}),
        step("half_plus_two", {"x": "a"}, {"y": "b"}),
    ],
    ["IN"],
    ["b"],
)
UNKNOWN_TENSOR = ensemble(
    "unknown_tensor",
    [step("half_plus_two", {"x": "nowhere"}, {"y": "OUT"})],
    ["IN"],
    ["OUT"],
)
MISSING_MODEL = ensemble(
    "missing_model",
    [step("later", {"x": "IN"}, {"y": "OUT"})],
    ["IN"],
    ["OUT"],
)


def write_model(root: Path, name: str, config: str) -> None:
    (root / name / "1").mkdir(parents=True, exist_ok=True)
    (root / name / "config.pbtxt").write_text(config)


def ensemble_repository(root: Path) -> Path:
    write_demo_repository(root, models=["half_plus_two"])
    for name, config in (
        ("chain", CHAIN),
        ("diamond", DIAMOND),
        ("join", JOIN),
        ("cycle", CYCLE),
        ("unknown_tensor", UNKNOWN_TENSOR),
        ("missing_model", MISSING_MODEL),
    ):
        write_model(root, name, config)
    return root
