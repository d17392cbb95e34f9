"""scikit-learn backend: a fitted estimator or pipeline saved with joblib (``model.joblib``).

Loading a pickle runs code from the file, so a model loads only when the server allows it for
the model's origin (``--allow-pickle``, ``inferd.security.trust``); no config can. Classifiers (with
``predict_proba``) serve ``label`` and ``probabilities``; regressors serve ``prediction``
(see ``inferd.backends.tabular``). A forest classifier (random forest, extra trees; one
output), whose ``predict`` is by scikit-learn's own code the class of highest
``predict_proba``, runs once per batch for both outputs, not twice.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np

from inferd.backends.completion import (
    check_parameters,
    missing_extra,
    model_file,
    string_parameters,
)
from inferd.backends.tabular import TabularBackend, TabularModel
from inferd.config.model_config_pb2 import ModelConfig
from inferd.core import datatypes
from inferd.core.errors import ModelLoadError
from inferd.security.trust import Capability, require

log = logging.getLogger("inferd.backends")

_KNOWN_PARAMETERS = {"allow_pickle"}  # accepted, inert: the server decides
_FILENAMES = ("model.joblib", "model.pkl")


def _path(version_dir: Path, config: ModelConfig) -> Path:
    return model_file(version_dir, config, _FILENAMES)


def read_model(version_dir: Path, config: ModelConfig, threads: int = 1) -> TabularModel:
    """A joblib/pickle estimator (``threads`` is unused: the estimator keeps its own n_jobs)."""
    params = string_parameters(config)
    check_parameters(params, _KNOWN_PARAMETERS, "sklearn", config.name)
    path = _path(version_dir, config)
    if "allow_pickle" in params:
        log.warning(
            "model '%s': config parameter allow_pickle grants nothing; the server's "
            "--allow-pickle decides",
            config.name,
        )
    require(Capability.PICKLE, f"{path.name} is a pickle", [path])
    try:
        import joblib
        import sklearn  # noqa: F401  (the estimator's classes live there)
    except ImportError as exc:
        raise missing_extra("scikit-learn", "sklearn", exc) from None
    if not path.is_file():
        raise ModelLoadError(f"no model file {path.name} in version folder {version_dir.name}")
    try:
        estimator = joblib.load(path)
    except Exception as exc:
        raise ModelLoadError(f"cannot load {path.name} with joblib: {exc}") from None
    return _adapt(estimator, path.name)


def _label_is_argmax(estimator: Any) -> bool:
    """Whether ``predict`` is ``classes_[argmax(predict_proba)]`` by scikit-learn's own code
    (a forest classifier with one output, methods not overridden): one pass serves both."""
    if int(getattr(estimator, "n_outputs_", 0)) != 1:
        return False
    from sklearn.ensemble import ExtraTreesClassifier, RandomForestClassifier

    kind = type(estimator)
    for base in (RandomForestClassifier, ExtraTreesClassifier):
        if issubclass(kind, base):
            return kind.predict is base.predict and kind.predict_proba is base.predict_proba
    return False


def _adapt(estimator: Any, filename: str) -> TabularModel:
    if not callable(getattr(estimator, "predict", None)):
        raise ModelLoadError(
            f"{filename} holds a {type(estimator).__name__}, which has no predict()"
        )
    n_features = int(getattr(estimator, "n_features_in_", -1))
    classes = getattr(estimator, "classes_", None)
    proba = getattr(estimator, "predict_proba", None)
    if classes is not None and callable(proba):
        classes = np.asarray(classes)
        label_type = (
            datatypes.BYTES
            if classes.dtype.kind in ("U", "S", "O")
            else datatypes.from_numpy(classes.dtype)
        )
        if label_type.name in ("FP16", "FP32", "FP64", "BOOL"):
            label_type = datatypes.BY_NAME["INT64"] if label_type.name == "BOOL" else label_type
        return TabularModel(
            n_features=n_features,
            predict=estimator.predict,
            predict_proba=proba,
            n_classes=len(classes),
            label_type=label_type,
            label_from_proba=_label_is_argmax(estimator),
            classes=classes,
        )
    n_targets = int(getattr(estimator, "n_outputs_", 1))
    return TabularModel(n_features=n_features, predict=estimator.predict, n_targets=n_targets)


class SklearnBackend(TabularBackend):
    name = "sklearn"
    framework = "scikit-learn"
    default_filename = "model.joblib"
    read = staticmethod(read_model)
