"""Model configs as text and JSON: Triton's ``config.pbtxt`` text format and its JSON form.

Parsing errors are ConfigErrors naming the field; ``config_to_dict`` prints a config as Triton
does (proto field names, enums by name, int64 values as numbers).
"""

from __future__ import annotations

import difflib
import re
from typing import Any

from google.protobuf import json_format, text_format
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from inferd.config.model_config_pb2 import ModelConfig
from inferd.core.errors import ConfigError

CONFIG_FILENAME = "config.pbtxt"


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
    # protobuf says 'Message type "inferd.ModelConfig" has no field named "x"': keep the field,
    # and add what a typo most likely meant.
    cleaned = message.replace('"inferd.', '"').replace("Message type", "message").strip()
    return cleaned.rstrip(".") + _hint(message)


_NO_FIELD = re.compile(r'Message type "([\w.]+)" has no field named "(\w+)"')
_NO_VALUE = re.compile(r'Enum type "([\w.]+)" has no value named (\w+)')
_CLOSE = 0.8  # a typo, not another field: "model_operations" is no "model_transaction_policy"
_BAD_ENUM = re.compile(r"Invalid enum value (\w+) for enum type ([\w.]+)")


def _hint(message: str) -> str:
    """The closest field name (difflib), else the message's fields; for an enum, the closest
    value and every valid one. "" when protobuf's message is of another kind."""
    pool = ModelConfig.DESCRIPTOR.file.pool
    if found := _NO_FIELD.search(message):
        names = [f.name for f in pool.FindMessageTypeByName(found.group(1)).fields]
        close = difflib.get_close_matches(found.group(2), names, n=1, cutoff=_CLOSE)
        if close:
            return f'; did you mean "{close[0]}"?'
        return f"; its fields: {', '.join(names)}"
    found = _NO_VALUE.search(message)
    enum, value = (found.group(1), found.group(2)) if found else ("", "")
    if not found and (found := _BAD_ENUM.search(message)):
        enum, value = found.group(2), found.group(1)
    if not enum:
        return ""
    values = [v.name for v in pool.FindEnumTypeByName(enum).values if "INVALID" not in v.name]
    close = difflib.get_close_matches(value, values, n=1)  # all are listed: a guess is cheap
    meant = f" (did you mean {close[0]}?)" if close else ""
    return f"; valid values{meant}: {', '.join(values)}"


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
