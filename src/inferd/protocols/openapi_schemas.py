"""The named schemas of inferd's OpenAPI description (``components.schemas``): the bodies the
HTTP routes take and answer, as strict as the handlers that read them (a body these schemas
refuse, the server refuses with 400)."""

from __future__ import annotations

from typing import Any

from inferd.core import datatypes
from inferd.protocols.codecs import MAX_DIMS

Schema = dict[str, Any]


def ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


_PARAMETERS: Schema = {"type": "object", "additionalProperties": True}
_SHAPE: Schema = {
    "type": "array",
    "maxItems": MAX_DIMS,
    "items": {"type": "integer", "minimum": 0},
}
_TIME_OR_NULL: Schema = {"type": "string", "nullable": True}
_NULLABLE_OBJECT: Schema = {"type": "object", "nullable": True, "additionalProperties": True}
_STRING: Schema = {"type": "string"}

_LEVEL: Schema = {"type": "string", "enum": ["OFF", "TIMESTAMPS"]}


def _setting(*forms: Schema) -> Schema:
    """A trace setting: Triton's string (an integer, or a list of one value, are read too)."""
    one: Schema = {"anyOf": list(forms)}
    return {
        "anyOf": [*forms, {"type": "array", "minItems": 1, "maxItems": 1, "items": one}],
        "nullable": True,
    }


def _number(pattern: str, minimum: int) -> Schema:
    return _setting({"type": "string", "pattern": pattern}, {"type": "integer", "minimum": minimum})


SCHEMAS: dict[str, Schema] = {
    "Error": {
        "type": "object",
        "required": ["error"],
        "properties": {"error": {"type": "string", "description": "one line naming the fault"}},
    },
    "Live": {
        "type": "object",
        "required": ["status"],
        "properties": {"status": {"type": "string", "enum": ["alive"]}},
    },
    "Ready": {
        "type": "object",
        "required": ["ready"],
        "properties": {"ready": {"type": "boolean"}, "name": _STRING},
    },
    "InferInputTensor": {
        "type": "object",
        "required": ["name", "shape", "datatype"],
        "properties": {
            "name": _STRING,
            "shape": _SHAPE,
            "datatype": {"type": "string", "enum": list(datatypes.BY_NAME)},
            "parameters": {
                "type": "object",
                "additionalProperties": True,
                "properties": {
                    "binary_data_size": {"type": "integer", "minimum": 0},
                    "shared_memory_region": _STRING,
                    "shared_memory_byte_size": {"type": "integer", "minimum": 0},
                    "shared_memory_offset": {"type": "integer", "minimum": 0},
                },
            },
            # A (nested) list of values, row-major; absent when the tensor travels as binary
            # data (parameters.binary_data_size) or in a shared memory region.
            "data": {},
        },
        "oneOf": [  # one way to carry the values
            {  # BF16 travels as binary data only
                "required": ["data"],
                "properties": {"datatype": {"enum": [n for n in datatypes.BY_NAME if n != "BF16"]}},
            },
            {
                "required": ["parameters"],
                "properties": {"parameters": {"required": ["binary_data_size"]}},
            },
            {
                "required": ["parameters"],
                "properties": {"parameters": {"required": ["shared_memory_region"]}},
            },
        ],
    },
    "InferRequestedOutput": {
        "type": "object",
        "required": ["name"],
        "properties": {"name": _STRING, "parameters": _PARAMETERS},
    },
    "InferRequest": {
        "type": "object",
        "required": ["inputs"],
        "properties": {
            "id": _STRING,
            "parameters": _PARAMETERS,
            "inputs": {
                "type": "array",
                "minItems": 1,
                "description": "each name once",
                "items": ref("InferInputTensor"),
            },
            "outputs": {"type": "array", "items": ref("InferRequestedOutput")},
        },
    },
    "InferOutputTensor": {
        "type": "object",
        "required": ["name", "shape", "datatype"],
        "properties": {
            "name": _STRING,
            "shape": {"type": "array", "items": {"type": "integer", "minimum": 0}},
            "datatype": _STRING,
            "parameters": _PARAMETERS,
            "data": {"type": "array"},
        },
    },
    "InferResponse": {
        "type": "object",
        "required": ["model_name", "outputs"],
        "properties": {
            "model_name": _STRING,
            "model_version": _STRING,
            "id": _STRING,
            "parameters": _PARAMETERS,
            "outputs": {"type": "array", "items": ref("InferOutputTensor")},
        },
    },
    "ModelMetadata": {
        "type": "object",
        "required": ["name", "versions", "platform", "inputs", "outputs"],
        "properties": {
            "name": _STRING,
            "versions": {"type": "array", "items": _STRING},
            "platform": _STRING,
            "inputs": {"type": "array", "items": ref("TensorMetadata")},
            "outputs": {"type": "array", "items": ref("TensorMetadata")},
        },
    },
    "TensorMetadata": {
        "type": "object",
        "required": ["name", "datatype", "shape"],
        "properties": {
            "name": _STRING,
            "datatype": _STRING,
            "shape": {"type": "array", "items": {"type": "integer"}},
        },
    },
    "Residency": {  # lazy serving (--model-memory-budget): where each model stands
        "type": "object",
        "properties": {
            "state": {"enum": ["available", "loading", "loaded", "evicted", "failed"]},
            "memory_bytes": {"type": "integer", "minimum": 0},
            "pinned": {"type": "boolean"},
            "loads": {"type": "integer", "minimum": 0},
            "loaded_at": _TIME_OR_NULL,
            "last_used_at": _TIME_OR_NULL,
            "evicted_at": _TIME_OR_NULL,
            "reason": _STRING,
            "in_flight": {"type": "integer", "minimum": 0},
        },
    },
    "RepositoryIndex": {
        "type": "array",
        "items": {
            "type": "object",
            "required": ["name", "version", "state", "reason"],
            "properties": {
                **{k: _STRING for k in ("name", "version", "state", "reason")},
                "residency": ref("Residency"),
            },
        },
    },
    "IndexRequest": {
        "type": "object",
        "properties": {"ready": {"type": "boolean", "description": "only the ready models"}},
    },
    "LoadRequest": {
        "type": "object",
        "properties": {
            "parameters": {
                "type": "object",
                "description": "config: the model config as JSON; file:<version>/<path>: a "
                "file's content, base64",
                "additionalProperties": True,
                "properties": {"config": _STRING},
            }
        },
    },
    "UnloadRequest": {
        "type": "object",
        "properties": {
            "parameters": {
                "type": "object",
                "additionalProperties": True,
                "properties": {"unload_dependents": {"type": "boolean"}},
            }
        },
    },
    "LabelsRequest": {
        "type": "object",
        "required": ["labels"],
        "properties": {
            "labels": {
                "type": "object",
                "description": "label -> version number, or null to remove the label",
                "additionalProperties": {"type": "integer", "nullable": True},
            }
        },
    },
    "RoutingRequest": {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "labels": _NULLABLE_OBJECT,
            "traffic_split": _NULLABLE_OBJECT,
            "shadow": _NULLABLE_OBJECT,
        },
    },
    "Routing": {
        "type": "object",
        "required": ["name"],
        "properties": {
            "name": _STRING,
            "labels": {"type": "object"},
            "traffic_split": {"type": "object"},
            "shadow": {"type": "object", "nullable": True},
            "shadow_stats": {"type": "object"},
        },
    },
    "Object": {"type": "object"},
    "RegionStatus": {
        "type": "array",
        "items": {
            "type": "object",
            "required": ["name", "key", "offset", "byte_size"],
            "properties": {
                "name": _STRING,
                "key": _STRING,
                "offset": {"type": "integer", "minimum": 0},
                "byte_size": {"type": "integer", "minimum": 0},
            },
        },
    },
    "RegisterRegion": {
        "type": "object",
        "required": ["key", "byte_size"],
        "properties": {
            "key": {
                "type": "string",
                "pattern": "^/[^/]+$",
                "description": "a POSIX shared memory name",
            },
            "offset": {"type": "integer", "minimum": 0},
            "byte_size": {"type": "integer", "minimum": 0},
        },
    },
    "TraceSettings": {
        "type": "object",
        "description": "Triton's trace settings; null restores a setting's default. Tracing on "
        "(TIMESTAMPS) needs --trace-exporter; the file, mode and frequency stay as they are.",
        "additionalProperties": False,
        "properties": {
            "trace_level": {
                "anyOf": [_LEVEL, {"type": "array", "minItems": 1, "items": _LEVEL}],
                "nullable": True,
            },
            "trace_rate": _number("^0*[1-9][0-9]*$", 1),
            "trace_count": _number("^(-1|[0-9]+)$", -1),
            # fixed: OpenTelemetry exports the traces (--trace-exporter)
            "log_frequency": _setting(
                {"type": "string", "enum": ["0"]}, {"type": "integer", "enum": [0]}
            ),
            "trace_file": _setting({"type": "string", "enum": [""]}),
            "trace_mode": _setting({"type": "string", "enum": ["opentelemetry"]}),
        },
    },
    "LogSettings": {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "log_file": {"type": "string", "description": "a file the server opens and writes"},
            "log_info": {"type": "boolean"},
            "log_warning": {"type": "boolean"},
            "log_error": {"type": "boolean"},
            "log_verbose_level": {"type": "integer"},
            "log_format": {"type": "string"},
        },
    },
    "GenerateRequest": {
        "type": "object",
        "description": "each other key names an input: a value, or a flat list of values",
        "additionalProperties": True,
        "properties": {"id": _STRING, "parameters": _PARAMETERS},
    },
    "GenerateResponse": {
        "type": "object",
        "required": ["model_name", "model_version"],
        "additionalProperties": True,
        "properties": {"model_name": _STRING, "model_version": _STRING, "id": _STRING},
    },
    "TfPredictRequest": {
        "type": "object",
        "description": "exactly one of instances (rows) or inputs (columns)",
        "properties": {
            "signature_name": _STRING,
            "instances": {"type": "array", "minItems": 1},
            "inputs": {},
        },
        "oneOf": [{"required": ["instances"]}, {"required": ["inputs"]}],
    },
    "TfExamplesRequest": {
        "type": "object",
        "required": ["examples"],
        "properties": {
            "signature_name": _STRING,
            "examples": {"type": "array", "minItems": 1, "items": {"type": "object"}},
            "context": {"type": "object"},
        },
    },
    "TfPredictResponse": {
        "type": "object",
        "properties": {"predictions": {}, "outputs": {}},
    },
    "TfResultsResponse": {
        "type": "object",
        "required": ["results"],
        "properties": {"results": {"type": "array"}},
    },
    "TfModelStatus": {
        "type": "object",
        "required": ["name", "ready", "model_version_status"],
        "properties": {
            "name": _STRING,
            "ready": {"type": "boolean"},
            "model_version_status": {"type": "array"},
        },
    },
}
