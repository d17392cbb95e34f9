"""The Python models of docs/python/index.md run as written (in this process, through the
Python backend); tests/docs runs them in a server too."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from inferd_docs.examples import blocks

from inferd.backends.base import InstancePlacement
from inferd.backends.python.backend import PythonBackend
from inferd.backends.work import Work
from inferd.config.text import parse_config_text
from inferd.repository.loader import plan
from inferd.security.trust import CodeNotAllowed, CodePolicy, Grant, Origin, granted

PAGE = Path(__file__).resolve().parents[2] / "docs" / "python" / "index.md"
PLACEMENT = InstancePlacement("CPU", 0, 1, 0)


def _snippet(path: str) -> str:
    """The page's block written to ``path`` (``<!-- run file=PATH -->``)."""
    found = [b.body for b in blocks(PAGE) if b.options.get("file") == path]
    assert len(found) == 1, f"{PAGE} has no block for {path}"
    return found[0]


@pytest.fixture
def clean() -> Iterator[None]:
    """Loaded as a model present at start, which the server's default lets run."""
    path = list(sys.path)
    with granted(CodePolicy().grants(Origin.STARTUP)):
        yield
    sys.modules.pop("model", None)
    sys.path[:] = path


def test_the_triton_form(tmp_path: Path, clean: None) -> None:
    version = tmp_path / "add_sub" / "1"
    version.mkdir(parents=True)
    (version / "model.py").write_text(_snippet("models/add_sub/1/model.py"))
    config = parse_config_text('name: "add_sub"\n' + _snippet("models/add_sub/config.pbtxt"))
    backend = PythonBackend()
    backend.complete_config(version, config, 64)
    executor = backend.load_executor(version, config, PLACEMENT)
    a, b = np.arange(4, dtype=np.float32), np.ones(4, np.float32)
    (result,) = executor.execute([Work({"INPUT0": a, "INPUT1": b}, 0, ("OUTPUT0",))]).results
    assert isinstance(result, dict) and result["OUTPUT0"].tolist() == [1, 2, 3, 4]
    executor.close()


def test_the_native_form(tmp_path: Path, clean: None) -> None:
    """As the page writes it: a folder with ``1/model.py`` and no config.pbtxt."""
    version = tmp_path / "scale" / "1"
    version.mkdir(parents=True)
    (version / "model.py").write_text(_snippet("models/scale/1/model.py"))
    model_plan = plan("scale", tmp_path / "scale")  # the loader's own reading of the folder
    backend, config = model_plan.backend, model_plan.config
    assert isinstance(backend, PythonBackend)
    backend.complete_config(version, config, 64)  # from the type hints, in a process of its own
    assert config.max_batch_size == 16
    assert [(t.name, list(t.dims)) for t in config.input] == [("X", [3])]
    executor = backend.load_executor(version, config, PLACEMENT)
    x = np.ones((2, 3), np.float32)
    (result,) = executor.execute([Work({"X": x}, 2, ("Y",))]).results
    assert isinstance(result, dict) and result["Y"].tolist() == [[3, 3, 3], [3, 3, 3]]


def test_a_model_py_folder_still_needs_the_operators_grant(tmp_path: Path) -> None:
    """Found by its file, a Python model runs only where the operator allowed Python models."""
    version = tmp_path / "scale" / "1"
    version.mkdir(parents=True)
    (version / "model.py").write_text(_snippet("models/scale/1/model.py"))
    model_plan = plan("scale", tmp_path / "scale")
    never = CodePolicy(python_models=Grant.NEVER)
    with granted(never.grants(Origin.STARTUP)), pytest.raises(CodeNotAllowed) as refused:
        model_plan.backend.complete_config(version, model_plan.config, 64)
    assert "--allow-python-models never" in str(refused.value)


def test_a_framework_file_beside_model_py_wins(tmp_path: Path) -> None:
    """A model file next to a ``model.py`` (code that may load it) keeps its own backend."""
    version = tmp_path / "m" / "1"
    version.mkdir(parents=True)
    (version / "model.py").write_text("")
    (version / "model.onnx").write_bytes(b"")
    assert plan("m", tmp_path / "m").backend.name == "onnxruntime"
