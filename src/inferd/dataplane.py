"""The protocol-neutral data plane: what every frontend (v2 HTTP, v2 gRPC, TF Serving) calls.

Adapters decode their wire format into an InferRequest, call here, and encode the result;
this module knows nothing of HTTP or gRPC.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from inferd import __version__
from inferd.model import ModelVersion
from inferd.registry import ModelRecord, Registry
from inferd.repository.config import config_to_dict
from inferd.types import InferRequest, InferResponse

EXTENSIONS = ["binary_tensor_data", "model_configuration", "model_repository"]


@dataclass(frozen=True, slots=True)
class IndexEntry:
    name: str
    version: str
    state: str
    reason: str


class DataPlane:
    def __init__(self, registry: Registry, server_name: str = "inferd") -> None:
        self.registry = registry
        self.server_name = server_name
        self.ready = False  # set once startup loading has settled

    def live(self) -> bool:
        return True

    def server_metadata(self) -> dict[str, Any]:
        return {"name": self.server_name, "version": __version__, "extensions": EXTENSIONS}

    def model(self, name: str, version: str = "") -> ModelVersion:
        return self.registry.get(name, version)

    def record(self, name: str) -> ModelRecord:
        return self.registry.record(name)

    def model_ready(self, name: str, version: str = "") -> bool:
        self.registry.record(name)  # unknown model -> NotFound
        return self.registry.is_ready(name, version)

    def model_metadata(self, name: str, version: str = "") -> dict[str, Any]:
        model = self.registry.get(name, version)
        record = self.registry.record(name)
        spec = model.spec
        return {
            "name": name,
            "versions": [str(v) for v in sorted(record.versions)],
            "platform": spec.platform,
            "inputs": [
                {"name": t.name, "datatype": t.datatype.name, "shape": t.shape(spec.max_batch_size)}
                for t in spec.inputs
            ],
            "outputs": [
                {"name": t.name, "datatype": t.datatype.name, "shape": t.shape(spec.max_batch_size)}
                for t in spec.outputs
            ],
        }

    def model_config(self, name: str, version: str = "") -> dict[str, Any]:
        return config_to_dict(self.registry.get(name, version).config)

    def index(self, ready_only: bool = False) -> list[IndexEntry]:
        entries: list[IndexEntry] = []
        for record in self.registry.records():
            if not record.status:
                entries.append(IndexEntry(record.name, "", record.state.value, record.reason))
            for status in record.status.values():
                entries.append(
                    IndexEntry(record.name, str(status.version), status.state.value, status.reason)
                )
        if ready_only:
            entries = [e for e in entries if e.state == "READY"]
        return entries

    def statistics(self, name: str = "", version: str = "") -> dict[str, Any]:
        """Triton's statistics extension: every ready version, or one model's, or one version."""
        if not name:
            versions = [v for r in self.registry.records() for v in r.versions.values()]
        elif version:
            versions = [self.registry.get(name, version)]
        else:
            versions = list(self.registry.record(name).versions.values())
        return {
            "model_stats": [
                v.stats.as_dict(v.name, str(v.version))
                for v in sorted(versions, key=lambda v: (v.name, v.version))
            ]
        }

    async def infer(self, request: InferRequest) -> InferResponse:
        model = self.registry.get(request.model_name, request.model_version)
        return await model.infer(request)
