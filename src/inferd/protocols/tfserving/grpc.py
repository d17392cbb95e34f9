"""TensorFlow Serving gRPC: ``tensorflow.serving.PredictionService`` (Predict,
GetModelMetadata, Classify, Regress) and ``ModelService.GetModelStatus``, on the same grpc.aio
server as the KServe service.

Only the messages live here: TensorProtos and tf.Examples are decoded into arrays and
``tfexample.Features`` for the core (``DataPlane.tfserving``, which routes each request once
and owns TF Serving's semantics), and answers are encoded as TF Serving encodes them: typed
value fields (``float_val``, ``int64_val``, ``string_val``...) by default, as its
``kAsProtoField``; ``tensor_content`` when the server runs with ``--tfserving-tensor-content``
(TF Serving's ``--enable_serialization_as_tensor_content``). Messages come from inferd's own
protos (``protocols/tfserving/``, same packages and field numbers as TF Serving's), so the
official ``tensorflow-serving-api`` stubs work unchanged and can share the process.
"""

from __future__ import annotations

import logging
from typing import Any

import grpc
import numpy as np

from inferd.core import datatypes
from inferd.core.datatypes import DataType
from inferd.core.errors import InvalidInput
from inferd.observability.requests import RequestObserver
from inferd.plane.dataplane import DataPlane
from inferd.plane.tfexample import Features
from inferd.plane.tfserving import ModelSignatures, Target, TensorInfo
from inferd.protocols import codecs
from inferd.protocols.grpc_common import Handler, guarded, safe_deserializer
from inferd.protocols.transport.grpc_services import GrpcService

# The package registers TF Serving's messages in inferd's private pool (before the pb2 modules).
from inferd.protocols.tfserving import error_codes_pb2  # isort: skip
from inferd.protocols.tfserving import serving_pb2 as pb  # isort: skip
from inferd.protocols.tfserving import tensorflow_pb2 as tf_pb  # isort: skip
from inferd.security.access import Access

log = logging.getLogger("inferd.grpc")

PREDICTION_SERVICE = "tensorflow.serving.PredictionService"
MODEL_SERVICE = "tensorflow.serving.ModelService"
SERVICES = (PREDICTION_SERVICE, MODEL_SERVICE)
_SIGNATURE_DEF = "signature_def"
# A tensor filled from one value (TensorFlow's rule) may not grow past this: a few bytes in a
# request must not allocate gigabytes in the server.
MAX_FILL_BYTES = 256 << 20

_STATE = {
    "READY": pb.ModelVersionStatus.AVAILABLE,
    "LOADING": pb.ModelVersionStatus.LOADING,
    "UNLOADING": pb.ModelVersionStatus.UNLOADING,
    "UNAVAILABLE": pb.ModelVersionStatus.END,
}
# TensorProto's typed value field per datatype (INT8..UINT16 widen into int_val).
_VALUE_FIELD = {
    "FP16": "half_val",
    "BF16": "half_val",
    "FP32": "float_val",
    "FP64": "double_val",
    "INT8": "int_val",
    "INT16": "int_val",
    "INT32": "int_val",
    "UINT8": "int_val",
    "UINT16": "int_val",
    "INT64": "int64_val",
    "BOOL": "bool_val",
    "UINT32": "uint32_val",
    "UINT64": "uint64_val",
    "BYTES": "string_val",
}
# Packed fixed-width fields whose wire bytes are the little-endian array itself.
_PACKED_TAG = {"float_val": b"\x2a", "double_val": b"\x32"}  # fields 5 and 6, length-delimited
_PACKED_DTYPE = {"float_val": "<f4", "double_val": "<f8"}


# --------------------------------------------------------------------------- tensors


def to_array(tensor: Any, name: str) -> np.ndarray:
    """A TensorProto's values as a numpy array of its shape (bytes tensors: object arrays)."""
    where = f"input '{name}'"
    try:
        tf_name = tf_pb.DataType.Name(tensor.dtype)
    except ValueError:
        raise InvalidInput(f"{where}: unknown dtype {tensor.dtype}") from None
    datatype = datatypes.BY_TF_NAME.get(tf_name)
    if datatype is None:
        raise InvalidInput(f"{where}: dtype {tf_name} is not supported")
    if tensor.tensor_shape.unknown_rank:
        raise InvalidInput(f"{where}: the tensor has no shape (unknown_rank)")
    shape = tuple(int(d.size) for d in tensor.tensor_shape.dim)
    if any(d < 0 for d in shape):
        raise InvalidInput(f"{where}: shape {list(shape)} has a negative dimension")
    shape = codecs.check_shape(name, shape)  # bounded rank and size: no overflow below
    count = int(np.prod(shape, dtype=np.int64))
    if datatype.is_bytes:
        values: Any = np.empty(len(tensor.string_val), dtype=object)
        values[:] = list(tensor.string_val)
    elif tensor.tensor_content:
        content = tensor.tensor_content
        if len(content) != count * datatype.itemsize:
            raise InvalidInput(
                f"{where}: tensor_content has {len(content)} bytes, shape {list(shape)} of "
                f"{tf_name} needs {count * datatype.itemsize}"
            )
        return np.frombuffer(content, dtype=datatype.numpy).reshape(shape)
    else:
        values = _typed_values(tensor, datatype)
    if len(values) == count:
        return np.asarray(values).reshape(shape)
    if len(values) <= 1 and count * max(datatype.itemsize, 8) > MAX_FILL_BYTES:
        raise InvalidInput(
            f"{where}: {len(values)} value(s) would fill shape {list(shape)}, more than "
            f"{MAX_FILL_BYTES >> 20} MiB; send the values"
        )
    if len(values) == 1:  # TensorFlow's rule: one value fills the tensor
        return np.full(shape, values[0], dtype=values.dtype)
    if len(values) == 0:
        return np.zeros(shape, dtype=datatype.numpy) if not datatype.is_bytes else values
    raise InvalidInput(f"{where}: {len(values)} values do not fill shape {list(shape)}")


def _typed_values(tensor: Any, datatype: DataType) -> np.ndarray:
    field = _VALUE_FIELD[datatype.name]
    if field == "half_val":  # bit patterns
        return np.asarray(tensor.half_val, dtype=np.uint16).view(datatype.numpy)
    return np.asarray(getattr(tensor, field), dtype=datatype.numpy)


def to_tensor(array: np.ndarray, tensor: Any, as_content: bool = False) -> None:
    """Fill a TensorProto: typed value fields (TF Serving's default), or raw bytes in
    tensor_content (strings always go in string_val)."""
    datatype = datatypes.of_array(array)
    tensor.dtype = tf_pb.DataType.Value(datatype.tf_name)
    for size in array.shape:
        tensor.tensor_shape.dim.add().size = size
    if datatype.is_bytes:
        tensor.string_val.extend(
            v if isinstance(v, bytes) else str(v).encode() for v in array.reshape(-1).tolist()
        )
        return
    flat = np.ascontiguousarray(array, dtype=datatype.numpy).reshape(-1)
    if as_content:
        tensor.tensor_content = flat.tobytes()
        return
    field = _VALUE_FIELD[datatype.name]
    tag = _PACKED_TAG.get(field)
    if tag is not None:  # protobuf parses the packed bytes in C: no per-element Python
        raw = flat.astype(_PACKED_DTYPE[field], copy=False).tobytes()
        if raw:
            tensor.MergeFromString(tag + _varint(len(raw)) + raw)
    elif field == "half_val":
        tensor.half_val.extend(flat.view(np.uint16).tolist())
    else:
        getattr(tensor, field).extend(flat.tolist())


def _varint(value: int) -> bytes:
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


# --------------------------------------------------------------------------- examples


def _features(example: Any, where: str) -> Features:
    found: dict[str, np.ndarray] = {}
    for key, feature in example.features.feature.items():
        kind = feature.WhichOneof("kind")
        if kind is None:
            raise InvalidInput(f"{where}: feature '{key}' has no value list")
        values = getattr(feature, kind).value
        if kind == "bytes_list":
            array = np.empty(len(values), dtype=object)
            array[:] = list(values)
        else:
            array = np.asarray(values, dtype=np.float32 if kind == "float_list" else np.int64)
        found[key] = array
    return found


def examples_of(request_input: Any) -> tuple[list[Features], Features]:
    """The examples of a Classify or Regress request, and their shared context."""
    kind = request_input.WhichOneof("kind")
    if kind is None:
        raise InvalidInput("the request's input has no examples")
    listed = getattr(request_input, kind)
    if not listed.examples:
        raise InvalidInput("the request's input has no examples")
    examples = [_features(e, f"example {i}") for i, e in enumerate(listed.examples)]
    context = _features(listed.context, "context") if kind == "example_list_with_context" else {}
    return examples, context


# --------------------------------------------------------------------------- service


class TfServingGrpc:
    """The handlers of TF Serving's PredictionService and ModelService."""

    def __init__(
        self,
        plane: DataPlane,
        observer: RequestObserver | None = None,
        tensor_content: bool = False,
    ) -> None:
        self.plane = plane
        self.tf = plane.tfserving
        self.observer = observer
        self.tensor_content = tensor_content

    def services(self) -> dict[str, dict[str, Any]]:
        """Method handlers by service name, for ``server.add_registered_method_handlers``."""
        prediction: dict[str, Handler] = {
            "Predict": self.predict,
            "GetModelMetadata": self.get_model_metadata,
            "Classify": self.classify,
            "Regress": self.regress,
        }
        model: dict[str, Handler] = {"GetModelStatus": self.get_model_status}
        return {
            PREDICTION_SERVICE: self._handlers("PredictionService", prediction),
            MODEL_SERVICE: self._handlers("ModelService", model),
        }

    def grpc_services(self) -> list[GrpcService]:
        """PredictionService and ModelService, each method with its access class."""
        return [
            GrpcService(name, handlers, {m: Access.INFERENCE for m in handlers})
            for name, handlers in self.services().items()
        ]

    def _handlers(self, service: str, handlers: dict[str, Handler]) -> dict[str, Any]:
        descriptor = pb.DESCRIPTOR.services_by_name[service]
        found: dict[str, Any] = {}
        for name, handler in handlers.items():
            method = descriptor.methods_by_name[name]
            found[name] = grpc.unary_unary_rpc_method_handler(
                guarded(descriptor.full_name, name, handler, self.observer),
                request_deserializer=safe_deserializer(
                    getattr(pb, method.input_type.name).FromString
                ),
                response_serializer=_serialize,
            )
        return found

    async def _target(self, model_spec: Any, verb: str) -> Target:
        name, version, label = _model_spec(model_spec)
        if self.plane.on_demand is not None:  # lazy serving: a model may need loading first
            await self.plane.loaded(name)
        return self.tf.target(name, version, label, model_spec.signature_name, verb)

    async def predict(self, request: Any) -> Any:
        target = await self._target(request.model_spec, "predict")
        inputs = {name: to_array(tensor, name) for name, tensor in request.inputs.items()}
        answer = await self.tf.predict(target, inputs, list(request.output_filter))
        response = pb.PredictResponse()
        _answer_spec(target, response.model_spec)
        for name, array in answer.outputs.items():
            to_tensor(array, response.outputs[name], self.tensor_content)
        return response

    async def classify(self, request: Any) -> Any:
        target = await self._target(request.model_spec, "classify")
        examples, context = examples_of(request.input)
        classified = await self.tf.classify(target, examples, context)
        response = pb.ClassificationResponse()
        _answer_spec(target, response.model_spec)
        for row in classified.results:
            classes = response.result.classifications.add().classes
            for label, score in row:
                classes.add(label=label, score=score)
        return response

    async def regress(self, request: Any) -> Any:
        target = await self._target(request.model_spec, "regress")
        examples, context = examples_of(request.input)
        regressed = await self.tf.regress(target, examples, context)
        response = pb.RegressionResponse()
        _answer_spec(target, response.model_spec)
        for value in regressed.results:
            response.result.regressions.add(value=value)
        return response

    async def get_model_metadata(self, request: Any) -> Any:
        name, version, label = _model_spec(request.model_spec)
        fields = list(request.metadata_field)
        if not fields:
            raise InvalidInput("metadata_field is empty; ask for 'signature_def'")
        unknown = [f for f in fields if f != _SIGNATURE_DEF]
        if unknown:
            raise InvalidInput(
                f"unknown metadata_field {unknown}; the one field is 'signature_def'"
            )
        await self.plane.loaded(name)
        meta = self.tf.metadata(name, version, label)
        response = pb.GetModelMetadataResponse()
        response.model_spec.name = meta.name
        response.model_spec.version.value = meta.version
        response.model_spec.signature_name = request.model_spec.signature_name or (
            meta.signatures[0].name
        )
        response.metadata[_SIGNATURE_DEF].Pack(_signature_defs(meta))
        return response

    async def get_model_status(self, request: Any) -> Any:
        spec = request.model_spec
        if not spec.name:
            raise InvalidInput("model_spec.name (the model name) is missing")
        version = ""
        if spec.WhichOneof("version_choice") == "version":
            version = str(spec.version.value)
        status = self.plane.model_status(spec.name, version)
        response = pb.GetModelStatusResponse()
        for state in status.versions:
            entry = response.model_version_status.add(version=state.version)
            entry.state = _STATE.get(state.state, pb.ModelVersionStatus.UNKNOWN)
            entry.status.error_code = (
                error_codes_pb2.UNKNOWN if state.reason else error_codes_pb2.OK
            )
            entry.status.error_message = state.reason
        return response


def _model_spec(model_spec: Any) -> tuple[str, str, str]:
    """(name, version, label) of a ModelSpec."""
    if not model_spec.name:
        raise InvalidInput("model_spec.name (the model name) is missing")
    choice = model_spec.WhichOneof("version_choice")
    if choice == "version":
        return model_spec.name, str(model_spec.version.value), ""
    if choice == "version_label":
        return model_spec.name, "", model_spec.version_label
    return model_spec.name, "", ""


def _answer_spec(target: Target, spec: Any) -> None:
    spec.name = target.name
    spec.version.value = target.version
    spec.signature_name = target.signature


def _signature_defs(meta: ModelSignatures) -> Any:
    signatures = pb.SignatureDefMap()
    for signature in meta.signatures:
        found = signatures.signature_def[signature.name]
        found.method_name = signature.method
        for tensors, target in (
            (signature.inputs, found.inputs),
            (signature.outputs, found.outputs),
        ):
            for tensor in tensors:
                _tensor_info(tensor, target[tensor.name])
    return signatures


def _tensor_info(tensor: TensorInfo, info: Any) -> None:
    info.name = tensor.name
    info.dtype = tf_pb.DataType.Value(tensor.datatype.tf_name)
    for size in tensor.dims:
        info.tensor_shape.dim.add().size = size


def _serialize(message: Any) -> bytes:
    data: bytes = message.SerializeToString()
    return data
