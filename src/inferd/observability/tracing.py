"""OpenTelemetry tracing: a span per request with queue, compute and response children.

Off by default (``--trace-exporter console|otlp``). A W3C ``traceparent`` header continues
the caller's trace. Phase spans are made after the fact from the timestamps the scheduler
records, so tracing adds nothing to the request path while it is off.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from inferd.core.errors import ConfigError
from inferd.core.types import Timings

# perf_counter_ns() + EPOCH_OFFSET_NS = time.time_ns(), for explicit span times.
EPOCH_OFFSET_NS = time.time_ns() - time.perf_counter_ns()


class Tracer:
    def __init__(self, exporter: str, endpoint: str, service_name: str) -> None:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        span_exporter: SpanExporter
        if exporter == "console":
            from opentelemetry.sdk.trace.export import ConsoleSpanExporter

            span_exporter = ConsoleSpanExporter()
        elif exporter == "otlp":
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            span_exporter = OTLPSpanExporter(endpoint=endpoint) if endpoint else OTLPSpanExporter()
        else:
            raise ConfigError(f"--trace-exporter must be console or otlp, got '{exporter}'")
        self.provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
        self.provider.add_span_processor(BatchSpanProcessor(span_exporter))
        self.tracer = self.provider.get_tracer("inferd")
        self.propagator = TraceContextTextMapPropagator()

    def request(
        self,
        name: str,
        headers: Mapping[str, str],
        start_ns: int,
        end_ns: int,
        attributes: dict[str, Any],
        timings: Timings | None,
    ) -> None:
        """Record one finished request (times from ``perf_counter_ns``)."""
        parent = self.propagator.extract(carrier=dict(headers))
        span = self.tracer.start_span(
            name, context=parent, start_time=start_ns + EPOCH_OFFSET_NS, attributes=attributes
        )
        if timings is not None and timings.queue_start_ns:
            from opentelemetry import trace

            inner = trace.set_span_in_context(span)
            phases = (
                ("queue", timings.queue_start_ns, timings.compute_start_ns),
                ("compute", timings.compute_start_ns, timings.compute_end_ns),
                ("response", timings.compute_end_ns, end_ns),
            )
            for phase, begin, finish in phases:
                if begin and finish >= begin:
                    child = self.tracer.start_span(
                        phase, context=inner, start_time=begin + EPOCH_OFFSET_NS
                    )
                    child.end(end_time=finish + EPOCH_OFFSET_NS)
        span.end(end_time=end_ns + EPOCH_OFFSET_NS)

    def close(self) -> None:
        self.provider.shutdown()
