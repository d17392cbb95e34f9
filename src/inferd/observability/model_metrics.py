"""Metrics a model's own code records (a TorchServe handler's ``context.metrics``), on
``/metrics`` beside inferd's own.

Workers send (name, type, unit, labels, value, count) records, added up since their last
message; ``record`` adds them up on the event loop (a dict update per record) and Prometheus
reads the totals at scrape time. A metric keeps the handler's name (``HandlerTime``,
``LoopCount``...) made Prometheus-safe, and its dimensions as labels, plus ``model`` and
``version``: counters add up, gauges keep the last value, histograms become a count and a
sum. A worker is a model's code, so what it sends is checked and bounded: at most
``MAX_SERIES`` series per model version.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Iterable
from typing import Any

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

log = logging.getLogger("inferd.metrics")

MAX_SERIES = 1000  # label sets one model version may create
_KINDS = {"counter": "counter", "gauge": "gauge", "histogram": "summary"}
_UNSAFE = re.compile(r"[^a-zA-Z0-9_:]")
_LABEL_UNSAFE = re.compile(r"[^a-zA-Z0-9_]")

# (metric name, kind) -> labels -> [value or sum, count]
Series = dict[tuple[tuple[str, str], ...], list[float]]


def _name(text: str) -> str:
    name = _UNSAFE.sub("_", text)
    return name if name and not name[0].isdigit() else f"_{name}"


def _label(text: str) -> str:
    name = _LABEL_UNSAFE.sub("_", text)
    if not name or name[0].isdigit() or name.startswith("__"):
        name = f"l_{name}"
    return name


class ModelMetrics(Collector):
    """The totals of every model's own metrics; ``record`` is the workers' sink."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # the metrics port reads from its own thread
        self._metrics: dict[tuple[str, str], tuple[str, Series]] = {}
        self._series_by_model: dict[str, int] = {}
        self._warned: set[str] = set()

    def record(self, model: str, records: list[Any]) -> None:
        """Add a worker's records for ``model`` ("name/version"); malformed ones are dropped."""
        name, _, version = model.rpartition("/")
        with self._lock:
            for item in records:
                try:
                    metric, kind, unit, labels, value, *rest = item
                    kind = _KINDS[kind]
                    pairs = tuple((_label(str(k)), str(v)) for k, v in labels)
                    number = float(value)
                    count = int(rest[0]) if rest else 1
                except (TypeError, ValueError, KeyError):
                    continue
                key = (_name(str(metric)), kind)
                found = self._metrics.get(key)
                if found is None:
                    found = self._metrics[key] = (f"{metric} ({unit})" if unit else str(metric), {})
                series = found[1]
                labelled = (*pairs, ("model", name), ("version", version))
                current = series.get(labelled)
                if current is None:
                    if self._series_by_model.get(model, 0) >= MAX_SERIES:
                        if model not in self._warned:
                            self._warned.add(model)
                            log.warning(
                                "model '%s' recorded more than %d metric series: the rest "
                                "are dropped",
                                model,
                                MAX_SERIES,
                            )
                        continue
                    self._series_by_model[model] = self._series_by_model.get(model, 0) + 1
                    current = series[labelled] = [0.0, 0.0]
                if kind == "gauge":
                    current[0] = number
                else:
                    current[0] += number
                    current[1] += count

    def values(self, metric: str) -> dict[tuple[tuple[str, str], ...], float]:
        """A metric's current values by labels (counters and gauges; histograms: the sum)."""
        with self._lock:
            found: dict[tuple[tuple[str, str], ...], float] = {}
            for (name, _), (_, series) in self._metrics.items():
                if name == _name(metric):
                    found.update({labels: v[0] for labels, v in series.items()})
            return found

    def collect(self) -> Iterable[Metric]:
        with self._lock:
            snapshot = [
                (name, kind, text, dict(series))
                for (name, kind), (text, series) in self._metrics.items()
            ]
        for name, kind, text, series in snapshot:
            family = Metric(name, f"Recorded by the model's own code: {text}", kind)
            for labels, (value, count) in series.items():
                as_dict = dict(labels)
                if kind == "counter":
                    family.add_sample(f"{name}_total", as_dict, value)
                elif kind == "gauge":
                    family.add_sample(name, as_dict, value)
                else:
                    family.add_sample(f"{name}_count", as_dict, count)
                    family.add_sample(f"{name}_sum", as_dict, value)
            yield family
