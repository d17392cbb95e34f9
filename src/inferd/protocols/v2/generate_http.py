"""Triton's generate extension: ``POST /v2/models/{m}[/versions/{v}]/generate`` answers one
response as a flat JSON object, ``.../generate_stream`` every response of a decoupled model as
server-sent events (``data: {...}``), each sent as the model sends it.

The request is a flat JSON object: each key names an input (a scalar or a list, shaped by the
model's metadata), ``parameters`` the request parameters. An output of one element is a scalar
in the answer, longer ones a flat list; BYTES are text.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import orjson

from inferd.core import datatypes
from inferd.core.errors import InferdError, InvalidInput
from inferd.core.types import InferRequest, InferResponse, Tensors
from inferd.plane.dataplane import DataPlane
from inferd.protocols import codecs
from inferd.protocols.transport.http_routes import HttpRequest, HttpResponse, Router, json_response
from inferd.protocols.v2.http import json_object, parse_json

_MODEL = r"/v2/models/(?P<model>[^/]+)(?:/versions/(?P<version>[^/]+))?"
_RESERVED = ("parameters", "id")


class GenerateHttp:
    def __init__(self, plane: DataPlane) -> None:
        self.plane = plane

    def register(self, router: Router) -> None:
        router.add("POST", _MODEL + "/generate", self.generate)
        router.add("POST", _MODEL + "/generate_stream", self.generate_stream)

    async def _request(self, request: HttpRequest) -> InferRequest:
        doc = parse_json(request.body)
        if not isinstance(doc, dict):
            raise InvalidInput("the generate request must be a JSON object")
        model, version = request.params["model"], request.params.get("version", "")
        metadata = await self.plane.model_metadata(model, version)
        known = {t.name: t for t in metadata.inputs}
        inputs: Tensors = {}
        for name, value in doc.items():
            if name in _RESERVED:
                continue
            meta = known.get(name)
            if meta is None:
                raise InvalidInput(
                    f"'{name}' is not an input of model '{model}' (inputs: {', '.join(known)})"
                )
            flat = value if isinstance(value, list) else [value]
            shape = _shape(meta.shape, len(flat))
            inputs[name] = codecs.from_json_data(
                name, datatypes.from_name(meta.datatype), shape, flat
            )
        request_id = doc.get("id", "")
        if not isinstance(request_id, str):
            raise InvalidInput("'id' must be a string")
        return InferRequest(
            model,
            inputs,
            model_version=version,
            id=request_id,
            parameters=json_object(doc.get("parameters"), "parameters"),
        )

    async def generate(self, request: HttpRequest) -> HttpResponse:
        responses = [r async for r in self._responses(await self._request(request))]
        if len(responses) != 1:
            raise InvalidInput(
                f"model '{request.params['model']}' sent {len(responses)} responses; "
                "/generate answers exactly one, use /generate_stream for more"
            )
        return json_response(_flat(responses[0]))

    async def generate_stream(self, request: HttpRequest) -> HttpResponse:
        responses = self._responses(await self._request(request))
        try:  # bad input fails the request itself (400), not its stream
            first = await anext(responses)
        except StopAsyncIteration:
            first = None
        answer = HttpResponse(status=200, content_type="text/event-stream")
        answer.stream = _events(first, responses)
        answer.model = request.params["model"]
        return answer

    async def _responses(self, request: InferRequest) -> AsyncIterator[InferResponse]:
        async for response in self.plane.infer_stream(request):
            final = response.parameters.pop("triton_final_response", None)
            if final is not None and not response.outputs:
                continue  # a bare final flag
            yield response


async def _events(
    first: InferResponse | None, rest: AsyncIterator[InferResponse]
) -> AsyncIterator[bytes]:
    if first is None:
        return
    yield _event(_flat(first))
    try:
        async for response in rest:
            yield _event(_flat(response))
    except InferdError as exc:
        yield _event({"error": exc.message})


def _event(doc: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n\n"


def _shape(declared: tuple[int, ...], count: int) -> tuple[int, ...]:
    """The metadata shape with its variable dims filled: 1 for all but the last, which takes
    what is left of ``count`` elements."""
    shape = [d if d >= 0 else 1 for d in declared]
    variable = [i for i, d in enumerate(declared) if d < 0]
    if variable:
        known = 1
        for i, d in enumerate(shape):
            if i != variable[-1]:
                known *= d
        shape[variable[-1]] = count // known if known else 0
    return tuple(shape)


def _flat(response: InferResponse) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "model_name": response.model_name,
        "model_version": response.model_version,
    }
    if response.id:
        doc["id"] = response.id
    for name, array in response.outputs.items():
        data = codecs.to_json_data(name, array)
        values = list(data) if not hasattr(data, "tolist") else data.tolist()
        doc[name] = values[0] if len(values) == 1 else values
    return doc
