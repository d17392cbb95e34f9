"""The dashboard's models table in one document: every model and version with its state,
backend, instances, batching, routing and load time, and what the page needs of the server;
with lazy serving, each model's residency (memory, last use, evictions) and the budget's use.

It reads the registry and the repository manager's last scan (rescanned at most every
``RESCAN_S``, so a page polling every two seconds does not list an S3 bucket every time).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Any

from inferd.config.model_config_pb2 import ModelConfig, ModelInstanceGroup
from inferd.plane.demand import OnDemand
from inferd.plane.model import ModelVersion
from inferd.plane.registry import ModelRecord, Registry
from inferd.plane.routing import ShadowCounts, routing_document
from inferd.repository.manager import ModelManager
from inferd.version import __version__

RESCAN_S = 10.0
# The one flag that turns the admin API on, as the page says it where a panel needs it.
ADMIN_HINT = "start inferd with --admin-token TOKEN, then paste the token with the Token button"


@dataclass(frozen=True, slots=True)
class ServerFacts:
    """What the page shows of the server and which of its controls apply."""

    name: str
    node: str
    control_mode: str
    repositories: tuple[str, ...]
    writable: bool  # the repository takes uploads (a local folder or S3)
    access_log: bool
    tracing: bool
    trace_url: str
    envoy_admin: bool
    started_s: float
    # The admin API (logs, model files, uploads, loads, routing): "open" (no token needed),
    # "token" (an admin token needed) or "off" (refused whatever the page sends).
    admin: str = "open"


def _batching(config: ModelConfig | None) -> dict[str, Any]:
    if config is None:
        return {}
    found: dict[str, Any] = {"max_batch_size": config.max_batch_size}
    if config.HasField("dynamic_batching"):
        dynamic = config.dynamic_batching
        found["dynamic"] = {
            "preferred_batch_size": list(dynamic.preferred_batch_size),
            "max_queue_delay_us": dynamic.max_queue_delay_microseconds,
        }
    # The sequence batcher is newer than this message in some builds: ask only if it is there.
    if "sequence_batching" in config.DESCRIPTOR.fields_by_name and config.HasField(
        "sequence_batching"
    ):
        found["sequence"] = True
    return found


def _instances(config: ModelConfig | None) -> list[dict[str, Any]]:
    if config is None:
        return []
    return [
        {"count": g.count or 1, "kind": str(ModelInstanceGroup.Kind.Name(g.kind))}
        for g in config.instance_group
    ]


def _version(number: int, record: ModelRecord) -> dict[str, Any]:
    status = record.status.get(number)
    loaded: ModelVersion | None = record.versions.get(number)
    found: dict[str, Any] = {
        "version": str(number),
        "state": status.state.value if status else (loaded.state.value if loaded else ""),
        "reason": status.reason if status else "",
    }
    if loaded is not None:
        found["instances"] = loaded.instance_count
        found["load_s"] = round(loaded.load_seconds, 4)
        found["pending"] = loaded.stats.pending
    return found


def _model(record: ModelRecord, registry: Registry) -> dict[str, Any]:
    config = record.config
    numbers = sorted(set(record.status) | set(record.versions))
    return {
        "name": record.name,
        "state": record.state.value,
        "reason": record.reason,
        "backend": (config.backend or config.platform) if config is not None else "",
        "platform": config.platform if config is not None else "",
        "versions": [_version(n, record) for n in numbers],
        "instance_group": _instances(config),
        "batching": _batching(config),
        "cache": bool(config is not None and config.response_cache.enable),
        "routing": routing_document(registry.routing(record.name).view()),
    }


class Overview:
    def __init__(
        self,
        registry: Registry,
        manager: ModelManager,
        facts: ServerFacts,
        on_demand: OnDemand | None = None,
    ) -> None:
        self.registry = registry
        self.manager = manager
        self.facts = facts
        self.on_demand = on_demand  # lazy serving
        # Several workers: each model's shadow counts added up over them (inferd.workers).
        self.shadow_totals: Callable[[list[str]], Awaitable[dict[str, ShadowCounts]]] | None = None
        self._scanned_mono = -RESCAN_S

    async def _repository_names(self) -> set[str]:
        now = time.monotonic()
        if now - self._scanned_mono >= RESCAN_S:
            self._scanned_mono = now
            await self.manager.scan()
        return set(self.manager.known)

    async def as_json(self, ready: bool) -> dict[str, Any]:
        facts = self.facts
        in_repository = await self._repository_names()
        records = {r.name: r for r in self.registry.records()}
        models = [_model(records[name], self.registry) for name in sorted(records)]
        for name in sorted(in_repository - set(records)):
            models.append(
                {
                    "name": name,
                    "state": "UNAVAILABLE",
                    "reason": "unloaded",
                    "backend": "",
                    "platform": "",
                    "versions": [],
                    "instance_group": [],
                    "batching": {},
                    "cache": False,
                    "routing": None,
                }
            )
        models.sort(key=lambda m: m["name"])
        if self.shadow_totals is not None and records:
            totals = await self.shadow_totals(sorted(records))
            for model in models:
                if model["routing"] is not None and model["name"] in totals:
                    model["routing"]["shadow_stats"] = totals[model["name"]]
        residency = await self.on_demand.survey() if self.on_demand is not None else {}
        for model in models:
            model["in_repository"] = model["name"] in in_repository
            where = residency.get(model["name"])
            if where is not None:
                model["residency"] = asdict(where)
        found: dict[str, Any] = {
            "server": {
                "name": facts.name,
                "version": __version__,
                "node": facts.node,
                "ready": ready,
                "control_mode": facts.control_mode,
                "repositories": list(facts.repositories),
                "writable": facts.writable,
                "access_log": facts.access_log,
                "tracing": facts.tracing,
                "trace_url": facts.trace_url,
                "envoy_admin": facts.envoy_admin,
                "admin": facts.admin,
                "admin_hint": ADMIN_HINT if facts.admin == "off" else "",
                "uptime_s": round(time.time() - facts.started_s, 1),
            },
            "models": models,
        }
        if self.on_demand is not None:
            found["server"]["residency"] = asdict(await self.on_demand.summary())
        return found
