"""``ts.utils.util``: the exception that sets a request's status, and the label helpers."""

from __future__ import annotations

import inspect
import itertools
import json
import logging
import os
from collections.abc import Callable, Iterable
from functools import wraps
from types import ModuleType
from typing import Any
from warnings import warn

logger = logging.getLogger(__name__)


class PredictionException(Exception):
    """Raised by a handler to answer every request of the batch with ``error_code`` and
    ``message`` (TorchServe's error body: ``{"code", "type", "message"}``)."""

    def __init__(self, message: str, error_code: int = 500) -> None:
        self.message = message
        self.error_code = error_code
        super().__init__(message)

    def __str__(self) -> str:
        return f"{self.message} : {self.error_code}"


def list_classes_from_module(module: ModuleType, parent_class: type | None = None) -> list[type]:
    """The classes ``module`` defines itself (not those it imports), optionally only the
    subclasses of ``parent_class``."""
    classes = [
        member
        for _, member in inspect.getmembers(module, inspect.isclass)
        if member.__module__ == module.__name__
    ]
    if parent_class is not None:
        return [c for c in classes if issubclass(c, parent_class)]
    return classes


def load_label_mapping(mapping_file_path: str) -> dict[str, str] | None:
    """``index_to_name.json`` as {class index: label}; None when the file is absent."""
    if not os.path.isfile(mapping_file_path):
        logger.warning(
            "%r is missing. Inference output will not include class name.", mapping_file_path
        )
        return None
    with open(mapping_file_path) as f:
        mapping = json.load(f)
    if not isinstance(mapping, dict):
        raise Exception('index->name JSON mapping should be in "class": "label" format.')
    names = mapping.get("object_type_names")
    if isinstance(names, list):
        return {str(k): v for k, v in enumerate(names)}
    for key, value in mapping.items():
        label = value[-1] if isinstance(value, list) else value
        if not isinstance(label, str):
            raise Exception("labels in index->name mapping must be either str or List[str]")
        mapping[key] = label
    return mapping


def map_class_to_label(
    probs: list[list[float]],
    mapping: dict[str, str] | None = None,
    lbl_classes: Iterable[Iterable[Any]] | None = None,
) -> list[dict[str, float]]:
    """One {label: probability} dict per row of ``probs``."""
    if not isinstance(probs, list):
        raise Exception("Convert classes to list before doing mapping")
    if mapping is not None and not isinstance(mapping, dict):
        raise Exception("Mapping must be a dict")
    if lbl_classes is None:
        lbl_classes = itertools.repeat(range(len(probs[0])), len(probs))
    return [
        {
            (mapping[str(label)] if mapping is not None else str(label)): prob
            for label, prob in zip(labels, row, strict=False)
        }
        for labels, row in zip(lbl_classes, probs, strict=False)
    ]


def get_yaml_config(yaml_file_path: str) -> Any:
    import yaml

    with open(yaml_file_path) as file:
        return yaml.safe_load(file)


def deprecated(
    version: Any, replacement: str = "", klass: type[Warning] = PendingDeprecationWarning
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Mark a function deprecated: calling it warns with ``klass``."""

    def deprecator(func: Callable[..., Any]) -> Callable[..., Any]:
        @wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            warn(
                f"{func.__name__} is deprecated in {version} and moved to {replacement}",
                klass,
                stacklevel=2,
            )
            return func(*args, **kwargs)

        return wrapper

    return deprecator
