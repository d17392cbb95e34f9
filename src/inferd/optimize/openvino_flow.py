"""``inferd optimize`` for OpenVINO models: INT8 with NNCF, checked against the original."""

from __future__ import annotations

import sys
from pathlib import Path

from inferd.backends.completion import model_file
from inferd.config.model_config_pb2 import ModelConfig
from inferd.optimize import openvino_int8
from inferd.optimize.steps import (
    Options,
    Refused,
    Result,
    enforce,
    folder_bytes,
    measure_latency,
    run_check,
    split_rows,
)


def optimize_openvino(
    options: Options, config: ModelConfig, version_dir: Path, staging: Path
) -> Result:
    if options.fp16 or options.int8 is None:
        raise Refused(
            f"model {config.name} runs on OpenVINO, which picks its precision itself: inferd "
            "optimize quantizes it (--int8 static)"
        )
    if options.int8 == "dynamic":
        raise Refused(f"model {config.name} runs on OpenVINO: NNCF quantizes statically only")
    source = model_file(version_dir, config, ("model.xml", "model.onnx"))
    model = openvino_int8.read_model(source)
    inputs = openvino_int8.read_inputs(model)
    calibration, held_out = split_rows(options, inputs, version_dir.parent, True)
    assert calibration is not None
    notes = openvino_int8.quantize(model, calibration, inputs, staging)
    notes["calibration_source"] = "; ".join(calibration.sources)
    if config.default_model_filename and config.default_model_filename != "model.xml":
        print(
            f"inferd optimize: the new version holds model.xml; config.pbtxt names "
            f"default_model_filename '{config.default_model_filename}'",
            file=sys.stderr,
        )
    target = staging / openvino_int8.IR_FILENAME
    original = openvino_int8.compiled_runner(model)
    optimized = openvino_int8.compiled_runner(openvino_int8.read_model(target))
    result = run_check(options, original, optimized, held_out, inputs)
    enforce(options, result, config.name)
    timings = measure_latency(
        options, original, optimized, held_out, inputs, config.max_batch_size, config.name
    )
    source_bytes = folder_bytes(source) + (
        folder_bytes(source.with_suffix(".bin")) if source.suffix == ".xml" else 0
    )
    return Result(
        model=config.name,
        source_version=int(version_dir.name),
        version=0,
        method=notes["method"],
        notes=notes,
        result=result,
        check_sources=held_out.sources,
        sizes_bytes=(source_bytes, folder_bytes(staging)),
        timings=timings,
    )
