"""``ts.metrics.metric_type_enum``: the kinds of metric a handler records."""

from __future__ import annotations

import enum


class MetricTypes(enum.Enum):
    COUNTER = "counter"
    GAUGE = "gauge"
    HISTOGRAM = "histogram"
