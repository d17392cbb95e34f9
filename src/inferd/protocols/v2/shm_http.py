"""Triton's shared-memory routes: ``/v2/systemsharedmemory`` (register, unregister, status of
the regions inputs and outputs may name) and ``/v2/cudasharedmemory`` (no GPU: registering
answers why)."""

from __future__ import annotations

from dataclasses import asdict

from inferd.core.errors import InvalidInput, NotFound, Unimplemented
from inferd.plane.shared_memory import SystemSharedMemory
from inferd.protocols.transport.http_routes import HttpRequest, HttpResponse, Router, json_response
from inferd.protocols.v2.http import parse_json

_SYSTEM = "/v2/systemsharedmemory"
_CUDA = "/v2/cudasharedmemory"
_REGION = "/region/(?P<name>[^/]+)"
NO_GPU = "CUDA shared memory needs a GPU: this inferd server runs on CPU only"


class SharedMemoryHttp:
    def __init__(self, regions: SystemSharedMemory) -> None:
        self.regions = regions

    def register(self, router: Router) -> None:
        for root, status, register, unregister in (
            (_SYSTEM, self.status, self.register_region, self.unregister),
            (_CUDA, self.cuda_status, self.cuda_register, self.cuda_unregister),
        ):
            router.add("GET", root + "/status", status)
            router.add("GET", root + _REGION + "/status", status)
            router.add("POST", root + _REGION + "/register", register)
            router.add("POST", root + "/unregister", unregister)
            router.add("POST", root + _REGION + "/unregister", unregister)

    async def status(self, request: HttpRequest) -> HttpResponse:
        found = self.regions.status(request.params.get("name", ""))
        return json_response([asdict(region) for region in found])

    async def register_region(self, request: HttpRequest) -> HttpResponse:
        doc = parse_json(request.body) if request.body else None
        if not isinstance(doc, dict) or not isinstance(doc.get("key"), str):
            raise InvalidInput("register a region with a JSON object: key, offset, byte_size")
        name = request.params["name"]
        await self.regions.register_everywhere(
            name, doc["key"], doc.get("offset", 0), doc.get("byte_size", -1)
        )
        return json_response({})

    async def unregister(self, request: HttpRequest) -> HttpResponse:
        await self.regions.unregister_everywhere(request.params.get("name", ""))
        return json_response({})

    async def cuda_status(self, request: HttpRequest) -> HttpResponse:
        if "name" in request.params:
            raise NotFound(f"Unable to find cuda shared memory region: '{request.params['name']}'")
        return json_response([])

    async def cuda_register(self, request: HttpRequest) -> HttpResponse:
        raise Unimplemented(NO_GPU)

    async def cuda_unregister(self, request: HttpRequest) -> HttpResponse:
        return json_response({})  # nothing can have been registered
