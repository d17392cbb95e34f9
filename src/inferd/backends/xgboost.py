"""XGBoost backend: a Booster saved as JSON (``model.json``) or UBJSON (``model.ubj``).

Classification objectives (``binary:logistic``, ``multi:softprob``, ``multi:softmax``) serve
``label`` and ``probabilities``; every other objective serves ``prediction`` (see
``inferd.backends.tabular``). Parameter ``nthread`` (default: the machine's cores shared among
instances). Predictions run in XGBoost's C library, outside the GIL.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from inferd.backends.completion import (
    check_parameters,
    int_parameter,
    missing_extra,
    model_file,
    string_parameters,
)
from inferd.backends.tabular import (
    TabularBackend,
    TabularModel,
    binary_proba,
)
from inferd.config.model_config_pb2 import ModelConfig
from inferd.core.errors import ModelLoadError

_KNOWN_PARAMETERS = {"nthread"}
_FILENAMES = ("model.json", "model.ubj")


def _path(version_dir: Path, config: ModelConfig) -> Path:
    return model_file(version_dir, config, _FILENAMES)


def read_model(version_dir: Path, config: ModelConfig, threads: int = 1) -> TabularModel:
    params = string_parameters(config)
    check_parameters(params, _KNOWN_PARAMETERS, "xgboost", config.name)
    try:
        import xgboost
    except ImportError as exc:
        raise missing_extra("XGBoost", "xgboost", exc) from None
    path = _path(version_dir, config)
    if not path.is_file():
        raise ModelLoadError(f"no model file {path.name} in version folder {version_dir.name}")
    try:
        booster = xgboost.Booster(model_file=str(path))
        learner = json.loads(booster.save_config())["learner"]
    except Exception as exc:
        raise ModelLoadError(f"XGBoost cannot load {path.name}: {exc}") from None
    booster.set_param({"nthread": int_parameter(params, "nthread", threads)})
    return _adapt(booster, learner)


def _adapt(booster: Any, learner: dict[str, Any]) -> TabularModel:
    objective = learner["objective"]["name"]
    model_param = learner.get("learner_model_param", {})
    n_features = int(booster.num_features())
    n_classes = int(model_param.get("num_class", "0") or 0)

    def raw(x: np.ndarray) -> np.ndarray:
        return np.asarray(booster.inplace_predict(x, validate_features=False))

    if objective == "binary:logistic":
        return TabularModel(
            n_features, raw, lambda x: binary_proba(raw(x)), n_classes=2, label_from_proba=True
        )
    if objective == "multi:softprob":
        return TabularModel(n_features, raw, raw, n_classes=n_classes, label_from_proba=True)
    if objective == "multi:softmax":

        def softmax(x: np.ndarray) -> np.ndarray:
            margin = np.asarray(
                booster.inplace_predict(x, predict_type="margin", validate_features=False)
            )
            exp: np.ndarray = np.exp(margin - margin.max(axis=1, keepdims=True))
            proba: np.ndarray = exp / exp.sum(axis=1, keepdims=True)
            return proba

        return TabularModel(n_features, raw, softmax, n_classes=n_classes, label_from_proba=True)
    n_targets = int(model_param.get("num_target", "1") or 1)
    return TabularModel(n_features, raw, n_targets=n_targets)


class XGBoostBackend(TabularBackend):
    name = "xgboost"
    framework = "XGBoost"
    default_filename = "model.json"
    read = staticmethod(read_model)
