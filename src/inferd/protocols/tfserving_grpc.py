"""TensorFlow Serving gRPC: ``tensorflow.serving.PredictionService`` (Predict,
GetModelMetadata, Classify, Regress) and ``ModelService.GetModelStatus``, on the same grpc.aio
server as the KServe service.

A thin adapter over the DataPlane, as tfserving_http.py is: TensorProtos become the same
InferRequest (numpy arrays), every check lives in the core, and answers are shaped as the model
itself gives them, as TF Serving clients expect. Messages come from inferd's own protos
(``protocols/tfserving/``, same packages and field numbers as TF Serving's), so the official
``tensorflow-serving-api`` stubs work unchanged and can share the process.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterable
from typing import Any

import grpc
import numpy as np

from inferd import datatypes, validate
from inferd.config.spec import ModelSpec, TensorSpec
from inferd.dataplane import DataPlane
from inferd.datatypes import DataType
from inferd.errors import InvalidInput, NotFound, Unavailable
from inferd.model import ModelState, ModelVersion
from inferd.observability.requests import RequestObserver
from inferd.protocols.grpc_common import Handler, guarded, safe_deserializer
from inferd.types import InferRequest, RequestedOutput, Tensors

# The package registers TF Serving's messages in inferd's private pool (before the pb2 modules).
from inferd.protocols.tfserving import error_codes_pb2  # isort: skip
from inferd.protocols.tfserving import serving_pb2 as pb  # isort: skip
from inferd.protocols.tfserving import tensorflow_pb2 as tf_pb  # isort: skip

log = logging.getLogger("inferd.grpc")

PREDICTION_SERVICE = "tensorflow.serving.PredictionService"
MODEL_SERVICE = "tensorflow.serving.ModelService"
SERVICES = (PREDICTION_SERVICE, MODEL_SERVICE)
DEFAULT_SIGNATURE = "serving_default"
_PREDICT_METHOD = "tensorflow/serving/predict"
_SIGNATURE_DEF = "signature_def"
_FLOAT_TYPES = ("FP16", "FP32", "FP64", "BF16")

_STATE = {
    ModelState.READY: pb.ModelVersionStatus.AVAILABLE,
    ModelState.LOADING: pb.ModelVersionStatus.LOADING,
    ModelState.UNLOADING: pb.ModelVersionStatus.UNLOADING,
    ModelState.UNAVAILABLE: pb.ModelVersionStatus.END,
}


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
    if len(values) == 1:  # TensorFlow's rule: one value fills the tensor
        return np.full(shape, values[0], dtype=values.dtype)
    if len(values) == 0:
        return np.zeros(shape, dtype=datatype.numpy) if not datatype.is_bytes else values
    raise InvalidInput(f"{where}: {len(values)} values do not fill shape {list(shape)}")


def _typed_values(tensor: Any, datatype: DataType) -> np.ndarray:
    name = datatype.name
    if name in ("FP16", "BF16"):  # bit patterns in half_val
        return np.asarray(tensor.half_val, dtype=np.uint16).view(datatype.numpy)
    field = {
        "FP32": "float_val",
        "FP64": "double_val",
        "INT64": "int64_val",
        "BOOL": "bool_val",
        "UINT32": "uint32_val",
        "UINT64": "uint64_val",
    }.get(name, "int_val")  # INT32, INT16, INT8, UINT8, UINT16
    return np.asarray(getattr(tensor, field), dtype=datatype.numpy)


def to_tensor(array: np.ndarray, tensor: Any) -> None:
    """Fill a TensorProto from an array: raw bytes in tensor_content, strings in string_val."""
    datatype = datatypes.of_array(array)
    tensor.dtype = tf_pb.DataType.Value(datatype.tf_name)
    for size in array.shape:
        tensor.tensor_shape.dim.add().size = size
    if datatype.is_bytes:
        tensor.string_val.extend(
            v if isinstance(v, bytes) else str(v).encode() for v in array.reshape(-1).tolist()
        )
    else:
        tensor.tensor_content = np.ascontiguousarray(array, dtype=datatype.numpy).tobytes()


# --------------------------------------------------------------------------- examples


def _feature_values(feature: Any, where: str) -> list[Any]:
    kind = feature.WhichOneof("kind")
    if kind is None:
        raise InvalidInput(f"{where} has no value list")
    values: list[Any] = list(getattr(feature, kind).value)
    return values


def example_inputs(spec: ModelSpec, request_input: Any) -> Tensors:
    """tf.Examples into one batch: feature ``k`` of every example is row data of input ``k``."""
    kind = request_input.WhichOneof("kind")
    if kind is None:
        raise InvalidInput("the request's input has no examples")
    listed = getattr(request_input, kind)
    if not listed.examples:
        raise InvalidInput("the request's input has no examples")
    context = listed.context.features.feature if kind == "example_list_with_context" else {}
    columns: dict[str, list[list[Any]]] = {t.name: [] for t in spec.inputs}
    for index, example in enumerate(listed.examples):
        features = example.features.feature
        for key in features:
            if key not in spec.input_by_name:
                raise InvalidInput(f"example {index} has unknown feature '{key}'")
        for tensor in spec.inputs:
            feature = features.get(tensor.name)
            if feature is None and tensor.name in context:
                feature = context[tensor.name]
            if feature is None:
                raise InvalidInput(f"example {index} lacks feature '{tensor.name}'")
            columns[tensor.name].append(_feature_values(feature, f"feature '{tensor.name}'"))
    return {name: _column(spec.input_by_name[name], rows) for name, rows in columns.items()}


def _column(tensor: TensorSpec, rows: list[list[Any]]) -> np.ndarray:
    dims = tuple(tensor.model_dims)
    try:
        if tensor.datatype.is_bytes:
            flat = np.empty(sum(len(r) for r in rows), dtype=object)
            flat[:] = list(itertools.chain.from_iterable(rows))
        else:
            flat = np.concatenate([np.asarray(r, dtype=tensor.datatype.numpy) for r in rows])
        column: np.ndarray = flat.reshape((len(rows), *dims))
        return column
    except ValueError:
        raise InvalidInput(
            f"feature '{tensor.name}': {len(rows)} examples do not fill shape "
            f"[{len(rows)}, {', '.join(str(d) for d in dims)}]"
        ) from None


def _scores(model: ModelVersion, outputs: Tensors, verb: str) -> np.ndarray:
    for tensor in model.spec.outputs:
        array = outputs[tensor.name]
        if tensor.datatype.name in _FLOAT_TYPES and (
            (verb == "Classify" and array.ndim == 2 and array.shape[1] > 1)
            or (verb == "Regress" and array.ndim in (1, 2) and array[0].size == 1)
        ):
            return array.astype(np.float64)
    wanted = "[batch, classes] float scores" if verb == "Classify" else "one float per example"
    raise InvalidInput(f"model '{model.name}' has no output of {wanted}; {verb} does not fit it")


# --------------------------------------------------------------------------- service


class TfServingGrpc:
    """The handlers of TF Serving's PredictionService and ModelService."""

    def __init__(self, plane: DataPlane, observer: RequestObserver | None = None) -> None:
        self.plane = plane
        self.observer = observer

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

    def _model(self, model_spec: Any) -> ModelVersion:
        if not model_spec.name:
            raise InvalidInput("model_spec.name (the model name) is missing")
        choice = model_spec.WhichOneof("version_choice")
        version = str(model_spec.version.value) if choice == "version" else ""
        if choice == "version_label":
            version = self.plane.version_of(model_spec.name, "", model_spec.version_label)
        model = self.plane.route(model_spec.name, version)  # no version: the traffic split
        signature = model_spec.signature_name
        params = model.config.parameters
        configured = params["signature_name"].string_value if "signature_name" in params else ""
        served = {"", DEFAULT_SIGNATURE, configured}
        if signature not in served:
            raise InvalidInput(
                f"unknown signature_name '{signature}'; model '{model.name}' serves "
                f"'{DEFAULT_SIGNATURE}'"
            )
        return model

    def _answer_spec(self, model: ModelVersion, model_spec: Any, target: Any) -> None:
        target.name = model.name
        target.version.value = model.version
        target.signature_name = model_spec.signature_name or DEFAULT_SIGNATURE

    async def _infer(
        self, model: ModelVersion, inputs: Tensors, names: Iterable[str] = ()
    ) -> Tensors:
        outputs = [RequestedOutput(n) for n in names] or None
        request = InferRequest(model.name, inputs, str(model.version), outputs=outputs)
        response = await self.plane.infer(request)
        return validate.native_outputs(model.spec, response.outputs)

    async def predict(self, request: Any) -> Any:
        model = self._model(request.model_spec)
        inputs = {name: to_array(tensor, name) for name, tensor in request.inputs.items()}
        outputs = await self._infer(model, inputs, request.output_filter)
        response = pb.PredictResponse()
        self._answer_spec(model, request.model_spec, response.model_spec)
        for name, array in outputs.items():
            to_tensor(array, response.outputs[name])
        return response

    async def classify(self, request: Any) -> Any:
        model = self._model(request.model_spec)
        outputs = await self._infer(model, example_inputs(model.spec, request.input))
        scores = _scores(model, outputs, "Classify")
        labels = outputs.get("classes")
        if labels is None or labels.shape != scores.shape or labels.dtype != object:
            labels = np.broadcast_to(np.arange(scores.shape[1]).astype(str), scores.shape)
        response = pb.ClassificationResponse()
        self._answer_spec(model, request.model_spec, response.model_spec)
        for label_row, score_row in zip(labels.tolist(), scores.tolist(), strict=True):
            classes = response.result.classifications.add().classes
            for label, score in zip(label_row, score_row, strict=True):
                text = label.decode("utf-8", "replace") if isinstance(label, bytes) else label
                classes.add(label=text, score=score)
        return response

    async def regress(self, request: Any) -> Any:
        model = self._model(request.model_spec)
        outputs = await self._infer(model, example_inputs(model.spec, request.input))
        values = _scores(model, outputs, "Regress").reshape(-1)
        response = pb.RegressionResponse()
        self._answer_spec(model, request.model_spec, response.model_spec)
        for value in values.tolist():
            response.result.regressions.add(value=value)
        return response

    async def get_model_metadata(self, request: Any) -> Any:
        model = self._model(request.model_spec)
        fields = list(request.metadata_field)
        if not fields:
            raise InvalidInput("metadata_field is empty; ask for 'signature_def'")
        unknown = [f for f in fields if f != _SIGNATURE_DEF]
        if unknown:
            raise InvalidInput(
                f"unknown metadata_field {unknown}; the one field is 'signature_def'"
            )
        spec = model.spec
        signatures = pb.SignatureDefMap()
        signature = signatures.signature_def[DEFAULT_SIGNATURE]
        signature.method_name = _PREDICT_METHOD
        for tensors, target in ((spec.inputs, signature.inputs), (spec.outputs, signature.outputs)):
            for tensor in tensors:
                _tensor_info(spec, tensor, target[tensor.name])
        response = pb.GetModelMetadataResponse()
        self._answer_spec(model, request.model_spec, response.model_spec)
        response.metadata[_SIGNATURE_DEF].Pack(signatures)
        return response

    async def get_model_status(self, request: Any) -> Any:
        spec = request.model_spec
        if not spec.name:
            raise InvalidInput("model_spec.name (the model name) is missing")
        record = self.plane.record(spec.name)
        statuses = list(record.status.values())
        if spec.WhichOneof("version_choice") == "version":
            statuses = [s for s in statuses if s.version == spec.version.value]
            if not statuses:
                raise NotFound(f"unknown version {spec.version.value} of model '{spec.name}'")
        if not statuses:
            raise Unavailable(f"model '{record.name}' is {record.state.value}: {record.reason}")
        response = pb.GetModelStatusResponse()
        for status in sorted(statuses, key=lambda s: s.version, reverse=True):
            entry = response.model_version_status.add(version=status.version)
            entry.state = _STATE.get(status.state, pb.ModelVersionStatus.UNKNOWN)
            entry.status.error_code = (
                error_codes_pb2.UNKNOWN if status.reason else error_codes_pb2.OK
            )
            entry.status.error_message = status.reason
        return response


def _tensor_info(spec: ModelSpec, tensor: TensorSpec, info: Any) -> None:
    info.name = tensor.name
    info.dtype = tf_pb.DataType.Value(tensor.datatype.tf_name)
    dims = ([-1] if spec.max_batch_size > 0 else []) + list(tensor.model_dims)
    for size in dims:
        info.tensor_shape.dim.add().size = size


def _serialize(message: Any) -> bytes:
    data: bytes = message.SerializeToString()
    return data
