"""Shadow copies: a request mirrored to another version of its model, off the answer's path.

The routing policy decides which requests are copied and to which version
(``inferd.plane.routing``); a copy runs in a task of its own, never delays the primary answer,
and its outcome is compared with the primary's and counted (``ModelRouting.shadowed``).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace

from inferd.core.errors import InferdError
from inferd.core.types import InferRequest, InferResponse, Tensors
from inferd.plane.model import ModelVersion
from inferd.plane.registry import Registry
from inferd.plane.routing import ModelRouting, ShadowDecision

log = logging.getLogger("inferd.dataplane")


class Shadows:
    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        self._tasks: set[asyncio.Task[None]] = set()

    def mirror(
        self,
        routing: ModelRouting,
        primary: ModelVersion,
        request: InferRequest,
        response: InferResponse,
    ) -> None:
        registry, name = self.registry, primary.name
        decision = routing.shadow(
            primary.version, lambda v: registry.ready_version(name, v) is not None
        )
        if decision is None:
            return
        target = registry.ready_version(name, decision.version)
        assert target is not None  # checked ready just now, on this thread
        copy = replace(request, model_version=str(target.version))
        task = asyncio.get_running_loop().create_task(
            self._copy(routing, decision, target, copy, response.outputs)
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _copy(
        self,
        routing: ModelRouting,
        decision: ShadowDecision,
        target: ModelVersion,
        request: InferRequest,
        expected: Tensors,
    ) -> None:
        try:
            answer = await target.infer(request)
        except InferdError as exc:
            routing.shadowed(decision, expected, exc)
        except Exception as exc:
            log.exception("shadow copy to model '%s' v%d failed", target.name, target.version)
            routing.shadowed(decision, expected, exc)
        else:
            routing.shadowed(decision, expected, answer.outputs)
