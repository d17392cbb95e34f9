"""What happens when a request finishes: endpoint metrics, the access log, a trace span."""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass

from inferd.core.types import Timings
from inferd.observability.logging import Logs
from inferd.observability.metrics import EndpointStats
from inferd.observability.trace_settings import TraceSettings
from inferd.observability.tracing import Tracer

_PREFIX = os.urandom(4).hex()
_COUNTER = itertools.count(1)


def new_request_id() -> str:
    """A request id unique to this process run (cheaper than a uuid on the hot path)."""
    return f"{_PREFIX}-{next(_COUNTER):x}"


def _new_prefix() -> None:
    """A forked process (the serving workers are forked) makes ids of its own, or two workers
    would give two requests the same id."""
    global _PREFIX, _COUNTER
    _PREFIX = os.urandom(4).hex()
    _COUNTER = itertools.count(1)


os.register_at_fork(after_in_child=_new_prefix)


@dataclass(slots=True)
class Finished:
    protocol: str  # "http" or "grpc"
    method: str  # HTTP method, or the RPC name
    path: str
    endpoint: str  # the route or RPC: a bounded label
    status: str
    start_ns: int  # perf_counter_ns when the request arrived
    bytes_in: int
    bytes_out: int
    client: str
    request_id: str
    model: str = ""
    version: str = ""
    timings: Timings | None = None


class RequestObserver:
    def __init__(
        self,
        endpoints: EndpointStats,
        logs: Logs | None,
        tracer: Tracer | None,
        node: str,
        trace_settings: TraceSettings | None = None,
    ) -> None:
        self.endpoints = endpoints
        self.logs = logs
        self.tracer = tracer
        # Which requests become spans (Triton's trace settings; changed at run time).
        self.trace_settings = trace_settings or TraceSettings(exporter=tracer is not None)
        self.node = node
        self.access_enabled = logs is not None and logs.access_enabled
        # Whether a finished request needs more than its endpoint metrics.
        self.detailed = self.access_enabled or tracer is not None

    def finish(self, done: Finished, headers: Mapping[str, str]) -> None:
        end_ns = time.perf_counter_ns()
        self.endpoints.observe(done.protocol, done.endpoint, done.status, end_ns - done.start_ns)
        if self.access_enabled and self.logs is not None:
            self.logs.access(
                {
                    "node": self.node,
                    "protocol": done.protocol,
                    "method": done.method,
                    "path": done.path,
                    "model": done.model,
                    "version": done.version,
                    "status": done.status,
                    "latency_ms": round((end_ns - done.start_ns) / 1e6, 3),
                    "bytes_in": done.bytes_in,
                    "bytes_out": done.bytes_out,
                    "client": done.client,
                    "request_id": done.request_id,
                }
            )
        if self.tracer is not None and self.trace_settings.sample(done.model):
            self.tracer.request(
                f"{done.method} {done.endpoint}",
                headers,
                done.start_ns,
                end_ns,
                {
                    "inferd.protocol": done.protocol,
                    "inferd.model": done.model,
                    "inferd.version": done.version,
                    "inferd.status": done.status,
                    "inferd.request_id": done.request_id,
                },
                done.timings,
            )
