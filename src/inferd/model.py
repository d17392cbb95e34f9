"""A loaded model version: its config, its spec, and the scheduler that runs its requests."""

from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass, field

from inferd import validate
from inferd.repository.config import ModelSpec
from inferd.repository.model_config_pb2 import ModelConfig
from inferd.scheduling.instances import InstancePool
from inferd.types import InferRequest, InferResponse


class ModelState(enum.Enum):
    """Triton's model states (TF Serving's names are mapped at its edge)."""

    LOADING = "LOADING"
    READY = "READY"
    UNLOADING = "UNLOADING"
    UNAVAILABLE = "UNAVAILABLE"


@dataclass(eq=False)
class ModelVersion:
    name: str
    version: int
    config: ModelConfig
    spec: ModelSpec
    pool: InstancePool
    state: ModelState = ModelState.READY
    in_flight: int = field(default=0)

    async def infer(self, request: InferRequest) -> InferResponse:
        inputs, batch = validate.check_inputs(self.spec, request.inputs)
        names = validate.check_outputs(self.spec, request.output_names())
        self.in_flight += 1
        try:
            outputs = await self.pool.execute(inputs, names)
        finally:
            self.in_flight -= 1
        outputs = validate.shape_outputs(self.spec, outputs, batch)
        return InferResponse(
            model_name=self.name,
            model_version=str(self.version),
            outputs=outputs,
            id=request.id,
        )

    async def close(self) -> None:
        """Retire this version: queued work finishes, then the instances close."""
        self.state = ModelState.UNLOADING
        await asyncio.to_thread(self.pool.close)
        self.state = ModelState.UNAVAILABLE
