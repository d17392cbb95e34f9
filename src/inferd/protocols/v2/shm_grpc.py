"""The gRPC shared-memory RPCs of Triton's service: system regions registered, unregistered
and listed as over ``/v2/systemsharedmemory``; CUDA regions refused (no GPU)."""

from __future__ import annotations

from inferd.core.errors import NotFound, Unimplemented
from inferd.plane.shared_memory import SystemSharedMemory
from inferd.protocols import grpc_service_pb2 as pb
from inferd.protocols.v2.shm_http import NO_GPU


class SharedMemoryGrpc:
    def __init__(self, regions: SystemSharedMemory) -> None:
        self.regions = regions

    async def status(
        self, request: pb.SystemSharedMemoryStatusRequest
    ) -> pb.SystemSharedMemoryStatusResponse:
        response = pb.SystemSharedMemoryStatusResponse()
        for region in self.regions.status(request.name):
            entry = response.regions[region.name]
            entry.name, entry.key = region.name, region.key
            entry.offset, entry.byte_size = region.offset, region.byte_size
        return response

    async def register(
        self, request: pb.SystemSharedMemoryRegisterRequest
    ) -> pb.SystemSharedMemoryRegisterResponse:
        await self.regions.register_everywhere(
            request.name, request.key, request.offset, request.byte_size
        )
        return pb.SystemSharedMemoryRegisterResponse()

    async def unregister(
        self, request: pb.SystemSharedMemoryUnregisterRequest
    ) -> pb.SystemSharedMemoryUnregisterResponse:
        await self.regions.unregister_everywhere(request.name)
        return pb.SystemSharedMemoryUnregisterResponse()

    async def cuda_status(
        self, request: pb.CudaSharedMemoryStatusRequest
    ) -> pb.CudaSharedMemoryStatusResponse:
        if request.name:
            raise NotFound(f"Unable to find cuda shared memory region: '{request.name}'")
        return pb.CudaSharedMemoryStatusResponse()

    async def cuda_register(
        self, request: pb.CudaSharedMemoryRegisterRequest
    ) -> pb.CudaSharedMemoryRegisterResponse:
        raise Unimplemented(NO_GPU)

    async def cuda_unregister(
        self, request: pb.CudaSharedMemoryUnregisterRequest
    ) -> pb.CudaSharedMemoryUnregisterResponse:
        return pb.CudaSharedMemoryUnregisterResponse()
