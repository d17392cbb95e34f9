"""TorchServe's view of the loaded models, and its predictions, for its HTTP and gRPC APIs.

A TorchServe model is a model of the registry whose backend is ``torchserve``; its versions are
named by the archive's version string (``1.0``), which each version's completed config carries
(``torchserve_model_version``), or by inferd's version number. A request that names no version
goes where inferd's routing sends it (the traffic split that ``set-default`` writes, else the
highest ready version). A prediction is one inferd request: the TorchServe parameters' values
in the ``body`` input, their names and content types and the request's headers in its
parameters; the answer is the ``prediction`` output with what ``meta`` says of its status.
"""

from __future__ import annotations

import datetime
import json
import os
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from inferd.backends.torchserve.settings import (
    HEADERS,
    NAMES,
    PARAMETER_PREFIX,
    TYPES,
    VersionSettings,
)
from inferd.core.errors import NotFound, Unavailable
from inferd.core.types import Handover, InferRequest
from inferd.plane.model import ModelVersion
from inferd.plane.registry import ModelRecord
from inferd.torchserve.errors import model_not_found, no_worker, version_not_found

if TYPE_CHECKING:
    from inferd.plane.dataplane import DataPlane

BACKEND = "torchserve"
JOB_QUEUE_SIZE = 100  # TorchServe's job_queue_size, which describe reports capacity against
WORKER_ID_BASE = 9000  # TorchServe numbers its workers from its first backend port
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
# A random UUID's version (4) and variant (RFC 4122) bits, as uuid.uuid4 sets them.
_UUID4_KEEP = ~((0xF000 << 64) | (0xC000 << 48)) & ((1 << 128) - 1)
_UUID4_SET = (4 << 76) | (0x8000 << 48)


@dataclass(frozen=True, slots=True)
class Prediction:
    body: bytes
    status: int = 200
    phrase: str = ""
    headers: dict[str, str] = field(default_factory=dict)  # content-type among them


@dataclass(frozen=True, slots=True)
class Worker:
    id: str
    start_unix_s: float
    status: str
    memory_bytes: int
    pid: int


def new_request_id() -> str:
    """A request's id as TorchServe names requests: a random UUID's text, what
    ``str(uuid.uuid4())`` gives, for a tenth of its interpreter work."""
    value = int.from_bytes(os.urandom(16)) & _UUID4_KEEP | _UUID4_SET
    hex_ = f"{value:032x}"
    return f"{hex_[:8]}-{hex_[8:12]}-{hex_[12:16]}-{hex_[16:20]}-{hex_[20:]}"


def is_torchserve(model: ModelVersion) -> bool:
    return model.config.backend == BACKEND


def version_settings(model: ModelVersion) -> VersionSettings:
    parameters = {
        key: value.string_value
        for key, value in model.config.parameters.items()
        if key.startswith(PARAMETER_PREFIX)
    }
    return VersionSettings.from_parameters(parameters)


def _utc(unix_s: float) -> str:
    """A time as TorchServe's JSON writes it: ``2024-01-02T03:04:05.678Z``."""
    moment = datetime.datetime.fromtimestamp(unix_s, datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def _memory(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm") as statm:
            return int(statm.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return 0


class TorchServeModels:
    def __init__(self, plane: DataPlane) -> None:
        self.plane = plane
        self.registry = plane.registry

    # ------------------------------------------------------------------ lookup

    def record(self, name: str) -> ModelRecord:
        """A TorchServe model's record (ModelNotFoundException otherwise)."""
        try:
            record = self.registry.record(name)
        except NotFound:
            raise model_not_found(name) from None
        config = record.config
        backend = config.backend if config is not None else ""
        if backend != BACKEND and not any(is_torchserve(v) for v in record.versions.values()):
            raise model_not_found(name)
        return record

    def names(self) -> list[str]:
        """Every model with a loaded TorchServe version, sorted."""
        return [
            r.name
            for r in self.registry.records()
            if any(is_torchserve(v) for v in r.versions.values())
        ]

    def versions(self, name: str) -> list[ModelVersion]:
        """A model's loaded versions, in version order."""
        record = self.record(name)
        return [record.versions[n] for n in sorted(record.versions)]

    def find(self, name: str, version: str) -> ModelVersion:
        """The version named by TorchServe's version string or by inferd's number."""
        record = self.record(name)
        for model in record.versions.values():
            if model.config.parameters[f"{PARAMETER_PREFIX}model_version"].string_value == version:
                return model
        if version.isdecimal() and int(version) in record.versions:
            return record.versions[int(version)]
        raise version_not_found(name, version)

    def default(self, name: str, request_id: str = "") -> ModelVersion:
        """The version a request that names none gets (routed first: the usual request)."""
        try:
            model = self.registry.route(name, "", "", request_id)
        except NotFound:
            raise model_not_found(name) from None
        except Unavailable:
            self.record(name)  # not a TorchServe model: not found
            raise no_worker(name) from None
        if model.config.backend != BACKEND:
            raise model_not_found(name)
        return model

    def version(self, name: str, version: str = "", request_id: str = "") -> ModelVersion:
        if not version:
            return self.default(name, request_id)
        model = self.find(name, version)
        if not is_torchserve(model):
            raise model_not_found(name)
        return model

    def settings_of(self, model: ModelVersion) -> VersionSettings:
        return version_settings(model)

    def describe(self, name: str, model: ModelVersion) -> dict[str, Any]:
        """One version as TorchServe's describe answers it, its fields in its order."""
        s = version_settings(model)
        pending = model.stats.pending
        return {
            "modelName": name,
            "modelVersion": s.model_version,
            "modelUrl": s.url,
            "runtime": s.runtime,
            "minWorkers": s.min_workers,
            "maxWorkers": s.max_workers,
            "batchSize": s.batch_size,
            "maxBatchDelay": s.max_batch_delay,
            "responseTimeout": s.response_timeout,
            "startupTimeout": s.startup_timeout,
            "maxRetryTimeoutInSec": 300,
            "clientTimeoutInMills": 0,
            "parallelType": "",
            "parallelLevel": 0,
            "deviceType": s.device_type,
            "continuousBatching": False,
            "useJobTicket": False,
            "useVenv": False,
            "stateful": False,
            "sequenceMaxIdleMSec": 0,
            "sequenceTimeoutMSec": 0,
            "maxNumSequence": 0,
            "maxSequenceJobQueueSize": 0,
            "loadedAtStartup": s.loaded_at_startup,
            "workers": [
                {
                    "id": w.id,
                    "startTime": _utc(w.start_unix_s),
                    "status": w.status,
                    "memoryUsage": w.memory_bytes,
                    "pid": w.pid,
                    "gpu": False,
                    "gpuUsage": "N/A",
                }
                for w in self.workers(model)
            ],
            "jobQueueStatus": {
                "remainingCapacity": max(JOB_QUEUE_SIZE - pending, 0),
                "pendingRequests": pending,
            },
        }

    def workers(self, model: ModelVersion) -> list[Worker]:
        pool = getattr(model.scheduler, "pool", None)
        pids_of = getattr(pool, "pids", None)
        pids: list[int | None] = pids_of() if pids_of is not None else []
        return [
            Worker(
                str(WORKER_ID_BASE + index),
                model.loaded_unix_s,
                "READY" if pid is not None else "UNLOADING",
                _memory(pid) if pid is not None else 0,
                pid if pid is not None else -1,
            )
            for index, pid in enumerate(pids)
        ]

    def healthy(self) -> bool:
        """TorchServe's /ping: every TorchServe model serves its default version."""
        for record in self.registry.records():
            config = record.config
            torchserve = (config is not None and config.backend == BACKEND) or any(
                is_torchserve(v) for v in record.versions.values()
            )
            if torchserve and record.default_version() is None:
                return False
        return True

    # ------------------------------------------------------------------ predictions

    def streams(self, model: ModelVersion) -> bool:
        """Whether the version's handler sends intermediate answers."""
        parameter = model.config.parameters.get(f"{PARAMETER_PREFIX}streaming")
        return parameter is not None and parameter.string_value == "true"

    def _request(
        self,
        name: str,
        values: Sequence[bytes],
        names: list[str],
        types: list[str],
        headers: dict[str, Any],
        request_id: str,
    ) -> InferRequest:
        body = np.empty((1, len(values)), dtype=object)
        for index, value in enumerate(values):
            body[0, index] = value
        # The body is the request's alone: once the handler's worker has its copy, the server
        # lets go of its own (unless a shadow version is to get the request too).
        handover = Handover() if self.registry.shadowing(name) is None else None
        return InferRequest(
            name,
            {"body": body},
            id=request_id,
            parameters={NAMES: names, TYPES: types, HEADERS: headers},
            handover=handover,
        )

    async def answers(
        self,
        name: str,
        version: str,
        values: Sequence[bytes],
        names: list[str],
        types: list[str],
        headers: dict[str, Any],
        request_id: str,
    ) -> Prediction | AsyncIterator[Prediction]:
        """``predict``'s answer; for a streaming handler, its answers as it sends them."""
        model = self.version(name, version, request_id)
        request = self._request(name, values, names, types, headers, request_id)
        if self.streams(model):
            return self._stream(model, request, version)
        return await self._once(model, request, version)

    async def _once(self, model: ModelVersion, request: InferRequest, version: str) -> Prediction:
        try:
            response = await self.plane.run(model, request)
        except Unavailable:
            raise no_worker(model.name, version) from None
        return _prediction(response.outputs)

    async def _stream(
        self, model: ModelVersion, request: InferRequest, version: str
    ) -> AsyncIterator[Prediction]:
        try:
            async for response in model.infer_stream(request):
                yield _prediction(response.outputs)
        except Unavailable:
            raise no_worker(model.name, version) from None

    async def predict(
        self,
        name: str,
        version: str,
        values: Sequence[bytes],
        names: list[str],
        types: list[str],
        headers: dict[str, Any],
        request_id: str,
    ) -> Prediction:
        """Run one TorchServe request (its parameters' values, names, content types)."""
        model = self.version(name, version, request_id)
        request = self._request(name, values, names, types, headers, request_id)
        return await self._once(model, request, version)


def _prediction(outputs: dict[str, Any]) -> Prediction:
    prediction = outputs["prediction"].reshape(-1)[0]
    meta = outputs["meta"].reshape(-1)[0]
    if not meta:
        return Prediction(prediction)
    doc = json.loads(meta)
    status = int(doc.get("status", 200))
    return Prediction(prediction, status, doc.get("phrase") or "", doc.get("headers") or {})
