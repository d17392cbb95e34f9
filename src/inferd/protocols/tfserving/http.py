"""TensorFlow Serving REST API v1: predict (row and columnar), classify, regress, status,
metadata; and what KServe's v1 protocol adds to the same routes: ``GET /`` liveness, and
``name`` and ``ready`` beside a model's status.

Only the JSON lives here: requests are decoded against the target the core routed
(``DataPlane.tfserving``: version, label or traffic split, then the signature) and answers are
written as TF Serving writes them, ``NaN``, ``Infinity`` and ``-Infinity`` included (its REST
guide's tokens, accepted in requests too). Tensors are shaped as the model itself takes them
(TF Serving has no config ``dims``), with TF Serving's leniency for rows of scalars.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import orjson

from inferd.config.spec import ModelSpec, TensorSpec
from inferd.core.errors import InvalidInput
from inferd.core.types import InferResponse, Tensors
from inferd.plane.dataplane import DataPlane
from inferd.plane.tfexample import Features
from inferd.plane.tfserving import ModelSignatures, TensorInfo
from inferd.protocols import codecs
from inferd.protocols.transport.http_routes import HttpRequest, HttpResponse, Router
from inferd.protocols.v2.http import OFFLOAD_BYTES, check_value_count
from inferd.security.access import Access

_MODEL = r"/v1/models/(?P<model>[^/:]+)(?:/versions/(?P<version>[^/:]+)|/labels/(?P<label>[^/:]+))?"
_UNLOADED = "unloaded"  # a retired or unloaded version: TF Serving's END state
_TF_STATE = {
    "READY": "AVAILABLE",
    "LOADING": "LOADING",
    "UNLOADING": "UNLOADING",
    "UNAVAILABLE": "UNAVAILABLE",
}
_NON_FINITE = (b"NaN", b"Infinity")


LIVE = b'{"status":"alive"}'  # KServe v1's answer to GET /


def kserve_live() -> HttpResponse:
    """KServe v1's server liveness (``GET /``), varying with Accept: browsers get the page."""
    return HttpResponse(LIVE, headers=[("vary", "accept")])


class TfServingHttp:
    """Handlers for the ``/v1`` routes."""

    def __init__(self, plane: DataPlane) -> None:
        self.plane = plane
        self.tf = plane.tfserving

    def register(self, router: Router, root: bool = True) -> None:
        """``root``: also ``GET /``, KServe v1's liveness (else the dashboard answers it)."""
        router.add("POST", _MODEL + r":(?P<verb>predict|classify|regress)", self.call)
        router.add("GET", _MODEL, self.status)
        router.add("GET", _MODEL + "/metadata", self.metadata)
        if root:
            router.add("GET", "/", self.live, access=Access.HEALTH)

    async def live(self, request: HttpRequest) -> HttpResponse:
        return kserve_live()

    async def call(self, request: HttpRequest) -> HttpResponse:
        # A large body is checked first (more values than the model takes: refused unparsed),
        # then parsed and turned into tensors on a worker thread, as v2's: the loop serves on.
        p, verb = request.params, request.params["verb"]
        big = len(request.body) > OFFLOAD_BYTES
        if big and "label" not in p:
            check_value_count(self.plane, request.body, p["model"], p.get("version", ""))
        doc = await asyncio.to_thread(parse_json, request.body) if big else parse_json(request.body)
        if not isinstance(doc, dict):
            raise InvalidInput("the request body must be a JSON object")
        signature = doc.get("signature_name") or ""
        if not isinstance(signature, str):
            raise InvalidInput("'signature_name' must be a string")
        if self.plane.on_demand is not None:  # lazy serving: a model may need loading first
            await self.plane.loaded(p["model"])
        target = self.tf.target(
            p["model"], p.get("version", ""), p.get("label", ""), signature, verb
        )
        response: InferResponse
        if verb == "predict":
            if big:
                inputs, row_format = await asyncio.to_thread(_predict_inputs, target.spec, doc)
            else:
                inputs, row_format = _predict_inputs(target.spec, doc)
            response = await self.tf.predict(target, inputs)
            answer = tf_json(_predictions(response.outputs, row_format))
        else:
            examples, context = _examples(doc)
            if verb == "classify":
                classified = await self.tf.classify(target, examples, context)
                response = classified.response
                body: Any = [[[label, score] for label, score in r] for r in classified.results]
            else:
                regressed = await self.tf.regress(target, examples, context)
                response, body = regressed.response, regressed.results
            answer = tf_json({"results": body})
        answer.model, answer.version = response.model_name, response.model_version
        answer.timings = response.timings
        return answer

    async def status(self, request: HttpRequest) -> HttpResponse:
        p = request.params
        version = self.plane.version_of(p["model"], p.get("version", ""), p.get("label", ""))
        status = self.plane.model_status(p["model"], version)
        # TF Serving's status, plus KServe v1's model readiness ("name", "ready") beside it.
        ready = self.plane.model_ready(p["model"], version)
        return tf_json(
            {
                "name": p["model"],
                "ready": ready,
                "model_version_status": [
                    {
                        "version": str(s.version),
                        "state": "END" if s.reason == _UNLOADED else _TF_STATE[s.state],
                        "status": {
                            "error_code": "OK" if s.reason in ("", _UNLOADED) else "UNKNOWN",
                            "error_message": s.reason,
                        },
                    }
                    for s in status.versions
                ],
            }
        )

    async def metadata(self, request: HttpRequest) -> HttpResponse:
        p = request.params
        await self.plane.loaded(p["model"])
        meta = self.tf.metadata(p["model"], p.get("version", ""), p.get("label", ""))
        return tf_json(metadata_json(meta))


def metadata_json(meta: ModelSignatures) -> dict[str, Any]:
    signatures = {
        s.name: {
            "inputs": {t.name: _tensor_info(t) for t in s.inputs},
            "outputs": {t.name: _tensor_info(t) for t in s.outputs},
            "method_name": s.method,
        }
        for s in meta.signatures
    }
    return {
        "model_spec": {"name": meta.name, "signature_name": "", "version": str(meta.version)},
        "metadata": {"signature_def": {"signature_def": signatures}},
    }


def _tensor_info(tensor: TensorInfo) -> dict[str, Any]:
    return {
        "dtype": tensor.datatype.tf_name,
        "tensor_shape": {
            "dim": [{"size": str(d), "name": ""} for d in tensor.dims],
            "unknown_rank": False,
        },
        "name": tensor.name,
    }


# --------------------------------------------------------------------------- JSON


def parse_json(body: bytes | memoryview) -> Any:
    """A request document; TF Serving's ``NaN``, ``Infinity`` and ``-Infinity`` tokens are
    numbers here (the standard library reads them when orjson, which refuses them, cannot)."""
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        data = bytes(body)
        if any(token in data for token in _NON_FINITE):
            try:
                return json.loads(data)
            except (ValueError, UnicodeDecodeError):
                pass
        raise InvalidInput(f"malformed JSON in request body: {exc}") from None


def tf_json(doc: Any, status: int = 200) -> HttpResponse:
    """An answer as TF Serving writes it: non-finite floats as NaN, Infinity, -Infinity."""
    if _finite(doc):
        return HttpResponse(orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY), status)
    text = json.dumps(_plain(doc), allow_nan=True, separators=(",", ":"))
    return HttpResponse(text.encode("utf-8"), status)


def _all_finite(array: np.ndarray) -> bool:
    """Whether a float array holds only finite values: a handful checked as Python floats,
    more by the ufunc's reduce (``ndarray.all`` is a Python wrapper in numpy: 3 % of a
    request)."""
    if array.size <= codecs.FEW_VALUES:
        return all(map(math.isfinite, array.ravel().tolist()))
    return bool(_ALL(np.isfinite(array), axis=None))


def _finite(value: Any) -> bool:
    if isinstance(value, np.ndarray):
        return value.dtype.kind != "f" or _all_finite(value)
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        value = value.values()
    elif not isinstance(value, list | tuple):
        return True
    return all(map(_finite, value))


_ALL = np.logical_and.reduce


def _plain(value: Any) -> Any:
    """Numpy arrays as lists for the standard library's encoder (only for answers holding a
    non-finite float); float32 values keep their shortest float32 spelling."""
    if isinstance(value, np.ndarray):
        if value.dtype.kind == "f" and value.dtype.itemsize < 8:
            shape = value.shape
            flat = [float(str(v)) for v in value.astype(np.float32).ravel()]
            return np.array(flat, dtype=object).reshape(shape).tolist() if shape else flat[0]
        return value.tolist()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


# --------------------------------------------------------------------------- requests


def _array(tensor: TensorSpec, value: Any) -> np.ndarray:
    if tensor.datatype.is_bytes:
        decoded = _decode_bytes(value)
        array = np.empty(_nested_shape(decoded), dtype=object)
        try:
            array[...] = decoded
        except ValueError:
            raise InvalidInput(
                f"input '{tensor.name}': the lists of strings are not all of one length"
            ) from None
        return array
    try:
        array = np.asarray(value, dtype=tensor.datatype.numpy)
    except (ValueError, TypeError, OverflowError):
        raise InvalidInput(
            f"input '{tensor.name}': values are not a (nested) list of {tensor.datatype.tf_name}"
        ) from None
    if array.dtype.kind == "f" and array.size and not _all_finite(array):
        _check_non_finite(tensor, value, array)
    return array


def _check_non_finite(tensor: TensorSpec, value: Any, array: np.ndarray) -> None:
    """TF Serving's ``NaN`` and ``Infinity`` tokens are numbers; a ``null``, or a number
    beyond the datatype's range, is refused rather than read as NaN or infinity."""
    if (np.asarray(value, dtype=object) == None).any():  # noqa: E711 (elementwise)
        raise InvalidInput(f"input '{tensor.name}': data holds null")
    wide = np.asarray(value, dtype=np.float64)
    if (np.isfinite(wide) & ~np.isfinite(array)).any():
        raise InvalidInput(
            f"input '{tensor.name}': data holds a value outside the range of "
            f"{tensor.datatype.tf_name}"
        )


def _nested_shape(value: Any) -> tuple[int, ...]:
    shape: list[int] = []
    while isinstance(value, list):
        shape.append(len(value))
        if not value:
            break
        value = value[0]
    return tuple(shape)


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
    named = (
        isinstance(instances[0], dict)  # rows of values (the usual): no look at the others
        and all(isinstance(i, dict) for i in instances)
        and not (len(spec.inputs) == 1 and _is_b64(instances[0]))
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


def _examples(doc: dict[str, Any]) -> tuple[list[Features], Features]:
    examples = doc.get("examples")
    if not isinstance(examples, list) or not examples:
        raise InvalidInput("'examples' must be a non-empty list of feature objects")
    context = doc.get("context") or {}
    if not isinstance(context, dict) or not all(isinstance(e, dict) for e in examples):
        raise InvalidInput("'examples' and 'context' must be feature objects")
    return [_features(e, f"examples[{i}]") for i, e in enumerate(examples)], _features(
        context, "context"
    )


def _features(obj: dict[str, Any], where: str) -> Features:
    """A JSON example: each feature a value or a list of numbers (int64 when every one is
    whole, else float) or of strings / {"b64": ...} (bytes), as TF Serving reads them."""
    found: dict[str, np.ndarray] = {}
    for key, value in obj.items():
        values: list[Any] = value if isinstance(value, list) else [value]
        if all(isinstance(v, int) and not isinstance(v, bool) for v in values) and values:
            found[key] = np.asarray(values, dtype=np.int64)
        elif all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
            found[key] = np.asarray(values, dtype=np.float32)
        elif all(isinstance(v, str) or _is_b64(v) for v in values):
            array = np.empty(len(values), dtype=object)
            array[:] = _decode_bytes(values)
            found[key] = array
        else:
            raise InvalidInput(
                f"{where}: feature '{key}' must be numbers, or strings and b64 objects"
            )
    return found


# --------------------------------------------------------------------------- answers


def _json_value(name: str, value: Any) -> Any:
    """An output (or one row of it) as TF Serving writes it in JSON: bytes as text, or as
    {"b64": ...} objects when the output's name ends in ``_bytes`` (TF Serving's rule) or
    when it holds bytes that are not UTF-8 (which JSON text cannot carry)."""
    if isinstance(value, bytes):  # one row of a 1-D BYTES output
        value = np.array(value, dtype=object)
    array = np.asarray(value)
    dtype = array.dtype
    if array.ndim and (dtype.kind in "biu" or (dtype.kind == "f" and dtype.itemsize >= 4)):
        return array  # the usual numbers, written by orjson as they are (dtype.name is slow)
    if dtype.kind == "O":
        items = array.tolist()
        if not name.endswith("_bytes"):
            try:
                return _map_bytes(items, lambda b: b.decode("utf-8"))
            except UnicodeDecodeError:
                pass
        return _map_bytes(items, lambda b: {"b64": base64.b64encode(b).decode()})
    if array.ndim == 0:
        return array.astype(np.float64).item() if array.dtype.kind == "f" else array.item()
    if (array.dtype.kind == "f" and array.dtype.itemsize < 4) or array.dtype.name == "bfloat16":
        return array.astype(np.float32)
    return array


def _map_bytes(value: Any, convert: Any) -> Any:
    if isinstance(value, list):
        return [_map_bytes(v, convert) for v in value]
    return convert(value)


def _predictions(outputs: Tensors, row_format: bool) -> dict[str, Any]:
    if not row_format:
        if len(outputs) == 1:
            ((name, array),) = outputs.items()
            return {"outputs": _json_value(name, array)}
        return {"outputs": {n: _json_value(n, a) for n, a in outputs.items()}}
    if len(outputs) == 1:
        ((name, array),) = outputs.items()
        return {"predictions": _json_value(name, array)}
    rows = _rows_of(outputs.values())
    return {
        "predictions": [{n: _json_value(n, a[i]) for n, a in outputs.items()} for i in range(rows)]
    }


def _rows_of(arrays: Sequence[np.ndarray] | Any) -> int:
    sizes = {len(a) if np.ndim(a) else 1 for a in arrays}
    if len(sizes) != 1:
        raise InvalidInput(
            "the outputs have different batch sizes; ask for the columnar format ('inputs')"
        )
    return sizes.pop()
