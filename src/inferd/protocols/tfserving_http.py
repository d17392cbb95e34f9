"""TensorFlow Serving REST API v1: predict (row and columnar), classify, regress, status, metadata.

Tensors are shaped as the model itself takes them (TF Serving has no config ``dims``), so a
TF Serving client's ``{"instances": [1.0, 2.0, 5.0]}`` reaches ``half_plus_two`` as is.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
from typing import Any

import numpy as np

from inferd import validate
from inferd.config.spec import ModelSpec, TensorSpec
from inferd.dataplane import DataPlane
from inferd.errors import InvalidInput, NotFound, Unavailable
from inferd.model import ModelState, ModelVersion
from inferd.protocols import codecs
from inferd.protocols.http import HttpRequest, HttpResponse, Router, json_response
from inferd.protocols.v2_http import OFFLOAD_BYTES, parse_json
from inferd.types import InferRequest, Tensors

_MODEL = r"/v1/models/(?P<model>[^/:]+)(?:/versions/(?P<version>[^/:]+)|/labels/(?P<label>[^/:]+))?"
_DEFAULT_SIGNATURE = "serving_default"
_UNLOADED = "unloaded"  # a retired or unloaded version: TF Serving's END state
_TF_STATE = {
    ModelState.READY: "AVAILABLE",
    ModelState.LOADING: "LOADING",
    ModelState.UNLOADING: "UNLOADING",
    ModelState.UNAVAILABLE: "UNAVAILABLE",
}


class TfServingHttp:
    """Handlers for the ``/v1`` routes."""

    def __init__(self, plane: DataPlane) -> None:
        self.plane = plane

    def register(self, router: Router) -> None:
        router.add("POST", _MODEL + r":(?P<verb>predict|classify|regress)", self.call)
        router.add("GET", _MODEL, self.status)
        router.add("GET", _MODEL + "/metadata", self.metadata)

    def _version(self, params: dict[str, str]) -> str:
        """The version a URL names, by number or by label (/labels/{l})."""
        return self.plane.version_of(
            params["model"], params.get("version", ""), params.get("label", "")
        )

    async def call(self, request: HttpRequest) -> HttpResponse:
        # A large body is parsed on a worker thread: the event loop keeps serving.
        big = len(request.body) > OFFLOAD_BYTES
        doc = await asyncio.to_thread(parse_json, request.body) if big else parse_json(request.body)
        if not isinstance(doc, dict):
            raise InvalidInput("the request body must be a JSON object")
        signature = doc.get("signature_name", _DEFAULT_SIGNATURE) or _DEFAULT_SIGNATURE
        if signature != _DEFAULT_SIGNATURE:
            raise InvalidInput(
                f"unknown signature_name '{signature}'; the model serves '{_DEFAULT_SIGNATURE}'"
            )
        p = request.params
        model = self.plane.route(p["model"], self._version(p))  # the traffic split applies
        verb = p["verb"]
        if verb == "predict":
            inputs, row_format = _predict_inputs(model.spec, doc)
        else:
            inputs, row_format = _example_inputs(model.spec, doc), True
        infer = InferRequest(model.name, inputs, model_version=str(model.version))
        response = await self.plane.infer(infer)
        outputs = validate.native_outputs(model.spec, response.outputs)
        if verb == "predict":
            answer = json_response(_predictions(model.spec, outputs, row_format))
        elif verb == "classify":
            answer = json_response({"results": _classify_results(model, outputs)})
        else:
            answer = json_response({"results": _regress_results(model, outputs)})
        answer.model, answer.version = response.model_name, response.model_version
        answer.timings = response.timings
        return answer

    async def status(self, request: HttpRequest) -> HttpResponse:
        p = request.params
        record = self.plane.record(p["model"])
        version = self._version(p)
        statuses = list(record.status.values())
        if version:
            statuses = [s for s in statuses if str(s.version) == version]
            if not statuses:
                raise NotFound(f"unknown version '{version}' of model '{p['model']}'")
        if not statuses:
            raise Unavailable(f"model '{record.name}' is {record.state.value}: {record.reason}")
        return json_response(
            {
                "model_version_status": [
                    {
                        "version": str(s.version),
                        "state": "END" if s.reason == _UNLOADED else _TF_STATE[s.state],
                        "status": {
                            "error_code": "OK" if s.reason in ("", _UNLOADED) else "UNKNOWN",
                            "error_message": s.reason,
                        },
                    }
                    for s in sorted(statuses, key=lambda s: s.version, reverse=True)
                ]
            }
        )

    async def metadata(self, request: HttpRequest) -> HttpResponse:
        p = request.params
        model = self.plane.model(p["model"], self._version(p))
        spec = model.spec
        signature = {
            "inputs": {t.name: _tensor_info(spec, t) for t in spec.inputs},
            "outputs": {t.name: _tensor_info(spec, t) for t in spec.outputs},
            "method_name": "tensorflow/serving/predict",
        }
        return json_response(
            {
                "model_spec": {
                    "name": model.name,
                    "signature_name": "",
                    "version": str(model.version),
                },
                "metadata": {"signature_def": {"signature_def": {_DEFAULT_SIGNATURE: signature}}},
            }
        )


def _native_dims(spec: ModelSpec, tensor: TensorSpec) -> list[int]:
    return ([-1] if spec.max_batch_size > 0 else []) + list(tensor.model_dims)


def _tensor_info(spec: ModelSpec, tensor: TensorSpec) -> dict[str, Any]:
    return {
        "dtype": tensor.datatype.tf_name,
        "tensor_shape": {
            "dim": [{"size": str(d), "name": ""} for d in _native_dims(spec, tensor)],
            "unknown_rank": False,
        },
        "name": tensor.name,
    }


def _array(tensor: TensorSpec, value: Any) -> np.ndarray:
    if tensor.datatype.is_bytes:
        array = np.asarray(_decode_bytes(value), dtype=object)
        return array
    try:
        array = np.asarray(value, dtype=tensor.datatype.numpy)
    except (ValueError, TypeError, OverflowError):
        raise InvalidInput(
            f"input '{tensor.name}': values are not a (nested) list of {tensor.datatype.tf_name}"
        ) from None
    codecs.check_finite(tensor.name, tensor.datatype, array)
    return array


def _decode_bytes(value: Any, depth: int = 0) -> Any:
    """Strings and {"b64": ...} objects into bytes, keeping the nesting."""
    if isinstance(value, list):
        if depth >= codecs.MAX_DIMS:
            raise InvalidInput(f"bytes values are nested more than {codecs.MAX_DIMS} deep")
        return [_decode_bytes(v, depth + 1) for v in value]
    if isinstance(value, dict):
        if set(value) != {"b64"} or not isinstance(value["b64"], str):
            raise InvalidInput('a bytes value object must be {"b64": "<base64 string>"}')
        try:
            return base64.b64decode(value["b64"], validate=True)
        except binascii.Error:
            raise InvalidInput("a b64 value is not valid base64") from None
    if isinstance(value, str):
        return value.encode("utf-8")
    raise InvalidInput(f"expected a string or {{'b64': ...}} for a bytes input, got {value!r}")


def _predict_inputs(spec: ModelSpec, doc: dict[str, Any]) -> tuple[Tensors, bool]:
    has_instances, has_inputs = "instances" in doc, "inputs" in doc
    if has_instances == has_inputs:
        raise InvalidInput("the request must have exactly one of 'instances' or 'inputs'")
    if has_instances:
        return _rows(spec, doc["instances"]), True
    return _columns(spec, doc["inputs"]), False


def _single_input(spec: ModelSpec) -> TensorSpec:
    if len(spec.inputs) != 1:
        raise InvalidInput(
            f"model '{spec.name}' has {len(spec.inputs)} inputs "
            f"({', '.join(t.name for t in spec.inputs)}): name each one"
        )
    return spec.inputs[0]


def _rows(spec: ModelSpec, instances: Any) -> Tensors:
    if not isinstance(instances, list) or not instances:
        raise InvalidInput("'instances' must be a non-empty list")
    named = all(isinstance(i, dict) for i in instances) and not (
        len(spec.inputs) == 1 and _is_b64(instances[0])
    )
    if not named:
        tensor = _single_input(spec)
        return {tensor.name: _array(tensor, instances)}
    columns: dict[str, list[Any]] = {}
    for index, instance in enumerate(instances):
        for key in instance:
            if key not in spec.input_by_name:
                raise InvalidInput(f"instances[{index}] has unknown input '{key}'")
        for tensor in spec.inputs:
            if tensor.name not in instance:
                if tensor.optional:
                    continue
                raise InvalidInput(f"instances[{index}] lacks input '{tensor.name}'")
            columns.setdefault(tensor.name, []).append(instance[tensor.name])
    return {name: _array(spec.input_by_name[name], values) for name, values in columns.items()}


def _is_b64(value: Any) -> bool:
    return isinstance(value, dict) and set(value) == {"b64"}


def _columns(spec: ModelSpec, inputs: Any) -> Tensors:
    if isinstance(inputs, dict) and not _is_b64(inputs):
        found: Tensors = {}
        for key, value in inputs.items():
            tensor = spec.input_by_name.get(key)
            if tensor is None:
                raise InvalidInput(f"'inputs' has unknown input '{key}'")
            found[key] = _array(tensor, value)
        return found
    tensor = _single_input(spec)
    return {tensor.name: _array(tensor, inputs)}


def _example_inputs(spec: ModelSpec, doc: dict[str, Any]) -> Tensors:
    examples = doc.get("examples")
    if not isinstance(examples, list) or not examples:
        raise InvalidInput("'examples' must be a non-empty list of feature objects")
    context = doc.get("context") or {}
    if not isinstance(context, dict) or not all(isinstance(e, dict) for e in examples):
        raise InvalidInput("'examples' and 'context' must be feature objects")
    return _rows(spec, [{**context, **example} for example in examples])


def _json_value(name: str, value: Any) -> Any:
    """An output (or one row of it) as TF Serving writes it in JSON."""
    if isinstance(value, bytes):  # one row of a 1-D BYTES output
        value = np.array(value, dtype=object)
    array = np.asarray(value)
    if array.dtype == object:
        if name.endswith("_bytes"):
            return _map_bytes(array.tolist(), lambda b: {"b64": base64.b64encode(b).decode()})
        return _map_bytes(array.tolist(), lambda b: b.decode("utf-8", errors="replace"))
    if array.ndim == 0:
        return array.astype(np.float64).item() if array.dtype.kind == "f" else array.item()
    if (array.dtype.kind == "f" and array.dtype.itemsize < 4) or array.dtype.name == "bfloat16":
        return array.astype(np.float32)
    return array


def _map_bytes(value: Any, convert: Any) -> Any:
    if isinstance(value, list):
        return [_map_bytes(v, convert) for v in value]
    return convert(value)


def _predictions(spec: ModelSpec, outputs: Tensors, row_format: bool) -> dict[str, Any]:
    if not row_format:
        if len(outputs) == 1:
            ((name, array),) = outputs.items()
            return {"outputs": _json_value(name, array)}
        return {"outputs": {n: _json_value(n, a) for n, a in outputs.items()}}
    if len(outputs) == 1:
        ((name, array),) = outputs.items()
        return {"predictions": _json_value(name, array)}
    rows = len(next(iter(outputs.values())))
    return {
        "predictions": [{n: _json_value(n, a[i]) for n, a in outputs.items()} for i in range(rows)]
    }


def _score_output(model: ModelVersion, outputs: Tensors, verb: str) -> np.ndarray:
    for tensor in model.spec.outputs:
        array = outputs[tensor.name]
        if tensor.datatype.name in ("FP32", "FP64", "FP16") and (
            (verb == "classify" and array.ndim == 2 and array.shape[1] > 1)
            or (verb == "regress" and array.ndim <= 2 and array[0].size == 1)
        ):
            return array
    wanted = "[batch, classes] scores" if verb == "classify" else "one float per example"
    raise InvalidInput(f"model '{model.name}' has no output of {wanted}; :{verb} does not fit it")


def _classify_results(model: ModelVersion, outputs: Tensors) -> list[list[list[Any]]]:
    scores = _score_output(model, outputs, "classify").astype(np.float64)
    labels = [str(i) for i in range(scores.shape[1])]
    return [
        [[label, score] for label, score in zip(labels, row, strict=True)]
        for row in scores.tolist()
    ]


def _regress_results(model: ModelVersion, outputs: Tensors) -> list[float]:
    values: list[float] = (
        _score_output(model, outputs, "regress").astype(np.float64).ravel().tolist()
    )
    return values
