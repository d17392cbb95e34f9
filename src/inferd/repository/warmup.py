"""Model warmup (``model_warmup``): run each instance on zero, random or file data at load.

A version is not READY until its warmup has run, so the first real request is not slow.
A file named by ``input_data_file`` lives in ``<model>/warmup/`` and holds raw row-major
little-endian values for the whole warmup batch.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from inferd.backends.work import Work
from inferd.config.model_config_pb2 import ModelConfig, ModelWarmup
from inferd.config.spec import ModelSpec, TensorSpec, datatype_of
from inferd.core.errors import ConfigError, InferdError, ModelLoadError
from inferd.core.types import Tensors
from inferd.plane import validate
from inferd.scheduling.instances import Instances

log = logging.getLogger("inferd.repository")


def run_warmup(config: ModelConfig, spec: ModelSpec, instances: Instances, model_dir: Path) -> int:
    """Run every warmup sample on every instance; returns the executions made."""
    executions = 0
    outputs = tuple(o.name for o in spec.outputs)
    for sample in config.model_warmup:
        inputs = _sample_inputs(sample, spec, model_dir)
        model_inputs, rows = validate.check_inputs(spec, inputs)
        work = Work(model_inputs, rows, outputs, f"warmup-{sample.name}")
        for instance in range(instances.count):
            for _ in range(max(1, sample.count)):
                try:
                    result = instances.run_blocking(instance, [work]).results[0]
                except InferdError as exc:
                    result = exc
                if isinstance(result, InferdError):
                    raise ModelLoadError(f"warmup '{sample.name}' failed: {result.message}")
                executions += 1
    return executions


def _sample_inputs(sample: ModelWarmup, spec: ModelSpec, model_dir: Path) -> Tensors:
    where = f"model_warmup '{sample.name}'"
    batch = sample.batch_size
    if spec.max_batch_size > 0 and not 1 <= batch <= spec.max_batch_size:
        raise ConfigError(f"{where}: batch_size {batch} is outside 1..{spec.max_batch_size}")
    for name in sample.inputs:
        if name not in spec.input_by_name:
            raise ConfigError(f"{where}: the model has no input '{name}'")
    rng = np.random.default_rng(0)
    inputs: Tensors = {}
    for tensor in spec.inputs:
        if tensor.name not in sample.inputs:
            if tensor.optional:
                continue
            raise ConfigError(f"{where}: input '{tensor.name}' has no warmup data")
        data = sample.inputs[tensor.name]
        if datatype_of(data.data_type, f"{where} input '{tensor.name}'") is not tensor.datatype:
            raise ConfigError(
                f"{where}: input '{tensor.name}' data_type does not match the model's "
                f"{tensor.datatype.config_name}"
            )
        dims = tuple(int(d) for d in data.dims)
        if any(d < 1 for d in dims):
            raise ConfigError(f"{where}: input '{tensor.name}' dims must be positive: {dims}")
        shape = ((batch,) if spec.max_batch_size > 0 else ()) + dims
        inputs[tensor.name] = _data(data, tensor, shape, rng, model_dir, where)
    return inputs


def _data(
    data: ModelWarmup.Input,
    tensor: TensorSpec,
    shape: tuple[int, ...],
    rng: np.random.Generator,
    model_dir: Path,
    where: str,
) -> np.ndarray:
    dtype = tensor.datatype.numpy
    count = int(np.prod(shape))
    kind = data.WhichOneof("input_data_type")
    if tensor.datatype.is_bytes:
        if kind == "input_data_file":
            raise ConfigError(f"{where}: input_data_file is not supported for BYTES inputs")
        array = np.empty(count, dtype=object)
        array[:] = [b"" if kind == "zero_data" else b"warmup"] * count
        return array.reshape(shape)
    if kind == "random_data":
        if dtype.kind == "f":
            return rng.standard_normal(shape).astype(dtype)
        if dtype.kind == "b":
            return rng.integers(0, 2, shape).astype(dtype)
        return rng.integers(0, 100, shape).astype(dtype)
    if kind == "input_data_file":
        path = model_dir / "warmup" / data.input_data_file
        try:
            raw = path.read_bytes()
        except OSError as exc:
            raise ConfigError(f"{where}: cannot read input_data_file {path}: {exc}") from None
        needed = count * dtype.itemsize
        if len(raw) < needed:
            raise ConfigError(
                f"{where}: input_data_file {path.name} has {len(raw)} bytes, needs {needed}"
            )
        return np.frombuffer(raw, dtype=dtype, count=count).reshape(shape)
    return np.zeros(shape, dtype=dtype)
