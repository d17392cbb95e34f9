"""ONNX models: ONNX Runtime graph optimizations saved offline, INT8 with
``onnxruntime.quantization`` (dynamic, or static QDQ with calibration; per-channel weights),
and FP16 with ONNX Runtime's float16 converter.

Weights are 8-bit by default; ``reduce_range`` (7-bit weights) is ONNX Runtime's remedy for
u8s8 kernels that saturate on CPUs without VNNI, at a cost in precision.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from onnxruntime.quantization import CalibrationDataReader

from inferd.core.errors import ConfigError, ModelLoadError
from inferd.optimize.check import Run
from inferd.optimize.data import Arrays, InputSpec, Rows, feeds

QUANTIZED_OPS = {
    # node type in the quantized graph -> the original op type it stands for
    "QLinearConv": "Conv",
    "ConvInteger": "Conv",
    "QLinearMatMul": "MatMul",
    "MatMulInteger": "MatMul",
    "DynamicQuantizeMatMul": "MatMul",
    "MatMulIntegerToFloat": "MatMul",
    "QGemm": "Gemm",
}
CONV_OPS = {"Conv", "ConvTranspose"}
QUANTIZABLE_OPS = {"Conv", "MatMul", "Gemm"}
CALIBRATION_BATCH_ROWS = 8


@dataclass(frozen=True, slots=True)
class Quantized:
    op_types: tuple[str, ...]  # original op types that now run in INT8
    notes: dict[str, str]


def read_inputs(path: Path) -> list[InputSpec]:
    import onnx
    from onnx import helper

    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:
        raise ModelLoadError(f"cannot read ONNX model {path}: {exc}") from None
    initializers = {i.name for i in model.graph.initializer}
    specs = []
    for value in model.graph.input:
        if value.name in initializers:
            continue
        tensor = value.type.tensor_type
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tensor.elem_type))
        shape = tuple(
            int(d.dim_value) if d.HasField("dim_value") and d.dim_value > 0 else -1
            for d in tensor.shape.dim
        )
        specs.append(InputSpec(value.name, dtype, shape))
    return specs


def op_types(path: Path) -> set[str]:
    import onnx

    return {node.op_type for node in onnx.load(str(path)).graph.node}


def session_runner(path: Path, threads: int = 0) -> Run:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]

    def run(feed: Arrays) -> Arrays:
        return dict(zip(names, session.run(names, feed), strict=True))

    return run


def graph_optimize(source: Path, target: Path) -> dict[str, str]:
    """ONNX Runtime's extended optimizations (fusions, constant folding), saved offline.

    Layout optimizations (level ``all``) are left to load time: they depend on the CPU."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = str(target)
    try:
        ort.InferenceSession(str(source), options, providers=["CPUExecutionProvider"])
    except Exception as exc:
        raise ModelLoadError(f"onnxruntime cannot optimize {source.name}: {exc}") from None
    return {"graph": "onnxruntime extended optimizations, saved offline"}


class _Reader(CalibrationDataReader):  # type: ignore[misc]
    """ONNX Runtime's CalibrationDataReader over the calibration rows, with a progress bar."""

    def __init__(self, rows: Rows, inputs: Sequence[InputSpec], progress: Any) -> None:
        self._feeds: Iterator[Arrays] = iter(feeds(rows, inputs, CALIBRATION_BATCH_ROWS))
        self._progress = progress
        self._batching = all(s.batching for s in inputs)

    def get_next(self) -> Arrays | None:
        feed = next(self._feeds, None)
        if feed is not None:
            self._progress.update(len(next(iter(feed.values()))) if self._batching else 1)
        return feed

    def rewind(self) -> None:  # ORT calls it on some calibrators; one pass is enough here
        pass


def prepare(source: Path, target: Path) -> list[str]:
    """ONNX Runtime's pre-processing (shape inference; no fusions, which would rename nodes)
    with every node named;
    returns the names of the nodes that quantization can turn INT8 (fallback candidates)."""
    import onnx
    from onnxruntime.quantization.shape_inference import quant_pre_process

    try:
        quant_pre_process(
            str(source), str(target), skip_optimization=True, skip_symbolic_shape=True
        )
    except Exception as exc:
        raise ModelLoadError(f"cannot prepare {source.name} for quantization: {exc}") from None
    model = onnx.load(str(target))
    taken = {n.name for n in model.graph.node if n.name}
    for index, node in enumerate(model.graph.node):
        if not node.name:
            name = f"{node.op_type}_{index}"
            while name in taken:
                name += "_"
            node.name = name
            taken.add(name)
    onnx.save(model, str(target))
    return [n.name for n in model.graph.node if n.op_type in QUANTIZABLE_OPS]


def quantize(
    prepared: Path,
    target: Path,
    mode: str,
    calibration: Rows | None,
    inputs: Sequence[InputSpec],
    progress: Any,
    reduce_range: bool,
    fp32_nodes: Sequence[str] = (),
) -> Quantized:
    """INT8 ``mode`` ("dynamic" or "static") of a ``prepare``d model, but ``fp32_nodes``."""
    from onnxruntime.quantization import (
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_dynamic,
        quantize_static,
    )

    notes = {"per_channel": "true", "reduce_range": str(reduce_range).lower()}
    if fp32_nodes:
        notes["fp32_nodes"] = ",".join(fp32_nodes)
    try:
        if mode == "dynamic":
            quantize_dynamic(
                prepared,
                target,
                per_channel=True,
                reduce_range=reduce_range,
                weight_type=QuantType.QInt8,
                nodes_to_exclude=list(fp32_nodes),
            )
            notes["method"] = "int8 dynamic (weights int8 per-channel, activations at run time)"
        else:
            if calibration is None or not len(calibration):
                raise ConfigError("static quantization needs calibration rows")
            quantize_static(
                prepared,
                target,
                _Reader(calibration, inputs, progress),
                quant_format=QuantFormat.QDQ,
                per_channel=True,
                reduce_range=reduce_range,
                activation_type=QuantType.QUInt8,
                weight_type=QuantType.QInt8,
                calibrate_method=CalibrationMethod.MinMax,
                nodes_to_exclude=list(fp32_nodes),
            )
            notes["method"] = "int8 static QDQ (u8 activations, s8 per-channel weights)"
            notes["calibration_method"] = "MinMax"
            notes["calibration_rows"] = str(len(calibration))
    except ConfigError:
        raise
    except Exception as exc:
        raise ModelLoadError(f"onnxruntime cannot quantize the model: {exc}") from None
    quantized = quantized_op_types(target)
    notes["op_types"] = ",".join(quantized)
    return Quantized(quantized, notes)


def quantized_op_types(path: Path) -> tuple[str, ...]:
    """The original op types that run in INT8 in ``path`` (QDQ: ops fed by DequantizeLinear)."""
    import onnx

    graph = onnx.load(str(path)).graph
    dequantized = {n.output[0] for n in graph.node if n.op_type == "DequantizeLinear"}
    found = set()
    for node in graph.node:
        if node.op_type in QUANTIZED_OPS:
            found.add(QUANTIZED_OPS[node.op_type])
        elif node.op_type not in ("QuantizeLinear", "DequantizeLinear") and any(
            i in dequantized for i in node.input
        ):
            found.add(node.op_type)
    return tuple(sorted(found))


def to_fp16(source: Path, target: Path) -> dict[str, str]:
    """Weights and compute in FP16; inputs and outputs keep their types."""
    import onnx
    from onnxruntime.transformers.float16 import convert_float_to_float16

    try:
        model = convert_float_to_float16(onnx.load(str(source)), keep_io_types=True)
        onnx.save(model, str(target))
    except Exception as exc:
        raise ModelLoadError(f"cannot convert {source.name} to FP16: {exc}") from None
    return {"method": "fp16 (inputs and outputs unchanged)"}


def record(path: Path, notes: dict[str, str]) -> None:
    """Store the notes in the file's metadata (``inferd.optimize.*``), where the ONNX Runtime
    backend reads them back into the version's config parameters."""
    import onnx

    from inferd.backends.onnxruntime import METADATA_PREFIX

    model = onnx.load(str(path))
    props = {p.key: p.value for p in model.metadata_props if not p.key.startswith(METADATA_PREFIX)}
    props.update({METADATA_PREFIX + key: value for key, value in notes.items()})
    onnx.helper.set_model_props(model, props)
    onnx.save(model, str(path))
