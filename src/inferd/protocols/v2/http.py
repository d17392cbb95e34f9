"""KServe v2 / Triton HTTP: JSON and the binary tensor data extension, both directions.

Routes under ``/v2``; the request document is decoded into an InferRequest, and the
response is encoded as JSON, or as a JSON header followed by raw tensors when asked. The
data plane's views are dataclasses whose fields are Triton's JSON keys (orjson writes them).
Inference responses, and only they, are compressed as the client's Accept-Encoding asks,
with Triton's choice among gzip, deflate and identity.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Mapping
from typing import Any

import orjson

from inferd.config.text import config_to_dict
from inferd.core import datatypes
from inferd.core.errors import InvalidInput
from inferd.core.types import LABEL_PARAMETER, InferRequest, InferResponse, RequestedOutput, Tensors
from inferd.plane.dataplane import DataPlane
from inferd.plane.shared_memory import SystemSharedMemory
from inferd.protocols import codecs
from inferd.protocols.transport.http_routes import (
    JSON_TYPE,
    HttpRequest,
    HttpResponse,
    Router,
    json_response,
)
from inferd.protocols.v2 import shm_tensors
from inferd.protocols.v2.headers import HeaderPlans
from inferd.security.access import Access

HEADER_LENGTH = "inference-header-content-length"
OFFLOAD_BYTES = 1 << 20  # bodies larger than this are decoded on a worker thread
_NO_PARAMETERS: dict[str, Any] = {}  # read only
COMMA_SLACK = 4096  # commas allowed beyond the values (ids, parameters, names)
_MODEL = r"/v2/models/(?P<model>[^/]+)(?:/versions/(?P<version>[^/]+)|/labels/(?P<label>[^/]+))?"


def parse_json(body: bytes | memoryview, what: str = "request body") -> Any:
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise InvalidInput(f"malformed JSON in {what}: {exc}") from None


def response_encoding(accept_encoding: str) -> str:
    """Triton's choice of a response encoding: the highest ``q`` among identity, deflate and
    gzip (the first listed on a tie), identity ("") when none is offered."""
    chosen, weight = "", 0.0
    for item in accept_encoding.split(","):
        name, _, q = item.strip().partition(";q=")
        try:
            value = float(q) if q else 1.0
        except ValueError:
            continue
        if name in ("identity", "deflate", "gzip") and value > weight:
            chosen, weight = ("" if name == "identity" else name), value
    return chosen


def _split_body(request: HttpRequest) -> tuple[Any, memoryview | None]:
    header_length = request.headers.get(HEADER_LENGTH)
    if header_length is None:
        return parse_json(request.body), None
    try:
        json_length = int(header_length)
    except ValueError:
        raise InvalidInput("Inference-Header-Content-Length is not an integer") from None
    if json_length < 0 or json_length > len(request.body):
        raise InvalidInput(
            f"Inference-Header-Content-Length {json_length} is outside the body of "
            f"{len(request.body)} bytes"
        )
    view = memoryview(request.body)
    return parse_json(view[:json_length], "the JSON header"), view[json_length:]


def _decode(
    request: HttpRequest, model: str, version: str, regions: SystemSharedMemory | None = None
) -> InferRequest:
    doc, binary = _split_body(request)
    return decode_request(doc, binary, model, version, regions)


def decode_request(
    doc: Any,
    binary: memoryview | None,
    model: str,
    version: str,
    regions: SystemSharedMemory | None = None,
) -> InferRequest:
    """The request; inputs that name a shared memory region are views over ``regions``."""
    if not isinstance(doc, dict):
        raise InvalidInput("the request body must be a JSON object")
    items = doc.get("inputs")
    if not isinstance(items, list) or not items:
        raise InvalidInput("'inputs' must be a non-empty list")
    inputs: Tensors = {}
    input_parameters: dict[str, dict[str, Any]] = {}
    offset = 0
    for item in items:
        name = item.get("name") if isinstance(item, dict) else None
        if not isinstance(name, str):
            raise InvalidInput("each input must be an object with a string 'name'")
        if name in inputs:
            raise InvalidInput(f"input '{name}' is given twice")
        named = item.get("datatype")
        datatype = datatypes.BY_NAME.get(named) if named.__class__ is str else None
        if datatype is None:
            if "datatype" not in item:
                raise InvalidInput(f"input '{name}': 'datatype' is missing")
            datatype = datatypes.from_name(named)  # raises, naming the problem
        shape = codecs.check_shape(name, item.get("shape"))
        params = item.get("parameters")
        if not params:  # the usual input: its values in 'data'
            if "data" not in item:
                raise InvalidInput(f"input '{name}' has no 'data'")
            inputs[name] = codecs.from_json_data(name, datatype, shape, item["data"])
            continue
        if params.__class__ is not dict:
            raise InvalidInput(f"input '{name}': 'parameters' must be an object")
        size = params.get("binary_data_size")
        if shm_tensors.REGION in params:
            if regions is None or "data" in item or size is not None:
                raise InvalidInput(
                    f"input '{name}' names a shared memory region: it takes no 'data' nor "
                    "binary data"
                )
            inputs[name] = shm_tensors.read_input(regions, name, datatype, shape, params)
        elif size is not None:
            if "data" in item:
                raise InvalidInput(f"input '{name}' has both 'data' and binary_data_size")
            if binary is None:
                raise InvalidInput(
                    f"input '{name}' has binary_data_size but the request carries no binary "
                    "data (Inference-Header-Content-Length header missing)"
                )
            if not isinstance(size, int) or size < 0 or offset + size > len(binary):
                raise InvalidInput(
                    f"input '{name}': binary_data_size {size} overruns the binary data "
                    f"({len(binary) - offset} bytes left)"
                )
            inputs[name] = codecs.from_raw(name, datatype, shape, binary[offset : offset + size])
            offset += size
        else:
            if "data" not in item:
                raise InvalidInput(f"input '{name}' has no 'data'")
            inputs[name] = codecs.from_json_data(name, datatype, shape, item["data"])
        if params:
            input_parameters[name] = params
    if binary is not None and offset != len(binary):
        raise InvalidInput(
            f"the request carries {len(binary)} bytes of binary data but its inputs "
            f"declare {offset}"
        )
    request_id = doc.get("id", "")
    if request_id.__class__ is not str:
        raise InvalidInput("'id' must be a string")
    outputs = doc.get("outputs")
    parameters = doc.get("parameters")
    return InferRequest(
        model,
        inputs,
        version,
        request_id,
        None if outputs is None else _requested_outputs(outputs),
        {} if parameters is None else json_object(parameters, "parameters"),
        input_parameters,
    )


def check_value_count(plane: DataPlane, body: bytes, name: str, version: str) -> None:
    """Refuse a large JSON body that holds more values than the model can take, before
    parsing it: values are at most twice its commas (a comma count is a memchr)."""
    most = plane.max_values(name, version)
    if most is None:
        return  # strings may hold commas; variable dims have no bound; or no such model
    commas = body.count(b",")
    if commas > 2 * most + COMMA_SLACK:
        raise InvalidInput(
            f"the JSON body holds about {commas} values, more than model '{name}' takes "
            "in one request at its max_batch_size"
        )


def json_object(value: Any, what: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidInput(f"'{what}' must be an object")
    return value


def _requested_outputs(value: Any) -> list[RequestedOutput] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise InvalidInput("'outputs' must be a list")
    found = []
    for item in value:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise InvalidInput("each requested output must be an object with a string 'name'")
        params = json_object(item.get("parameters"), f"outputs[{item['name']}].parameters")
        found.append(RequestedOutput(item["name"], params))
    return found or None


def encode_response(
    response: InferResponse,
    request: InferRequest,
    in_shared_memory: Collection[str] = (),
) -> HttpResponse:
    """``in_shared_memory``: the outputs already written to shared memory. Like Triton's, their
    entries hold name, datatype and shape only: no data and no ``parameters`` (the C++ client
    reads a ``parameters`` object as binary data and wants ``binary_data_size`` in it)."""
    parameters = request.parameters
    binary_default = bool(parameters.get("binary_data_output")) if parameters else False
    requested = request.outputs
    entries = []
    chunks: list[bytes | memoryview] = []
    if binary_default and not requested and not in_shared_memory:  # every output binary
        for name, array in response.outputs.items():
            raw = codecs.to_raw(array)
            entries.append(
                {
                    "name": name,
                    "datatype": datatypes.from_numpy(array.dtype).name,
                    "shape": array.shape,
                    "parameters": {"binary_data_size": len(raw)},
                }
            )
            chunks.append(raw)
    else:
        per_output = {o.name: o.parameters for o in requested} if requested else _NO_PARAMETERS
        plain = not binary_default and not requested and not in_shared_memory  # the usual answer
        for name, array in response.outputs.items():
            datatype = datatypes.from_numpy(array.dtype)
            if plain:
                entries.append(
                    {
                        "name": name,
                        "datatype": datatype.name,
                        "shape": array.shape,
                        "data": codecs.to_json_data(name, array, datatype),
                    }
                )
                continue
            entry: dict[str, Any] = {"name": name, "datatype": datatype.name, "shape": array.shape}
            if name in in_shared_memory:
                entries.append(entry)
                continue
            asked = per_output.get(name)
            binary = bool(asked.get("binary_data", binary_default) if asked else binary_default)
            if binary:
                raw = codecs.to_raw(array)
                entry["parameters"] = {"binary_data_size": len(raw)}
                chunks.append(raw)
            else:
                entry["data"] = codecs.to_json_data(name, array, datatype)
            entries.append(entry)
    doc: dict[str, Any] = {
        "model_name": response.model_name,
        "model_version": response.model_version,
        "outputs": entries,
    }
    if response.id:
        doc["id"] = response.id
    if response.parameters:
        doc["parameters"] = response.parameters
    header = orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)
    # The model, version, request id and timings for the access log and traces.
    if not chunks:
        return HttpResponse(
            header, 200, JSON_TYPE, [], response.model_name, response.model_version, request.id,
            response.timings,
        )  # fmt: skip
    return HttpResponse(
        b"".join([header, *chunks]), 200, "application/octet-stream",
        [(HEADER_LENGTH, str(len(header)))], response.model_name, response.model_version,
        request.id, response.timings,
    )  # fmt: skip


class V2Http:
    """Handlers for the ``/v2`` routes."""

    def __init__(self, plane: DataPlane) -> None:
        self.plane = plane
        self._queue_limited = plane.queue_limited
        self._plans = HeaderPlans()

    def register(self, router: Router) -> None:
        router.add("POST", _MODEL + "/infer", self.infer, admit=self.admit)
        router.add("GET", "/v2", self.server_metadata)
        router.add("GET", "/v2/models/stats", self.statistics)
        router.add("GET", _MODEL + "/stats", self.statistics)
        router.add("GET", "/v2/health/live", self.live, access=Access.HEALTH)
        router.add("GET", "/v2/health/ready", self.ready, access=Access.HEALTH)
        router.add("GET", _MODEL, self.model_metadata)
        router.add("GET", _MODEL + "/ready", self.model_ready)
        router.add("GET", _MODEL + "/config", self.model_config)
        # /v2/repository/* lives in repository_http.py.

    def _version(self, params: Mapping[str, str]) -> str:
        """The version a route names, by number or by label (/labels/{l})."""
        version = params.get("version", "")
        if "label" in params:
            return self.plane.version_of(params["model"], version, params["label"])
        return version

    def admit(self, params: Mapping[str, str]) -> None:
        """Before the body is read: 503 at once when the model's queue is full."""
        if self._queue_limited and "label" not in params and params["model"] in self._queue_limited:
            self.plane.admit(params["model"], params.get("version", ""))

    async def infer(self, request: HttpRequest) -> HttpResponse:
        params = request.params
        model, version = params["model"], params.get("version", "")
        regions = self.plane.shared_memory
        if HEADER_LENGTH not in request.headers and len(request.body) <= OFFLOAD_BYTES:
            # a JSON request: the usual one
            infer_request = decode_request(parse_json(request.body), None, model, version, regions)
        elif len(request.body) <= OFFLOAD_BYTES:
            infer_request = self._decode_inline(request, model, version, regions)
        else:  # a large body: cheap checks first, then decoded off the event loop
            if HEADER_LENGTH not in request.headers and "label" not in request.params:
                check_value_count(self.plane, request.body, model, version)
            infer_request = await asyncio.to_thread(_decode, request, model, version, regions)
        if "label" in params:
            infer_request.parameters[LABEL_PARAMETER] = params["label"]
        # Every model may queue (behind busy instances, or in its batcher): a client that
        # hangs up before its turn is dropped, not executed.
        answered = self.plane.answer(infer_request)
        if isinstance(answered, InferResponse):  # it ran on the loop: nothing waited
            response = answered
        else:
            watch = request.watch  # as cancel_on_disconnect, one call less
            response = await (answered if watch is None else watch.guard(request, answered))
        written: Collection[str] = ()
        if infer_request.outputs is not None:
            written = shm_tensors.write_outputs(regions, response, infer_request.outputs)
        answer = encode_response(response, infer_request, written)
        accept = request.headers.get("accept-encoding")
        if accept:
            answer.encoding = response_encoding(accept)
        return answer

    def _decode_inline(
        self,
        request: HttpRequest,
        model: str,
        version: str,
        regions: SystemSharedMemory | None,
    ) -> InferRequest:
        """A small binary body's decode, on the event loop; a request whose JSON header was
        seen before reads only its tensors (``v2_headers``)."""
        body = request.body
        length = request.headers.get(HEADER_LENGTH, "")
        split = int(length) if length.isdigit() and length.isascii() else -1  # "" fails isdigit
        if split < 0 or split > len(body) or body.__class__ is not bytes:
            # not a binary request, or one _split_body refuses, naming the problem
            doc, binary = _split_body(request)
            return decode_request(doc, binary, model, version, regions)
        header = body[:split]
        binary = memoryview(body)[split:]
        plan = self._plans.get(header)
        if plan is not None:
            found = plan.decode(binary, model, version)
            if found is not None:
                return found
        doc = parse_json(header, "the JSON header")
        decoded = decode_request(doc, binary, model, version, regions)
        self._plans.remember(header, doc, decoded)
        return decoded

    async def statistics(self, request: HttpRequest) -> HttpResponse:
        p = request.params
        version = self._version(p) if "model" in p else ""
        stats = await self.plane.total_statistics(p.get("model", ""), version)
        return json_response({"model_stats": stats})

    async def server_metadata(self, request: HttpRequest) -> HttpResponse:
        return json_response(self.plane.server_metadata())

    async def live(self, request: HttpRequest) -> HttpResponse:
        return json_response({"live": True})

    async def ready(self, request: HttpRequest) -> HttpResponse:
        ready = self.plane.ready
        return json_response({"ready": ready}, 200 if ready else 503)

    async def model_metadata(self, request: HttpRequest) -> HttpResponse:
        p = request.params
        return json_response(await self.plane.model_metadata(p["model"], self._version(p)))

    async def model_ready(self, request: HttpRequest) -> HttpResponse:
        p = request.params
        ready = self.plane.model_ready(p["model"], self._version(p))
        body = {"name": p["model"], "ready": ready}
        return json_response(body, 200 if ready else 400)

    async def model_config(self, request: HttpRequest) -> HttpResponse:
        p = request.params
        config = await self.plane.model_config(p["model"], self._version(p))
        return json_response(config_to_dict(config))
