"""XGBoost backend end to end: boosters trained at test time (JSON and UBJSON files)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
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

xgboost = pytest.importorskip("xgboost")


class Trained:
    def __init__(self) -> None:
        rng = np.random.default_rng(0)
        self.x = rng.standard_normal((300, 6)).astype(np.float32)
        classes = np.digitize(self.x[:, 0] + 0.5 * self.x[:, 1], [-0.5, 0.5])
        self.classifier = xgboost.XGBClassifier(n_estimators=8, max_depth=3, nthread=1)
        self.classifier.fit(self.x, classes)
        self.binary = xgboost.XGBClassifier(n_estimators=8, max_depth=3, nthread=1)
        self.binary.fit(self.x, (self.x[:, 2] > 0).astype(int))
        self.regressor = xgboost.XGBRegressor(n_estimators=8, max_depth=3, nthread=1)
        self.regressor.fit(self.x, self.x[:, 3] * 2.0 + self.x[:, 4])


@pytest.fixture(scope="module")
def trained() -> Trained:
    return Trained()


@pytest.fixture(scope="module")
def xgb_server(
    trained: Trained, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("xgboost") / "models"
    trained.classifier.save_model(version_dir(root, "multi") / "model.json")
    trained.classifier.save_model(version_dir(root, "multi_batched") / "model.ubj")
    write_config(root, "multi_batched", BATCHING)
    trained.binary.save_model(version_dir(root, "binary") / "model.ubj")
    trained.regressor.save_model(version_dir(root, "regressor") / "model.json")
    server = ServerProcess(root).start(timeout_s=120)
    yield server
    server.stop()


def test_multiclass(xgb_server: ServerProcess, trained: Trained) -> None:
    rows = trained.x[:7]
    expected = {
        "label": trained.classifier.predict(rows).astype(np.int64),
        "probabilities": trained.classifier.predict_proba(rows),
    }
    check_all_protocols(xgb_server, "multi", {"input": rows}, expected)
    meta = httpx.get(f"{xgb_server.http_url}/v2/models/multi", timeout=60).json()
    assert meta["inputs"] == [{"name": "input", "datatype": "FP32", "shape": [-1, 6]}]
    assert meta["outputs"][1] == {"name": "probabilities", "datatype": "FP32", "shape": [-1, 3]}


def test_binary(xgb_server: ServerProcess, trained: Trained) -> None:
    rows = trained.x[10:15]
    expected = {
        "label": trained.binary.predict(rows).astype(np.int64),
        "probabilities": trained.binary.predict_proba(rows),
    }
    check_all_protocols(xgb_server, "binary", {"input": rows}, expected)


def test_regressor(xgb_server: ServerProcess, trained: Trained) -> None:
    rows = trained.x[20:26]
    expected = {"prediction": trained.regressor.predict(rows)}
    check_all_protocols(xgb_server, "regressor", {"input": rows}, expected)


def test_dynamic_batching(xgb_server: ServerProcess, trained: Trained) -> None:
    rows = trained.x[30:36]
    proba = trained.classifier.predict_proba(rows)
    check_batching(xgb_server, "multi_batched", "input", rows, "probabilities", proba)


def test_missing_extra_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from inferd.backends.xgboost import XGBoostBackend
    from inferd.config.text import parse_config_text
    from inferd.core.errors import ModelLoadError

    monkeypatch.setitem(sys.modules, "xgboost", None)
    with pytest.raises(ModelLoadError, match=r"pip install .*\[xgboost\]"):
        XGBoostBackend().complete_config(tmp_path, parse_config_text(""), 8)
