"""LightGBM backend: a Booster saved as text (``model.txt``, ``Booster.save_model``).

Objectives ``binary`` and ``multiclass`` serve ``label`` and ``probabilities``; every other
objective serves ``prediction`` (see ``inferd.backends.tabular``). Parameter ``num_threads``
(default: the machine's cores shared among instances). Predictions run in LightGBM's C
library, outside the GIL.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from inferd.backends.completion import (
    check_parameters,
    int_parameter,
    missing_extra,
    string_parameters,
)
from inferd.backends.tabular import (
    TabularBackend,
    TabularModel,
    binary_proba,
)
from inferd.config.model_config_pb2 import ModelConfig
from inferd.core.errors import ModelLoadError

_KNOWN_PARAMETERS = {"num_threads"}


def read_model(version_dir: Path, config: ModelConfig, threads: int = 1) -> TabularModel:
    params = string_parameters(config)
    check_parameters(params, _KNOWN_PARAMETERS, "lightgbm", config.name)
    try:
        import lightgbm
    except ImportError as exc:
        raise missing_extra("LightGBM", "lightgbm", exc) from None
    path = version_dir / (config.default_model_filename or LightGBMBackend.default_filename)
    if not path.is_file():
        raise ModelLoadError(f"no model file {path.name} in version folder {version_dir.name}")
    try:
        booster = lightgbm.Booster(model_file=str(path))
    except Exception as exc:
        raise ModelLoadError(f"LightGBM cannot load {path.name}: {exc}") from None
    return _adapt(booster, int_parameter(params, "num_threads", threads))


def _adapt(booster: Any, threads: int) -> TabularModel:
    objective = str(booster.params.get("objective", "regression")).split()[0]
    n_features = int(booster.num_feature())

    def raw(x: np.ndarray) -> np.ndarray:
        return np.asarray(booster.predict(x, num_threads=threads, validate_features=False))

    if objective == "binary":
        return TabularModel(
            n_features, raw, lambda x: binary_proba(raw(x)), n_classes=2, label_from_proba=True
        )
    if objective in ("multiclass", "softmax"):
        n_classes = int(booster.params.get("num_class", booster.num_model_per_iteration()))
        return TabularModel(n_features, raw, raw, n_classes=n_classes, label_from_proba=True)
    return TabularModel(n_features, raw)


class LightGBMBackend(TabularBackend):
    name = "lightgbm"
    framework = "LightGBM"
    default_filename = "model.txt"
    read = staticmethod(read_model)
