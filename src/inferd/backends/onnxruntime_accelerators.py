"""Triton's ``optimization`` block for ONNX models: the graph level and the execution
accelerators, turned into ONNX Runtime's optimization level and execution providers.

``graph { level: N }`` follows Triton's ONNX Runtime backend: -1 basic, 0 (the default) all,
1 extended, 2 all. ``cpu_execution_accelerator [{ name: "openvino" }]`` runs the model on
OpenVINO: through ONNX Runtime's OpenVINO execution provider when this onnxruntime build has
it, else through inferd's OpenVINO backend (which reads ``model.onnx`` itself).
``gpu_execution_accelerator [{ name: "tensorrt" }]`` (or ``"cuda"``) applies to GPU instances:
TensorRT's provider when present, else a warning and CUDA, then CPU.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from inferd.config.model_config_pb2 import ModelConfig, ModelOptimizationPolicy
from inferd.core.errors import ConfigError

log = logging.getLogger("inferd.backends.onnxruntime")

OPENVINO_PROVIDER = "OpenVINOExecutionProvider"
TENSORRT_PROVIDER = "TensorrtExecutionProvider"
CUDA_PROVIDER = "CUDAExecutionProvider"
CPU_PROVIDER = "CPUExecutionProvider"

# Triton's onnxruntime backend: -1 basic, 1 extended, anything else (0 by default) all.
GRAPH_LEVELS: dict[int, str] = {
    -1: "ORT_ENABLE_BASIC",
    0: "ORT_ENABLE_ALL",
    1: "ORT_ENABLE_EXTENDED",
    2: "ORT_ENABLE_ALL",
}
CPU_ACCELERATORS = ("openvino",)
GPU_ACCELERATORS = ("tensorrt", "cuda")
# Triton's TensorRT accelerator parameters and the ORT provider options they set.
_TENSORRT_OPTIONS = {
    "precision_mode": "trt_fp16_enable",
    "max_workspace_size_bytes": "trt_max_workspace_size",
    "trt_engine_cache_enable": "trt_engine_cache_enable",
    "trt_engine_cache_path": "trt_engine_cache_path",
}
_CPU_FIELD = "optimization.execution_accelerators.cpu_execution_accelerator"
_GPU_FIELD = "optimization.execution_accelerators.gpu_execution_accelerator"


@dataclass(frozen=True, slots=True)
class Acceleration:
    """What the optimization block asks of one instance."""

    graph_level: str | None  # an ORT GraphOptimizationLevel name, None: not configured
    providers: tuple[Any, ...]  # ORT providers in priority order (names or (name, options))
    openvino_backend: bool  # run through inferd's OpenVINO backend instead of ORT


def graph_level(config: ModelConfig) -> str | None:
    optimization = config.optimization
    if not optimization.HasField("graph"):
        return None
    level = optimization.graph.level
    if level not in GRAPH_LEVELS:
        raise ConfigError(
            f"config field 'optimization.graph.level' is {level}; expected one of "
            f"{', '.join(str(k) for k in sorted(GRAPH_LEVELS))} (-1 basic, 0 all, 1 extended, "
            "2 all)"
        )
    return GRAPH_LEVELS[level]


def check_accelerators(config: ModelConfig) -> None:
    """Load errors for unknown accelerator names and parameters, naming the field."""
    accelerators = config.optimization.execution_accelerators
    _check_names(accelerators.cpu_execution_accelerator, CPU_ACCELERATORS, _CPU_FIELD)
    _check_names(accelerators.gpu_execution_accelerator, GPU_ACCELERATORS, _GPU_FIELD)
    for acc in accelerators.cpu_execution_accelerator:
        if acc.parameters:
            raise ConfigError(
                f"config field '{_CPU_FIELD}': accelerator 'openvino' takes no parameters, "
                f"got {', '.join(sorted(acc.parameters))}"
            )
    for acc in accelerators.gpu_execution_accelerator:
        known = _TENSORRT_OPTIONS if acc.name == "tensorrt" else {}
        unknown = set(acc.parameters) - set(known)
        if unknown:
            raise ConfigError(
                f"config field '{_GPU_FIELD}': unknown parameter(s) {', '.join(sorted(unknown))} "
                f"for accelerator '{acc.name}'; known: {', '.join(sorted(known)) or 'none'}"
            )


def _check_names(
    accelerators: Sequence[ModelOptimizationPolicy.ExecutionAccelerators.Accelerator],
    known: tuple[str, ...],
    field: str,
) -> None:
    names = [acc.name for acc in accelerators]
    for name in names:
        if name not in known:
            raise ConfigError(
                f"config field '{field}': unknown accelerator '{name}'; known: {', '.join(known)}"
            )
    if len(set(names)) != len(names):
        raise ConfigError(f"config field '{field}' names an accelerator twice: {names}")


def plan(config: ModelConfig, kind: str, device_id: int, available: Sequence[str]) -> Acceleration:
    """The providers for one instance (``kind`` CPU or GPU) given ORT's available providers."""
    check_accelerators(config)
    level = graph_level(config)
    accelerators = config.optimization.execution_accelerators
    providers: list[Any] = []
    if kind == "GPU":
        for acc in accelerators.gpu_execution_accelerator:
            if acc.name == "tensorrt":
                if TENSORRT_PROVIDER in available:
                    options = _tensorrt_options(acc.parameters, device_id)
                    providers.append((TENSORRT_PROVIDER, options))
                else:
                    log.warning(
                        "model '%s': gpu_execution_accelerator 'tensorrt' asked for, but this "
                        "onnxruntime has no TensorRT provider; running on CUDA (else CPU)",
                        config.name,
                    )
        providers.append((CUDA_PROVIDER, {"device_id": device_id}))
    elif accelerators.gpu_execution_accelerator:
        log.info(
            "model '%s': gpu_execution_accelerator applies to GPU instances; this one runs on CPU",
            config.name,
        )
    openvino_backend = False
    if kind != "GPU" and accelerators.cpu_execution_accelerator:
        if OPENVINO_PROVIDER in available:
            providers.append((OPENVINO_PROVIDER, {"device_type": "CPU"}))
        else:
            openvino_backend = True
    providers.append(CPU_PROVIDER)
    return Acceleration(level, tuple(providers), openvino_backend)


def _tensorrt_options(parameters: Mapping[str, str], device_id: int) -> dict[str, Any]:
    options: dict[str, Any] = {"device_id": device_id}
    for key, value in parameters.items():
        if key == "precision_mode":
            mode = value.upper()
            if mode not in ("FP32", "FP16"):
                raise ConfigError(
                    f"config field '{_GPU_FIELD}': precision_mode '{value}' is not FP32 or FP16"
                )
            options["trt_fp16_enable"] = mode == "FP16"
        else:
            options[_TENSORRT_OPTIONS[key]] = value
    return options


def provider_names(providers: Sequence[Any]) -> list[str]:
    return [p[0] if isinstance(p, tuple) else str(p) for p in providers]
