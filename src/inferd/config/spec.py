"""The typed view of a ModelConfig: ModelSpec and TensorSpec, built and checked once at load.

Fields present in the message (so Triton configs parse) that the server does not act on are
refused here with a message naming the field; nothing is silently ignored.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from inferd.config.model_config_pb2 import DataType as DataTypeEnum
from inferd.config.model_config_pb2 import (
    ModelConfig,
    ModelInput,
    ModelInstanceGroup,
    ModelOutput,
)
from inferd.core import datatypes
from inferd.core.datatypes import DataType
from inferd.core.errors import ConfigError

_INPUT_NOT_IMPLEMENTED = ("is_shape_tensor", "allow_ragged_batch")
_OUTPUT_NOT_IMPLEMENTED = ("is_shape_tensor",)


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """One input or output as clients see it (``dims`` excludes the batch dimension).

    ``model_dims`` is what the model itself takes or gives when the config reshapes it.
    """

    name: str
    datatype: DataType
    dims: tuple[int, ...]
    model_dims: tuple[int, ...]
    optional: bool = False

    def shape(self, max_batch_size: int) -> list[int]:
        """The full shape as metadata reports it: -1 leads when the model batches."""
        return ([-1] if max_batch_size > 0 else []) + list(self.dims)

    @property
    def reshaped(self) -> bool:
        return self.dims != self.model_dims


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """The typed, validated view of a ModelConfig that the request path checks against."""

    name: str
    platform: str
    backend: str
    max_batch_size: int
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    input_by_name: dict[str, TensorSpec] = field(repr=False)
    output_by_name: dict[str, TensorSpec] = field(repr=False)
    reshaped_outputs: bool = field(default=False, repr=False)  # some output's dims differ
    # Input signatures that passed ``validate.check_inputs``: (name, dtype, shape) per input,
    # in the request's order -> the batch size and each input's reshape (None: as it came).
    accepted: dict[tuple[Any, ...], tuple[int, tuple[tuple[str, Any], ...] | None]] = field(
        default_factory=dict, repr=False, compare=False
    )
    output_names: tuple[str, ...] = field(init=False, repr=False, compare=False)
    # The outputs whose config dims differ from the model's: name -> the config's dims.
    output_reshapes: tuple[tuple[str, tuple[int, ...]], ...] = field(
        init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        object.__setattr__(self, "output_names", tuple(o.name for o in self.outputs))
        reshapes = tuple((o.name, o.dims) for o in self.outputs if o.reshaped)
        object.__setattr__(self, "output_reshapes", reshapes)


# TF Serving's signature methods (SignatureDef.method_name) and its default signature key.
PREDICT_METHOD = "tensorflow/serving/predict"
CLASSIFY_METHOD = "tensorflow/serving/classify"
REGRESS_METHOD = "tensorflow/serving/regress"
DEFAULT_SIGNATURE = "serving_default"


@dataclass(frozen=True, slots=True)
class SignatureSpec:
    """One signature of a model file (a SavedModel's SignatureDef): a method and its tensors,
    checked like a model's own (``spec``: batched when every tensor has a variable first
    dimension and the model batches)."""

    name: str
    method: str
    spec: ModelSpec


def signature_spec(
    config: ModelConfig,
    name: str,
    method: str,
    inputs: Sequence[tuple[str, DataType, tuple[int, ...]]],
    outputs: Sequence[tuple[str, DataType, tuple[int, ...]]],
) -> SignatureSpec:
    """A signature's spec from its tensors' full shapes (batch dimension included, -1: any)."""
    batched = config.max_batch_size > 0 and all(
        dims and dims[0] == -1 for _, _, dims in (*inputs, *outputs)
    )

    def tensor(item: tuple[str, DataType, tuple[int, ...]]) -> TensorSpec:
        key, datatype, dims = item
        own = dims[1:] if batched else dims
        return TensorSpec(key, datatype, own, own)

    ins = tuple(tensor(t) for t in inputs)
    outs = tuple(tensor(t) for t in outputs)
    spec = ModelSpec(
        name=config.name,
        platform=config.platform,
        backend=config.backend,
        max_batch_size=config.max_batch_size if batched else 0,
        inputs=ins,
        outputs=outs,
        input_by_name={t.name: t for t in ins},
        output_by_name={t.name: t for t in outs},
    )
    return SignatureSpec(name, method, spec)


def datatype_of(enum_value: int, where: str) -> DataType:
    name: str = DataTypeEnum.Name(enum_value)
    if name == "TYPE_INVALID":
        raise ConfigError(f"{where}: data_type is missing")
    return datatypes.from_config_name(name)


def config_enum_of(datatype: DataType) -> int:
    value: int = DataTypeEnum.Value(datatype.config_name)
    return value


def check_supported(config: ModelConfig) -> None:
    """Reject fields that parse but that this server does not implement."""
    for inp in config.input:
        for fname in _INPUT_NOT_IMPLEMENTED:
            if getattr(inp, fname):
                raise ConfigError(f"input '{inp.name}': config field '{fname}' is not supported")
    for out in config.output:
        for fname in _OUTPUT_NOT_IMPLEMENTED:
            if getattr(out, fname):
                raise ConfigError(f"output '{out.name}': config field '{fname}' is not supported")
    _check_optimization(config)
    for group in config.instance_group:
        if group.kind == ModelInstanceGroup.KIND_MODEL:
            raise ConfigError("instance_group kind KIND_MODEL is not supported")
        if group.count < 0:
            raise ConfigError(f"instance_group count must be positive, got {group.count}")


def _check_optimization(config: ModelConfig) -> None:
    """``optimization``: graph level and accelerators are the ONNX Runtime backend's; pinned
    memory buffers are accepted (they matter only for GPU copies, which inferd does not stage)."""
    if not config.HasField("optimization"):
        return
    optimization = config.optimization
    if optimization.priority != 0:
        raise ConfigError("config field 'optimization.priority' is not supported")
    onnx = config.backend == "onnxruntime" or (
        not config.backend and config.platform == "onnxruntime_onnx"
    )
    for fname in ("graph", "execution_accelerators"):
        if optimization.HasField(fname) and not onnx:
            raise ConfigError(
                f"config field 'optimization.{fname}' applies to ONNX Runtime models only "
                f"(this model's backend is '{config.backend or config.platform}')"
            )


def build_spec(config: ModelConfig) -> ModelSpec:
    """Validate a completed config and return its typed view."""
    check_supported(config)
    if config.max_batch_size < 0:
        raise ConfigError(f"max_batch_size must be >= 0, got {config.max_batch_size}")
    if not config.input:
        raise ConfigError("the model has no inputs (config lists none and none were found)")
    if not config.output:
        raise ConfigError("the model has no outputs (config lists none and none were found)")
    inputs = tuple(_tensor_spec(t, "input") for t in config.input)
    outputs = tuple(_tensor_spec(t, "output") for t in config.output)
    for kind, specs in (("input", inputs), ("output", outputs)):
        names = [s.name for s in specs]
        if len(set(names)) != len(names):
            raise ConfigError(f"{kind} names are not unique: {names}")
    return ModelSpec(
        name=config.name,
        platform=config.platform,
        backend=config.backend,
        max_batch_size=config.max_batch_size,
        inputs=inputs,
        outputs=outputs,
        input_by_name={s.name: s for s in inputs},
        output_by_name={s.name: s for s in outputs},
        reshaped_outputs=any(s.reshaped for s in outputs),
    )


def _tensor_spec(tensor: ModelInput | ModelOutput, kind: str) -> TensorSpec:
    if not tensor.name:
        raise ConfigError(f"an {kind} has no name")
    where = f"{kind} '{tensor.name}'"
    datatype = datatype_of(tensor.data_type, where)
    dims = tuple(int(d) for d in tensor.dims)
    if any(d < -1 or d == 0 for d in dims):
        raise ConfigError(f"{where}: dims must be positive or -1, got {list(dims)}")
    model_dims = dims
    if tensor.HasField("reshape"):
        model_dims = tuple(int(d) for d in tensor.reshape.shape)
        if -1 not in dims and -1 not in model_dims and _count(dims) != _count(model_dims):
            raise ConfigError(
                f"{where}: reshape {list(model_dims)} has a different element count "
                f"than dims {list(dims)}"
            )
    optional = bool(getattr(tensor, "optional", False))
    return TensorSpec(tensor.name, datatype, dims, model_dims, optional)


def _count(dims: tuple[int, ...]) -> int:
    n = 1
    for d in dims:
        n *= d
    return n
