"""``ts.handler_utils.utils``: a streaming handler's intermediate answers, and ``import_class``."""

from __future__ import annotations

import importlib
from typing import Any


def send_intermediate_predict_response(
    ret: list[Any], req_id_map: dict[int, str], message: str, code: int, context: Any = None
) -> None:
    """Send one answer per request of the batch before the handler's final ones: each reaches
    its client at once (a chunk of the HTTP response, a message of gRPC's StreamPredictions)."""
    sender = getattr(context, "_send_intermediate", None)
    if sender is None:
        raise RuntimeError("intermediate answers can only be sent while handle() runs")
    sender(ret, req_id_map)


def import_class(class_name: str, module_prefix: str | None = None) -> Any:
    """A class by its dotted name (``module.Class``), under ``module_prefix`` if given."""
    if not class_name:
        raise ImportError("class name is not defined")
    module_name, _, name = class_name.rpartition(".")
    if module_prefix:
        full = f"{module_prefix}.{module_name}" if module_name else module_prefix
    elif module_name:
        full = module_name
    else:
        raise ImportError("module name is not defined.")
    found = getattr(importlib.import_module(full), name, None)
    if found is None:
        raise ImportError(f"class:{name} not found in module:{full}.")
    return found
