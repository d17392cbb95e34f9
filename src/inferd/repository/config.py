"""Model configuration: parse config.pbtxt, check it, and derive the typed ModelSpec.

``config.pbtxt`` is read with protobuf's text format against our own ``ModelConfig``
message (a subset of Triton's). Fields the server does not implement fail the load with a
message naming the field; nothing is silently ignored.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from google.protobuf import json_format, text_format
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from inferd import datatypes
from inferd.datatypes import DataType
from inferd.errors import ConfigError
from inferd.repository.model_config_pb2 import (
    DataType as DataTypeEnum,
)
from inferd.repository.model_config_pb2 import (
    ModelConfig,
    ModelInput,
    ModelInstanceGroup,
    ModelOutput,
)

CONFIG_FILENAME = "config.pbtxt"

# Fields present in the message (so Triton configs parse) that this server does not act on.
# Setting one is an error naming it.
_INPUT_NOT_IMPLEMENTED = ("is_shape_tensor", "allow_ragged_batch")
_OUTPUT_NOT_IMPLEMENTED = ("is_shape_tensor", "label_filename")


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


def parse_config_text(text: str, source: str = CONFIG_FILENAME) -> ModelConfig:
    config = ModelConfig()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as exc:
        raise ConfigError(f"{source}: {_clean_parse_error(str(exc))}") from None
    return config


def parse_config_json(value: dict[str, Any], source: str = "config override") -> ModelConfig:
    config = ModelConfig()
    try:
        json_format.ParseDict(value, config)
    except json_format.ParseError as exc:
        raise ConfigError(f"{source}: {_clean_parse_error(str(exc))}") from None
    return config


def _clean_parse_error(message: str) -> str:
    # protobuf says 'Message type "inferd.ModelConfig" has no field named "x"': keep the field.
    return message.replace('"inferd.', '"').replace("Message type", "message").strip()


def read_config(model_dir: Path) -> ModelConfig:
    """The model's config.pbtxt, or an empty config named after the folder."""
    path = model_dir / CONFIG_FILENAME
    if path.is_file():
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"cannot read {path.name}: {exc}") from None
        config = parse_config_text(text, str(path.name))
    else:
        config = ModelConfig()
    if not config.name:
        config.name = model_dir.name
    elif config.name != model_dir.name:
        raise ConfigError(
            f"config name '{config.name}' does not match the model folder '{model_dir.name}'"
        )
    return config


def config_to_dict(config: Message) -> dict[str, Any]:
    """JSON form as Triton prints it: proto field names, enums by name, int64 as numbers."""
    raw = json_format.MessageToDict(
        config, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    return _int64_as_numbers(config, raw)


_INT64_TYPES = {
    FieldDescriptor.TYPE_INT64,
    FieldDescriptor.TYPE_UINT64,
    FieldDescriptor.TYPE_SINT64,
    FieldDescriptor.TYPE_FIXED64,
    FieldDescriptor.TYPE_SFIXED64,
}


def _int64_as_numbers(message: Message, raw: dict[str, Any]) -> dict[str, Any]:
    fields: list[Any] = list(message.DESCRIPTOR.fields)
    for fd in fields:
        if fd.name not in raw:
            continue
        value = raw[fd.name]
        if fd.type in _INT64_TYPES:
            raw[fd.name] = [int(v) for v in value] if isinstance(value, list) else int(value)
        elif fd.type == FieldDescriptor.TYPE_MESSAGE:
            sub = getattr(message, fd.name)
            if fd.message_type.GetOptions().map_entry:
                value_fd = fd.message_type.fields_by_name["value"]
                if value_fd.type == FieldDescriptor.TYPE_MESSAGE:
                    raw[fd.name] = {
                        k: _int64_as_numbers(sub[_map_key(sub, k)], v) for k, v in value.items()
                    }
            elif fd.is_repeated:
                raw[fd.name] = [_int64_as_numbers(m, v) for m, v in zip(sub, value, strict=True)]
            else:
                raw[fd.name] = _int64_as_numbers(sub, value)
    return raw


def _map_key(container: Any, key: str) -> Any:
    # JSON map keys are strings; integer-keyed maps need the key back as a number.
    for k in container:
        if str(k) == key:
            return k
    return key


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
    for group in config.instance_group:
        if group.kind == ModelInstanceGroup.KIND_MODEL:
            raise ConfigError("instance_group kind KIND_MODEL is not supported")
        if group.count < 0:
            raise ConfigError(f"instance_group count must be positive, got {group.count}")


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
