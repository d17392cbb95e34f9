"""Triton's optimization block for ONNX models: parsed, checked, applied to real ORT sessions."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from inferd.backends import onnxruntime_accelerators as acc
from inferd.backends.base import InstancePlacement
from inferd.backends.onnxruntime import OnnxRuntimeBackend, OnnxRuntimeSession
from inferd.config.model_config_pb2 import ModelConfig
from inferd.config.spec import build_spec
from inferd.config.text import parse_config_text
from inferd.core.errors import ConfigError
from tests.optimize_support import write_small_cnn

CPU = InstancePlacement("CPU", 0, 1)
CPU_FIELD = "optimization.execution_accelerators.cpu_execution_accelerator"
GPU_FIELD = "optimization.execution_accelerators.gpu_execution_accelerator"


def _accelerators(kind: str, name: str, parameters: str = "") -> str:
    return (
        f"optimization {{ execution_accelerators {{ {kind}_execution_accelerator [ "
        f'{{ name: "{name}" {parameters} }} ] }} }}'
    )


OPENVINO = _accelerators("cpu", "openvino")
TENSORRT = _accelerators("gpu", "tensorrt", 'parameters { key: "precision_mode" value: "FP16" }')


def _config(text: str, name: str = "cnn") -> ModelConfig:
    return parse_config_text(f'name: "{name}"\n{text}')


@pytest.fixture(scope="module")
def version_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("acc") / "cnn"
    write_small_cnn(folder)
    return folder / "1"


def _load(version_dir: Path, text: str) -> object:
    backend = OnnxRuntimeBackend()
    config = _config(text)
    backend.complete_config(version_dir, config, 8)
    return backend.load(version_dir, config, CPU)


@pytest.mark.parametrize(
    ("level", "expected"),
    [
        (-1, "ORT_ENABLE_BASIC"),
        (0, "ORT_ENABLE_ALL"),
        (1, "ORT_ENABLE_EXTENDED"),
        (2, "ORT_ENABLE_ALL"),
    ],
)
def test_graph_level_maps_to_the_session(version_dir: Path, level: int, expected: str) -> None:
    runtime = _load(version_dir, f"optimization {{ graph {{ level: {level} }} }}")
    assert isinstance(runtime, OnnxRuntimeSession)
    assert runtime.graph_level == expected
    assert runtime.providers == ("CPUExecutionProvider",)


def test_graph_level_out_of_range_names_the_field(version_dir: Path) -> None:
    with pytest.raises(ConfigError, match=r"'optimization.graph.level' is 7"):
        _load(version_dir, "optimization { graph { level: 7 } }")


def test_graph_level_and_parameter_must_agree(version_dir: Path) -> None:
    text = (
        "optimization { graph { level: 1 } }\n"
        'parameters { key: "graph_optimization_level" value: { string_value: "basic" } }'
    )
    with pytest.raises(ConfigError, match=r"contradicts config field 'optimization\.graph\.level'"):
        _load(version_dir, text)


def test_openvino_accelerator_without_ort_provider_runs_on_openvino(version_dir: Path) -> None:
    pytest.importorskip("openvino")
    from inferd.backends.openvino import OpenVinoRuntime

    runtime = _load(version_dir, OPENVINO)
    assert isinstance(runtime, OpenVinoRuntime)
    import numpy as np

    x = np.ones((2, 3, 8, 8), dtype=np.float32)
    plain = _load(version_dir, "")
    assert isinstance(plain, OnnxRuntimeSession)
    got = runtime.execute({"x": x}, ["logits"])["logits"]
    want = plain.execute({"x": x}, ["logits"])["logits"]
    assert np.allclose(got, want, atol=1e-4)


def test_plan_uses_ort_openvino_provider_when_present() -> None:
    plan = acc.plan(
        _config(OPENVINO), "CPU", 0, ["OpenVINOExecutionProvider", "CPUExecutionProvider"]
    )
    assert not plan.openvino_backend
    assert acc.provider_names(plan.providers) == [
        "OpenVINOExecutionProvider",
        "CPUExecutionProvider",
    ]


def test_tensorrt_on_gpu_with_and_without_the_provider(caplog: pytest.LogCaptureFixture) -> None:
    with_trt = acc.plan(
        _config(TENSORRT), "GPU", 1, ["TensorrtExecutionProvider", "CUDAExecutionProvider"]
    )
    assert with_trt.providers[0] == (
        "TensorrtExecutionProvider",
        {"device_id": 1, "trt_fp16_enable": True},
    )
    assert acc.provider_names(with_trt.providers) == [
        "TensorrtExecutionProvider",
        "CUDAExecutionProvider",
        "CPUExecutionProvider",
    ]
    with caplog.at_level(logging.WARNING, logger="inferd.backends.onnxruntime"):
        fallback = acc.plan(_config(TENSORRT), "GPU", 0, ["CUDAExecutionProvider"])
    assert acc.provider_names(fallback.providers) == [
        "CUDAExecutionProvider",
        "CPUExecutionProvider",
    ]
    assert "no TensorRT provider" in caplog.text


def test_tensorrt_on_a_cpu_instance_loads_on_cpu(version_dir: Path) -> None:
    runtime = _load(version_dir, TENSORRT)
    assert isinstance(runtime, OnnxRuntimeSession)
    assert runtime.providers == ("CPUExecutionProvider",)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (_accelerators("cpu", "tpu"), f"'{CPU_FIELD}': unknown accelerator 'tpu'"),
        (_accelerators("gpu", "openvino"), f"'{GPU_FIELD}': unknown accelerator 'openvino'"),
        (
            _accelerators("gpu", "tensorrt", 'parameters { key: "speed" value: "max" }'),
            r"unknown parameter\(s\) speed for accelerator 'tensorrt'",
        ),
        (
            _accelerators("cpu", "openvino", 'parameters { key: "x" value: "1" }'),
            "accelerator 'openvino' takes no parameters",
        ),
    ],
)
def test_unknown_accelerators_are_load_errors(version_dir: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        _load(version_dir, text)


def test_optimization_is_for_onnx_models_only() -> None:
    config = _config('backend: "pytorch"\n' + OPENVINO)
    config.input.add(name="x", data_type=11, dims=[1])
    config.output.add(name="y", data_type=11, dims=[1])
    with pytest.raises(
        ConfigError, match=r"'optimization\.execution_accelerators' applies to ONNX"
    ):
        build_spec(config)
    config = _config('backend: "onnxruntime"\noptimization { priority: PRIORITY_MAX }')
    config.input.add(name="x", data_type=11, dims=[1])
    config.output.add(name="y", data_type=11, dims=[1])
    with pytest.raises(ConfigError, match=r"'optimization\.priority' is not supported"):
        build_spec(config)


def test_pinned_memory_is_accepted() -> None:
    config = _config(
        'backend: "onnxruntime"\n'
        "optimization { input_pinned_memory { enable: true } "
        "output_pinned_memory { enable: true } }"
    )
    config.input.add(name="x", data_type=11, dims=[1])
    config.output.add(name="y", data_type=11, dims=[1])
    assert build_spec(config).name == "cnn"
