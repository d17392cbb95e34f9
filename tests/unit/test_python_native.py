"""The native form: config completed from TypedDict hints, whole batches through BatchExecutor."""

from __future__ import annotations

import json
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, TypedDict

import numpy as np
import pytest

from inferd.backends.python.host import python_executor
from inferd.backends.python.native import complete_native
from inferd.backends.work import Work
from inferd.core.errors import InternalError, ModelLoadError


class In(TypedDict):
    X: Annotated[np.ndarray, "FP32", [3]]
    NAME: Annotated[np.ndarray, "BYTES", (1,)]


class Out(TypedDict):
    Y: Annotated[np.ndarray, np.float64, [3]]


class Hinted:
    max_batch_size = 16

    def infer(self, inputs: In) -> Out:
        return {"Y": inputs["X"]}


def test_type_hints_complete_an_empty_config() -> None:
    config = complete_native(Hinted, {"name": "m", "max_batch_size": 0}, 64)
    assert config["max_batch_size"] == 16
    assert config["input"] == [
        {"name": "X", "data_type": "TYPE_FP32", "dims": [3]},
        {"name": "NAME", "data_type": "TYPE_STRING", "dims": [1]},
    ]
    assert config["output"] == [{"name": "Y", "data_type": "TYPE_FP64", "dims": [3]}]


def test_the_config_wins_over_the_hints() -> None:
    config = {
        "name": "m",
        "max_batch_size": 0,
        "input": [{"name": "X", "data_type": "TYPE_FP32", "dims": [3]}],
        "output": [{"name": "Y", "data_type": "TYPE_FP32", "dims": [3]}],
    }
    completed = complete_native(Hinted, config, 64)
    assert completed["max_batch_size"] == 0  # it lists tensors: its batch size stands
    assert [t["name"] for t in completed["input"]] == ["X", "NAME"]
    assert completed["output"] == config["output"]


class Bad(TypedDict):
    X: Annotated[np.ndarray, "FP33", [3]]


class BadlyHinted:
    def infer(self, inputs: Bad) -> Out:
        return {"Y": inputs["X"]}


def test_a_bad_annotation_names_the_field() -> None:
    with pytest.raises(ModelLoadError, match="field 'X': unknown datatype 'FP33'"):
        complete_native(BadlyHinted, {"name": "m"}, 8)


@pytest.fixture
def native(tmp_path: Path) -> Iterator[Any]:
    def build(source: str, config: dict[str, Any]) -> Any:
        version = tmp_path / "m" / "1"
        version.mkdir(parents=True, exist_ok=True)
        (version / "model.py").write_text(textwrap.dedent(source))
        return python_executor(
            str(version / "model.py"), json.dumps(config), "CPU", 0, 0, str(version.parent), "1"
        )

    path = list(sys.path)
    yield build
    sys.modules.pop("model", None)
    sys.path[:] = path


CONFIG = {
    "name": "m",
    "max_batch_size": 8,
    "input": [{"name": "X", "data_type": "TYPE_FP32", "dims": [1]}],
    "output": [{"name": "Y", "data_type": "TYPE_FP32", "dims": [1]}],
}


def test_infer_sees_the_whole_batch(native: Any) -> None:
    executor = native(
        """
        import numpy as np

        class Model:
            def load(self):
                self.calls = []

            def infer(self, inputs):
                self.calls.append(len(inputs["X"]))
                return {"Y": inputs["X"] + len(inputs["X"])}  # float32 + int: stays float32
        """,
        CONFIG,
    )
    works = [Work({"X": np.array([[1.0]], np.float32)}, 1, ("Y",)) for _ in range(3)]
    works.append(Work({"X": np.array([[5.0], [6.0]], np.float32)}, 2, ("Y",)))
    executed = executor.execute(works)
    assert [r["Y"].tolist() for r in executed.results] == [[[6]], [[6]], [[6]], [[10], [11]]]
    executor.close()


def test_infer_errors_are_errors_of_the_batch(native: Any) -> None:
    executor = native(
        """
        class Model:
            def infer(self, inputs):
                return {"Z": inputs["X"]}
        """,
        CONFIG,
    )
    (result,) = executor.execute([Work({"X": np.zeros((1, 1), np.float32)}, 1, ("Y",))]).results
    assert isinstance(result, InternalError) and "returned no output 'Y'" in result.message


def test_an_exception_in_infer_names_its_model_py_line(
    native: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # the repository given as a relative path, as ./models is
    source = """
        class Model:
            def infer(self, inputs):
                raise ValueError("x must be positive")
        """
    native(source, CONFIG)  # writes m/1/model.py
    relative = python_executor("m/1/model.py", json.dumps(CONFIG), "CPU", 0, 0, "m", "1")
    (result,) = relative.execute([Work({"X": np.zeros((1, 1), np.float32)}, 1, ("Y",))]).results
    assert isinstance(result, InternalError)
    assert result.message.endswith("failed: ValueError: x must be positive (model.py line 4)")
