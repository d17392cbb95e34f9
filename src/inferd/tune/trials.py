"""The configurations ``inferd tune`` tries: the model's own config (the default), then instance
count x dynamic batching (off, or on with each max queue delay) x thread count."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from inferd.config.model_config_pb2 import ModelConfig, ModelInstanceGroup
from inferd.plane.routing import ROUTING_PARAMETERS

# The thread parameter of each backend whose thread pool a config sets.
THREAD_PARAMETERS = {
    "onnxruntime": "intra_op_thread_count",
    "openvino": "INFERENCE_NUM_THREADS",
}


@dataclass(frozen=True, slots=True)
class Trial:
    label: str
    instances: int | None  # None: as the default config has it
    max_delay_us: int | None  # None: dynamic batching off
    threads: int | None
    config: ModelConfig

    def describe(self) -> dict[str, Any]:
        return {
            "trial": self.label,
            "instances": self.instances if self.instances is not None else "default",
            "dynamic_batching": "off" if self.max_delay_us is None else f"{self.max_delay_us} us",
            "threads": self.threads if self.threads is not None else "default",
        }


def base_config(served: ModelConfig, name: str) -> ModelConfig:
    """The served config under another name: one version, no routing, no warmup."""
    config = ModelConfig()
    config.CopyFrom(served)
    config.name = name
    config.ClearField("version_policy")
    config.ClearField("model_warmup")
    for key in ROUTING_PARAMETERS:
        if key in config.parameters:
            del config.parameters[key]
    return config


def default_trial(served: ModelConfig, name: str) -> Trial:
    config = base_config(served, name)
    count = sum(g.count or 1 for g in config.instance_group) or None
    delay = (
        int(config.dynamic_batching.max_queue_delay_microseconds)
        if config.HasField("dynamic_batching")
        else None
    )
    backend = config.backend
    threads = None
    if backend in THREAD_PARAMETERS and THREAD_PARAMETERS[backend] in config.parameters:
        threads = int(config.parameters[THREAD_PARAMETERS[backend]].string_value)
    return Trial("default", count, delay, threads, config)


def grid(
    served: ModelConfig,
    name: str,
    instances: Sequence[int],
    max_delays_us: Sequence[int],
    threads: Sequence[int],
    preferred_batch_sizes: Sequence[int],
) -> list[Trial]:
    """Every combination; dynamic batching only for models that batch (max_batch_size > 0),
    threads only for backends with a thread parameter."""
    batching: list[int | None] = [None]
    if served.max_batch_size > 0:
        batching += list(max_delays_us)
    thread_counts: list[int | None] = (
        list(threads) if served.backend in THREAD_PARAMETERS and threads else [None]
    )
    trials = []
    for count in instances:
        for delay in batching:
            for thread_count in thread_counts:
                config = base_config(served, name)
                del config.instance_group[:]
                group = config.instance_group.add()
                group.count = count
                group.kind = ModelInstanceGroup.KIND_CPU
                config.ClearField("dynamic_batching")
                if delay is not None:
                    config.dynamic_batching.max_queue_delay_microseconds = delay
                    config.dynamic_batching.preferred_batch_size.extend(preferred_batch_sizes)
                if thread_count is not None:
                    key = THREAD_PARAMETERS[served.backend]
                    config.parameters[key].string_value = str(thread_count)
                label = f"i{count}" + ("" if delay is None else f"-db{delay}")
                label += "" if thread_count is None else f"-t{thread_count}"
                trials.append(Trial(label, count, delay, thread_count, config))
    return trials


def final_config(served: ModelConfig, trial: Trial) -> ModelConfig:
    """The served config (name, versions, routing, warmup kept) with the trial's instance
    groups, dynamic batching and thread parameter, for the model's config.pbtxt."""
    config = ModelConfig()
    config.CopyFrom(served)
    config.ClearField("instance_group")
    config.instance_group.extend(trial.config.instance_group)
    config.ClearField("dynamic_batching")
    if trial.config.HasField("dynamic_batching"):
        config.dynamic_batching.CopyFrom(trial.config.dynamic_batching)
    key = THREAD_PARAMETERS.get(served.backend)
    if key is not None and key in trial.config.parameters:
        config.parameters[key].string_value = trial.config.parameters[key].string_value
    for note in [k for k in config.parameters if k.startswith("optimize.")]:
        del config.parameters[note]  # read from the model file, not settings
    return config


@dataclass(frozen=True, slots=True)
class Measured:
    trial: Trial
    rows: list[dict[str, Any]]  # one per concurrency level, as inferd bench reports them
    best: dict[str, Any] | None  # the fastest row within the budget
