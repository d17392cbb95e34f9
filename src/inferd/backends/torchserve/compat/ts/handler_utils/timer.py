"""``ts.handler_utils.timer``: ``@timed`` records a handler method's time as the metric
``ts_handler_<method>`` (ms) when the archive's model-config.yaml sets ``handler: profile:
true``; otherwise it only calls the method."""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import wraps
from typing import Any


def timed(func: Callable[..., Any]) -> Callable[..., Any]:
    @wraps(func)
    def wrap_func(self: Any, *args: Any, **kwargs: Any) -> Any:
        context = getattr(self, "context", None)
        handler = (getattr(context, "model_yaml_config", None) or {}).get("handler")
        if not (isinstance(handler, dict) and handler.get("profile")):
            return func(self, *args, **kwargs)
        start = time.perf_counter()
        result = func(self, *args, **kwargs)
        duration_ms = (time.perf_counter() - start) * 1000
        context.metrics.add_time("ts_handler_" + func.__name__, duration_ms)  # type: ignore[union-attr]
        return result

    return wrap_func
