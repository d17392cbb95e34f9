"""``inferd optimize`` for ONNX models: graph optimizations, INT8 or FP16 with ONNX Runtime,
the check against the original, and the notes stored in the new file."""

from __future__ import annotations

import sys
from pathlib import Path

from inferd.backends.base import model_path
from inferd.backends.onnxruntime import OnnxRuntimeBackend
from inferd.config.model_config_pb2 import ModelConfig
from inferd.optimize import check, onnx_int8
from inferd.optimize.data import InputSpec, Rows
from inferd.optimize.steps import (
    Options,
    Refused,
    Result,
    enforce,
    folder_bytes,
    measure_latency,
    progress_bar,
    run_check,
    split_rows,
)

_MAX_SEARCH_NODES = 16


def optimize_onnx(
    options: Options, config: ModelConfig, version_dir: Path, staging: Path
) -> Result:
    source = model_path(version_dir, config, OnnxRuntimeBackend())
    if not source.is_file():
        raise Refused(f"model {config.name}: no {source.name} in {version_dir}")
    target = staging / source.name
    inputs = onnx_int8.read_inputs(source)
    notes: dict[str, str]
    result: check.CheckResult
    mode = options.int8
    if mode == "auto":
        mode = "static" if onnx_int8.op_types(source) & onnx_int8.CONV_OPS else "dynamic"
    calibration, held_out = split_rows(options, inputs, version_dir.parent, mode == "static")
    original = onnx_int8.session_runner(source)
    if mode is not None:
        quantized, result = _quantize_checked(
            options, config, source, target, mode, calibration, held_out, inputs, original
        )
        notes = quantized.notes
        if calibration is not None:
            notes["calibration_source"] = "; ".join(calibration.sources)
    elif options.fp16:
        notes = onnx_int8.to_fp16(source, target)
    else:
        notes = onnx_int8.graph_optimize(source, target)
        notes["method"] = notes.pop("graph")
    optimized = onnx_int8.session_runner(target)
    if mode is None:
        result = run_check(options, original, optimized, held_out, inputs)
    enforce(options, result, config.name)
    timings = measure_latency(
        options, original, optimized, held_out, inputs, config.max_batch_size, config.name
    )
    notes["agreement"] = f"{result.agreement:.4f}"
    notes["check_rows"] = str(result.rows)
    notes["source_version"] = version_dir.name
    onnx_int8.record(target, notes)
    return Result(
        model=config.name,
        source_version=int(version_dir.name),
        version=0,
        method=notes["method"],
        notes=notes,
        result=result,
        check_sources=held_out.sources,
        sizes_bytes=(folder_bytes(source), folder_bytes(target)),
        timings=timings,
    )


def _quantize_checked(
    options: Options,
    config: ModelConfig,
    source: Path,
    target: Path,
    mode: str,
    calibration: Rows | None,
    held_out: Rows,
    inputs: list[InputSpec],
    original: check.Run,
) -> tuple[onnx_int8.Quantized, check.CheckResult]:
    """Quantize and check; below ``--min-agreement``, keep in FP32 the node whose exclusion
    helps most, one at a time (at most ``--max-fp32-nodes``, and only for models with few
    quantizable nodes, where the search stays cheap)."""
    reduce_range = options.reduce_range
    prepared = target.with_name(".prepared.onnx")
    candidates = onnx_int8.prepare(source, prepared)

    def attempt(fp32_nodes: list[str]) -> tuple[onnx_int8.Quantized, check.CheckResult]:
        total = len(calibration) if calibration is not None else 0
        bar = progress_bar(options.progress and total > 0, total, "calibration")
        try:
            quantized = onnx_int8.quantize(
                prepared, target, mode, calibration, inputs, bar, reduce_range, fp32_nodes
            )
        finally:
            bar.close()
        if not quantized.op_types:
            raise Refused(
                f"model {config.name} does not quantize: none of its operators "
                f"({', '.join(sorted(onnx_int8.op_types(source)))}) has an INT8 kernel in "
                "ONNX Runtime; nothing written"
            )
        optimized = onnx_int8.session_runner(target)
        return quantized, run_check(options, original, optimized, held_out, inputs)

    try:
        best = attempt([])
        kept: list[str] = []
        searchable = len(candidates) <= _MAX_SEARCH_NODES
        while (
            best[1].agreement < options.min_agreement
            and searchable
            and len(kept) < min(options.max_fp32_nodes, len(candidates) - 1)
        ):
            trials = [(*attempt([*kept, name]), name) for name in candidates if name not in kept]
            quantized, result, name = max(trials, key=lambda t: t[1].agreement)
            if result.agreement <= best[1].agreement:
                break
            kept.append(name)
            print(
                f"inferd optimize: keeping {name} in FP32: agreement {result.agreement:.2%}",
                file=sys.stderr,
            )
            best = (quantized, result)
        if kept:  # the last attempt written may be another trial: write the best one again
            best = attempt(kept)
    finally:
        prepared.unlink(missing_ok=True)
    return best
