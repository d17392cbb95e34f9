"""OpenVINO models (IR, or ONNX served with ``backend: "openvino"``): INT8 with NNCF's
post-training quantization from the calibration rows, written as IR (``model.xml`` + ``.bin``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from inferd.backends.completion import missing_extra
from inferd.core.errors import ConfigError, ModelLoadError
from inferd.optimize.check import Run
from inferd.optimize.data import Arrays, InputSpec, Rows, feeds

IR_FILENAME = "model.xml"
RT_INFO_KEY = "inferd_optimize"


def _openvino() -> Any:
    try:
        import openvino
    except ImportError as exc:
        raise missing_extra("OpenVINO", "openvino", exc) from None
    return openvino


def read_model(path: Path) -> Any:
    try:
        return _openvino().Core().read_model(str(path))
    except ModelLoadError:
        raise
    except Exception as exc:
        raise ModelLoadError(f"OpenVINO cannot read {path.name}: {exc}") from None


def read_inputs(model: Any) -> list[InputSpec]:
    specs = []
    for port in model.inputs:
        partial = port.get_partial_shape()
        if partial.rank.is_dynamic:
            raise ConfigError(f"input '{port.get_any_name()}' has a dynamic rank")
        shape = tuple(d.get_length() if d.is_static else -1 for d in partial)
        dtype = np.dtype(port.get_element_type().to_dtype())
        specs.append(InputSpec(port.get_any_name(), dtype, shape))
    return specs


def compiled_runner(model: Any, threads: int = 0) -> Run:
    ov = _openvino()
    properties: dict[str, Any] = {"PERFORMANCE_HINT": "LATENCY"}
    if threads:
        properties["INFERENCE_NUM_THREADS"] = threads
    compiled = ov.Core().compile_model(model, "CPU", properties)
    request = compiled.create_infer_request()
    names = [port.get_any_name() for port in compiled.outputs]

    def run(feed: Arrays) -> Arrays:
        results = request.infer(feed)
        return {
            name: np.array(results[port])
            for name, port in zip(names, compiled.outputs, strict=True)
        }

    return run


def nncf_available() -> bool:
    try:
        import nncf  # noqa: F401
    except ImportError:
        return False
    return True


def quantize(
    model: Any, calibration: Rows, inputs: Sequence[InputSpec], target_dir: Path
) -> dict[str, str]:
    """NNCF's post-training INT8 quantization (its own progress bar) saved as IR."""
    try:
        import nncf
    except ImportError as exc:
        raise ConfigError(
            f"INT8 for OpenVINO models needs NNCF, which is not installed ({exc}): pip install nncf"
        ) from None
    items = feeds(calibration, inputs, 1)
    try:
        quantized = nncf.quantize(
            model, nncf.Dataset(items), subset_size=len(items), preset=nncf.QuantizationPreset.MIXED
        )
    except Exception as exc:
        raise ModelLoadError(f"NNCF cannot quantize the model: {exc}") from None
    notes = {
        "method": "int8 NNCF post-training quantization (mixed preset, per-channel weights)",
        "calibration_method": "NNCF MinMax",
        "calibration_rows": str(len(items)),
    }
    for key, value in notes.items():
        quantized.set_rt_info(value, [RT_INFO_KEY, key])
    _openvino().save_model(quantized, str(target_dir / IR_FILENAME))
    return notes
