"""``context.metrics``: the metrics a handler records, for inferd's Prometheus metrics.

TorchServe's metrics cache API (``add_metric_to_cache`` / ``get_metric`` and the older
``add_counter``, ``add_time``, ``add_size``, ``add_percent``, ``add_metric``, ``add_error``).
Each update is kept as a record (name, type, unit, labels, value) until the worker sends the
batch's records to the server, which renders them on ``/metrics``: counters add up, gauges keep
the last value, histograms count and sum. As in TorchServe, a metric tied to a request gets the
dimensions ``ModelName`` and ``Level: Model``; a bad update is logged, never raised.
"""

from __future__ import annotations

import logging
from typing import Any

from .dimension import Dimension
from .metric_type_enum import MetricTypes

logger = logging.getLogger(__name__)

# (name, type, unit, ((dimension, value), ...), value)
Record = tuple[str, str, str, tuple[tuple[str, str], ...], float]


class MetricsCacheKeyError(KeyError):
    """No metric of that name and type was added to the cache."""


class CachedMetric:
    """One metric: ``add_or_update(value, dimension_values)``."""

    def __init__(
        self,
        cache: MetricsCache,
        metric_name: str,
        unit: str,
        dimension_names: list[str],
        metric_type: MetricTypes,
    ) -> None:
        self.cache = cache
        self.metric_name = metric_name
        self.unit = unit
        self.dimension_names = list(dimension_names)
        self.metric_type = metric_type

    def add_or_update(
        self, value: float, dimension_values: list[str] | None = None, request_id: str = ""
    ) -> None:
        values = list(dimension_values or [])
        if len(values) != len(self.dimension_names):
            logger.error(
                "[METRICS]Failed to update metric with name:%s: dimension values %s should "
                "correspond to dimension names %s",
                self.metric_name,
                values,
                self.dimension_names,
            )
            return
        if not isinstance(value, int | float) or isinstance(value, bool):
            logger.error("[METRICS]metric %s: value %r is not a number", self.metric_name, value)
            return
        if self.metric_type is MetricTypes.COUNTER and value < 0:
            logger.error("[METRICS]Counter metric %s cannot decrease", self.metric_name)
            return
        labels = tuple((n, str(v)) for n, v in zip(self.dimension_names, values, strict=True))
        self.cache.records.append(
            (self.metric_name, self.metric_type.value, self.unit, labels, float(value))
        )

    def update(
        self, value: float, request_id: str = "", dimensions: list[Dimension] | None = None
    ) -> None:
        """Older API: the dimensions (``Dimension`` objects) replace the metric's names."""
        dims = list(dimensions or [])
        self.dimension_names = [d.name for d in dims]
        self.add_or_update(value, [d.value for d in dims], request_id)


class MetricsCache:
    """The ``context.metrics`` of one worker."""

    def __init__(self, model_name: str) -> None:
        self.model_name = model_name
        self.request_ids: Any = None
        self.records: list[Record] = []
        self.cache: dict[MetricTypes, dict[str, CachedMetric]] = {t: {} for t in MetricTypes}
        # (name, type, unit) -> (type name, labels) of a metric recorded with the default
        # dimensions only (ModelName, Level: Model)
        self._plain: dict[tuple[str, MetricTypes, str], tuple[str, tuple[tuple[str, str], ...]]]
        self._plain = {}

    def set_request_ids(self, request_ids: Any) -> None:
        self.request_ids = request_ids

    def drain(self) -> list[Record]:
        """The records kept since the last drain."""
        records, self.records = self.records, []
        return records

    # ------------------------------------------------------------------ the cache API

    def add_metric_to_cache(
        self,
        metric_name: str,
        unit: str,
        dimension_names: list[str] | None = None,
        metric_type: MetricTypes = MetricTypes.COUNTER,
    ) -> CachedMetric:
        if not isinstance(metric_name, str) or not metric_name:
            raise TypeError("`metric_name` must be a non-empty str")
        if not isinstance(metric_type, MetricTypes):
            raise TypeError("`metric_type` must be a MetricTypes enum")
        metric = CachedMetric(self, metric_name, unit, list(dimension_names or []), metric_type)
        self.cache[metric_type][metric_name] = metric
        return metric

    def get_metric(
        self, metric_name: str, metric_type: MetricTypes = MetricTypes.COUNTER
    ) -> CachedMetric:
        try:
            return self.cache[metric_type][metric_name]
        except KeyError:
            raise MetricsCacheKeyError(
                f"Metric of type '{metric_type}' and name '{metric_name}' doesn't exist"
            ) from None

    # ------------------------------------------------------------------ the older API

    def _request(self, idx: Any) -> Any:
        ids = self.request_ids
        if isinstance(ids, dict):
            if idx is not None and idx in ids:
                return ids[idx]
            return ",".join(ids.values())
        return ids

    def _dimensions(self, request: Any, dimensions: list[Dimension] | None) -> list[Dimension]:
        dims = list(dimensions or [])
        names = {d.name for d in dims}
        if request is None:
            if "Level" not in names:
                dims.append(Dimension("Level", "Error"))
            return dims
        if "ModelName" not in names:
            dims.append(Dimension("ModelName", self.model_name))
        if "Level" not in names:
            dims.append(Dimension("Level", "Model"))
        return dims

    def _add(
        self,
        name: str,
        value: float,
        unit: str,
        idx: Any,
        dimensions: list[Dimension] | None,
        metric_type: MetricTypes,
    ) -> None:
        if not dimensions and isinstance(self.request_ids, dict):
            # The usual call (no dimensions of its own, during a batch): one look-up.
            key = (name, metric_type, unit)
            found = self._plain.get(key)
            if found is None:
                labels = (("ModelName", self.model_name), ("Level", "Model"))
                found = self._plain[key] = (metric_type.value, labels)
                self.add_metric_to_cache(name, unit, ["ModelName", "Level"], metric_type)
            if metric_type is MetricTypes.COUNTER and value < 0:
                logger.error("[METRICS]Counter metric %s cannot decrease", name)
                return
            self.records.append((name, found[0], unit, found[1], float(value)))
            return
        dims = self._dimensions(self._request(idx), dimensions)
        metric = self.cache[metric_type].get(name)
        names = [d.name for d in dims]
        if metric is None or metric.dimension_names != names:
            metric = self.add_metric_to_cache(name, unit, names, metric_type)
        metric.add_or_update(value, [d.value for d in dims])

    def add_metric(
        self,
        name: str,
        value: float,
        unit: str,
        idx: Any = None,
        dimensions: list[Dimension] | None = None,
        metric_type: MetricTypes = MetricTypes.COUNTER,
    ) -> None:
        self._add(name, value, unit, idx, dimensions, metric_type)

    def add_counter(
        self, name: str, value: float, idx: Any = None, dimensions: list[Dimension] | None = None
    ) -> None:
        self._add(name, value, "count", idx, dimensions, MetricTypes.COUNTER)

    def add_time(
        self,
        name: str,
        value: float,
        idx: Any = None,
        unit: str = "ms",
        dimensions: list[Dimension] | None = None,
        metric_type: MetricTypes = MetricTypes.GAUGE,
    ) -> None:
        if unit not in ("ms", "s"):
            raise ValueError("the unit for a timed metric should be one of ['ms', 's']")
        self._add(name, value, unit, idx, dimensions, metric_type)

    def add_size(
        self,
        name: str,
        value: float,
        idx: Any = None,
        unit: str = "MB",
        dimensions: list[Dimension] | None = None,
        metric_type: MetricTypes = MetricTypes.GAUGE,
    ) -> None:
        if unit not in ("MB", "kB", "GB", "B"):
            raise ValueError("The unit for size based metric is one of ['MB','kB', 'GB', 'B']")
        self._add(name, value, unit, idx, dimensions, metric_type)

    def add_percent(
        self,
        name: str,
        value: float,
        idx: Any = None,
        dimensions: list[Dimension] | None = None,
        metric_type: MetricTypes = MetricTypes.GAUGE,
    ) -> None:
        self._add(name, value, "percent", idx, dimensions, metric_type)

    def add_error(self, name: str, value: float, dimensions: list[Dimension] | None = None) -> None:
        dims = self._dimensions(None, dimensions)
        metric = self.add_metric_to_cache(name, "", [d.name for d in dims], MetricTypes.COUNTER)
        metric.add_or_update(value, [d.value for d in dims])
