"""scikit-learn backend end to end: joblib models fitted at test time, over every protocol."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.e2e.backend_checks import (
    BATCHING,
    check_all_protocols,
    check_batching,
    version_dir,
    write_config,
)
from tests.support import ServerProcess

pytest.importorskip("sklearn")
import joblib
from sklearn.datasets import load_iris
from sklearn.ensemble import RandomForestClassifier, RandomForestRegressor
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

# The config parameter grants nothing any more (the server decides, see test_security_code):
# kept on one model to show an old config still loads.
PICKLE_OK = 'parameters { key: "allow_pickle" value: { string_value: "true" } }\n'


class Fitted:
    def __init__(self) -> None:
        x, y = load_iris(return_X_y=True)
        self.x = x.astype(np.float32)
        self.classifier = make_pipeline(StandardScaler(), LogisticRegression(max_iter=500))
        self.classifier.fit(self.x, y)
        names = np.array(["setosa", "versicolor", "virginica"])
        self.named = LogisticRegression(max_iter=500).fit(self.x, names[y])
        # A forest serves its label from the probabilities' pass: classes that are not indices.
        forest = RandomForestClassifier(n_estimators=7, max_depth=3, random_state=0)
        self.forest = forest.fit(self.x, y * 10 + 3)
        self.named_forest = RandomForestClassifier(n_estimators=7, max_depth=3, random_state=0)
        self.named_forest.fit(self.x, names[y])
        self.regressor = RandomForestRegressor(n_estimators=5, max_depth=4, random_state=0)
        self.regressor.fit(self.x[:, :3], self.x[:, 3])


@pytest.fixture(scope="module")
def fitted() -> Fitted:
    return Fitted()


@pytest.fixture(scope="module")
def sk_server(fitted: Fitted, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("sklearn") / "models"
    models: dict[str, tuple[Any, str]] = {
        "iris": (fitted.classifier, PICKLE_OK),
        "iris_batched": (fitted.classifier, BATCHING),
        "iris_named": (fitted.named, ""),
        "iris_forest": (fitted.forest, ""),
        "iris_forest_batched": (fitted.forest, BATCHING),
        "iris_named_forest": (fitted.named_forest, ""),
        "petal": (fitted.regressor, ""),
        "iris_no_opt_in": (fitted.classifier, ""),
    }
    for name, (estimator, config) in models.items():
        joblib.dump(estimator, version_dir(root, name) / "model.joblib")
        write_config(root, name, config)
    # iris_no_opt_in fails to load on purpose: ready means "startup is done", not "all READY".
    server = ServerProcess(root, extra_args=["--strict-readiness=false"]).start(timeout_s=120)
    yield server
    server.stop()


def test_classifier_labels_and_probabilities(sk_server: ServerProcess, fitted: Fitted) -> None:
    rows = fitted.x[::15]
    expected = {
        "label": fitted.classifier.predict(rows).astype(np.int64),
        "probabilities": fitted.classifier.predict_proba(rows).astype(np.float32),
    }
    check_all_protocols(sk_server, "iris", {"input": rows}, expected)


def test_metadata_is_completed_from_the_estimator(sk_server: ServerProcess) -> None:
    import httpx

    meta = httpx.get(f"{sk_server.http_url}/v2/models/iris", timeout=60).json()
    # A model with a backend and no platform reports its backend, as Triton does.
    assert meta["platform"] == "sklearn"
    assert meta["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 4]}]
    assert meta["outputs"] == [
        {"name": "label", "datatype": "INT64", "shape": [-1, 1]},
        {"name": "probabilities", "datatype": "FP32", "shape": [-1, 3]},
    ]
    config = httpx.get(f"{sk_server.http_url}/v2/models/iris/config", timeout=60).json()
    assert config["backend"] == "sklearn"
    assert config["max_batch_size"] == 64


def test_string_classes_are_bytes(sk_server: ServerProcess, fitted: Fitted) -> None:
    rows = fitted.x[::30]
    expected = {"label": fitted.named.predict(rows).astype(np.bytes_).astype(object)}
    check_all_protocols(sk_server, "iris_named", {"input": rows}, expected)


def test_forest_labels_are_its_classes(sk_server: ServerProcess, fitted: Fitted) -> None:
    rows = fitted.x[::19]  # eight rows, all three classes
    expected = {
        "label": fitted.forest.predict(rows).astype(np.int64),
        "probabilities": fitted.forest.predict_proba(rows).astype(np.float32),
    }
    assert set(expected["label"].tolist()) == {3, 13, 23}
    check_all_protocols(sk_server, "iris_forest", {"input": rows}, expected)
    named = {"label": fitted.named_forest.predict(rows).astype(np.bytes_).astype(object)}
    check_all_protocols(sk_server, "iris_named_forest", {"input": rows}, named)
    check_batching(sk_server, "iris_forest_batched", "input", rows, "label", expected["label"])


def test_regressor_prediction(sk_server: ServerProcess, fitted: Fitted) -> None:
    rows = fitted.x[::20, :3]
    expected = {"prediction": fitted.regressor.predict(rows).astype(np.float32)}
    check_all_protocols(sk_server, "petal", {"input": rows}, expected)


def test_dynamic_batching(sk_server: ServerProcess, fitted: Fitted) -> None:
    rows = fitted.x[::25]
    proba = fitted.classifier.predict_proba(rows).astype(np.float32)
    check_batching(sk_server, "iris_batched", "input", rows, "probabilities", proba)


def test_a_pickle_present_at_start_loads_by_default(sk_server: ServerProcess) -> None:
    import httpx

    # --allow-pickle defaults to 'startup': the operator put these files there.
    r = httpx.get(f"{sk_server.http_url}/v2/models/iris_no_opt_in/ready", timeout=60)
    assert r.status_code == 200 and r.json()["ready"] is True


def test_missing_extra_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from inferd.backends.sklearn import SklearnBackend
    from inferd.config.text import parse_config_text
    from inferd.core.errors import ModelLoadError
    from inferd.security.trust import CodePolicy, Origin, granted

    monkeypatch.setitem(sys.modules, "joblib", None)  # import joblib now fails
    config = parse_config_text("")
    with (
        granted(CodePolicy().grants(Origin.STARTUP)),
        pytest.raises(ModelLoadError, match=r"pip install .*\[sklearn\]"),
    ):
        SklearnBackend().complete_config(tmp_path, config, 8)
