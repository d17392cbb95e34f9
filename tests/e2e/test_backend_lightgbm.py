"""LightGBM backend end to end: boosters trained at test time, saved as text."""

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

lightgbm = pytest.importorskip("lightgbm")


class Trained:
    def __init__(self) -> None:
        rng = np.random.default_rng(1)
        self.x = rng.standard_normal((400, 5)).astype(np.float32)
        classes = np.digitize(self.x[:, 0] - self.x[:, 1], [-0.7, 0.0, 0.7])
        params = {"n_estimators": 10, "num_leaves": 7, "verbose": -1, "n_jobs": 1}
        self.classifier = lightgbm.LGBMClassifier(**params).fit(self.x, classes)
        self.binary = lightgbm.LGBMClassifier(**params).fit(self.x, self.x[:, 2] > 0)
        self.regressor = lightgbm.LGBMRegressor(**params).fit(self.x, self.x[:, 3] - self.x[:, 4])


@pytest.fixture(scope="module")
def trained() -> Trained:
    return Trained()


@pytest.fixture(scope="module")
def lgb_server(
    trained: Trained, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("lightgbm") / "models"
    trained.classifier.booster_.save_model(version_dir(root, "multi") / "model.txt")
    trained.classifier.booster_.save_model(version_dir(root, "multi_batched") / "model.txt")
    write_config(root, "multi_batched", BATCHING)
    trained.binary.booster_.save_model(version_dir(root, "binary") / "model.txt")
    trained.regressor.booster_.save_model(version_dir(root, "regressor") / "model.txt")
    write_config(root, "regressor", 'backend: "lightgbm"\n')
    server = ServerProcess(root).start(timeout_s=120)
    yield server
    server.stop()


def test_multiclass(lgb_server: ServerProcess, trained: Trained) -> None:
    rows = trained.x[:9]
    expected = {
        "label": trained.classifier.predict(rows).astype(np.int64),
        "probabilities": trained.classifier.predict_proba(rows).astype(np.float32),
    }
    check_all_protocols(lgb_server, "multi", {"input": rows}, expected)
    meta = httpx.get(f"{lgb_server.http_url}/v2/models/multi", timeout=60).json()
    assert meta["outputs"][1] == {"name": "probabilities", "datatype": "FP32", "shape": [-1, 4]}


def test_binary(lgb_server: ServerProcess, trained: Trained) -> None:
    rows = trained.x[10:16]
    expected = {
        "label": trained.binary.predict(rows).astype(np.int64),
        "probabilities": trained.binary.predict_proba(rows).astype(np.float32),
    }
    check_all_protocols(lgb_server, "binary", {"input": rows}, expected)


def test_regressor(lgb_server: ServerProcess, trained: Trained) -> None:
    rows = trained.x[20:25]
    expected = {"prediction": trained.regressor.predict(rows).astype(np.float32)}
    check_all_protocols(lgb_server, "regressor", {"input": rows}, expected)


def test_dynamic_batching(lgb_server: ServerProcess, trained: Trained) -> None:
    rows = trained.x[40:46]
    proba = trained.classifier.predict_proba(rows).astype(np.float32)
    check_batching(lgb_server, "multi_batched", "input", rows, "probabilities", proba)


def test_missing_extra_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from inferd.backends.lightgbm import LightGBMBackend
    from inferd.config.text import parse_config_text
    from inferd.core.errors import ModelLoadError

    monkeypatch.setitem(sys.modules, "lightgbm", None)
    with pytest.raises(ModelLoadError, match=r"pip install .*\[lightgbm\]"):
        LightGBMBackend().complete_config(tmp_path, parse_config_text(""), 8)
