"""Triton's form in process (no worker): requests in, one response per request out, errors per
request or per batch, response senders, outputs conformed to the config."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pytest

from inferd.backends.python.host import python_executor
from inferd.backends.work import Executor, Work
from inferd.core.errors import InferdError, InternalError, InvalidInput, ModelLoadError, NotFound

CONFIG = {
    "name": "m",
    "max_batch_size": 4,
    "input": [{"name": "X", "data_type": "TYPE_FP32", "dims": [2]}],
    "output": [
        {"name": "Y", "data_type": "TYPE_FP32", "dims": [2]},
        {"name": "TEXT", "data_type": "TYPE_STRING", "dims": [1]},
    ],
}


class Build(Protocol):
    def __call__(self, source: str, config: dict[str, Any] = ...) -> Executor: ...


@pytest.fixture
def model(tmp_path: Path) -> Iterator[Build]:
    """Build an executor from model.py source (the module is forgotten afterwards)."""

    def build(source: str, config: dict[str, Any] = CONFIG) -> Executor:
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


def _work(*rows: float, id: str = "", **params: Any) -> Work:
    x = np.array([[r, r] for r in rows], np.float32)
    return Work({"X": x}, len(rows), ("Y", "TEXT"), id, dict(params))


DOUBLE = """
import json
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            x = pb_utils.get_input_tensor_by_name(r, "X").as_numpy()
            text = np.array([[r.request_id() + json.loads(r.parameters()).get("p", "")]] * len(x))
            out.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("Y", (x * 2).astype(np.float64)),  # cast to FP32 by the server
                pb_utils.Tensor("TEXT", text),
            ]))
        return out
"""


def test_each_request_gets_its_own_response(model: Build) -> None:
    executor = model(DOUBLE)
    executed = executor.execute([_work(1, id="a", p="!"), _work(2, 3, id="b")])
    first, second = executed.results
    assert isinstance(first, dict) and isinstance(second, dict)
    assert first["Y"].dtype == np.float32 and first["Y"].tolist() == [[2, 2]]
    assert second["Y"].tolist() == [[4, 4], [6, 6]]
    assert first["TEXT"].tolist() == [[b"a!"]]  # str became bytes (BYTES)
    assert second["TEXT"].tolist() == [[b"b"], [b"b"]]
    executor.close()


def test_errors_per_request_and_per_batch(model: Build) -> None:
    executor = model(
        """
        import triton_python_backend_utils as pb_utils

        class TritonPythonModel:
            def execute(self, requests):
                if len(requests) == 3:
                    raise RuntimeError("three at once")
                if len(requests) == 1:
                    return []
                return [
                    pb_utils.InferenceResponse(error=pb_utils.TritonError("bad", code))
                    for code in (pb_utils.TritonError.INVALID_ARG, pb_utils.TritonError.NOT_FOUND)
                ]
        """
    )
    bad, missing = executor.execute([_work(1), _work(2)]).results
    assert isinstance(bad, InvalidInput) and bad.message == "bad"
    assert isinstance(missing, NotFound)
    results = executor.execute([_work(1), _work(2), _work(3)]).results
    assert all(isinstance(r, InternalError) for r in results)
    assert "RuntimeError: three at once (model.py line 7)" in results[0].message  # type: ignore[union-attr]
    (wrong_count,) = executor.execute([_work(1)]).results
    assert isinstance(wrong_count, InternalError)
    assert "execute() returned 0 for 1 request(s)" in wrong_count.message


def test_responses_through_a_response_sender(model: Build) -> None:
    executor = model(
        """
        import numpy as np
        import triton_python_backend_utils as pb_utils

        class TritonPythonModel:
            def execute(self, requests):
                for r in requests:
                    x = pb_utils.get_input_tensor_by_name(r, "X").as_numpy()
                    sender = r.get_response_sender()
                    text = np.array([[b"sent"]] * len(x), dtype=object)
                    tensors = [pb_utils.Tensor("Y", x), pb_utils.Tensor("TEXT", text)]
                    sender.send(
                        pb_utils.InferenceResponse(tensors),
                        flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
                    )
                    try:
                        sender.send(pb_utils.InferenceResponse([]))
                    except pb_utils.TritonModelException:
                        pass
                return None
        """
    )
    (result,) = executor.execute([_work(5)]).results
    assert isinstance(result, dict) and result["TEXT"].tolist() == [[b"sent"]]


def test_missing_outputs_and_wrong_rows_are_errors(model: Build) -> None:
    executor = model(
        """
        import numpy as np
        import triton_python_backend_utils as pb_utils

        class TritonPythonModel:
            def execute(self, requests):
                out = []
                for r in requests:
                    y = np.zeros((7, 2), np.float32)
                    tensors = [pb_utils.Tensor("Y", y)]
                    if r.request_id() == "text":
                        text = np.array([[b"t"]] * 7, dtype=object)
                        tensors.append(pb_utils.Tensor("TEXT", text))
                    out.append(pb_utils.InferenceResponse(tensors))
                return out
        """
    )
    missing, rows = executor.execute([_work(1), _work(1, id="text")]).results
    assert isinstance(missing, InternalError)
    assert "returned no output 'TEXT'" in missing.message
    assert isinstance(rows, InferdError) and "batch size 7" in rows.message


def test_initialize_failures_and_args(model: Build, tmp_path: Path) -> None:
    with pytest.raises(
        ModelLoadError, match=r"initialize\(\) raised KeyError: 'nope' \(model.py line 4\)"
    ):
        model(
            """
            class TritonPythonModel:
                def initialize(self, args):
                    args["nope"]
                def execute(self, requests):
                    return []
            """
        )
    executor = model(
        """
        import json
        import numpy as np
        import triton_python_backend_utils as pb_utils

        class TritonPythonModel:
            def initialize(self, args):
                self.args = args

            def execute(self, requests):
                text = np.array([[json.dumps(self.args)]], dtype=object)
                x = pb_utils.get_input_tensor_by_name(requests[0], "X").as_numpy()
                tensors = [pb_utils.Tensor("Y", x), pb_utils.Tensor("TEXT", text)]
                return [pb_utils.InferenceResponse(tensors)]
        """
    )
    (result,) = executor.execute([_work(1)]).results
    assert isinstance(result, dict)
    args = json.loads(result["TEXT"][0][0])
    assert json.loads(args.pop("model_config"))["name"] == "m"
    assert args == {
        "model_instance_kind": "CPU",
        "model_instance_name": "m_0_0",
        "model_instance_device_id": "0",
        "model_repository": str(tmp_path / "m"),
        "model_version": "1",
        "model_name": "m",
    }


def test_calls_to_other_models_need_a_worker(model: Build) -> None:
    executor = model(
        """
        import numpy as np
        import triton_python_backend_utils as pb_utils

        class TritonPythonModel:
            def execute(self, requests):
                response = pb_utils.InferenceRequest(
                    model_name="other", requested_output_names=["Y"], inputs=[]
                ).exec()
                message = response.error().message()
                x = pb_utils.get_input_tensor_by_name(requests[0], "X").as_numpy()
                text = np.array([[message.encode()]], dtype=object)
                tensors = [pb_utils.Tensor("Y", x), pb_utils.Tensor("TEXT", text)]
                return [pb_utils.InferenceResponse(tensors)]
        """
    )
    (result,) = executor.execute([_work(1)]).results
    assert isinstance(result, dict)
    assert result["TEXT"][0][0] == b"calls to other models work only in a worker process"


def test_a_file_without_a_model_class(model: Build) -> None:
    with pytest.raises(ModelLoadError, match="defines no class TritonPythonModel"):
        model("x = 1\n")
    with pytest.raises(ModelLoadError, match=r"does not import: SyntaxError"):
        model("def broken(:\n")


def test_the_worker_side_imports_no_protobuf() -> None:
    """A model's own environment may pin any protobuf: the worker side never imports it."""
    code = (
        "import sys, inferd.scheduling.model_process, inferd.scheduling.zygote, "
        "inferd.backends.python.host; print('google.protobuf' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
