"""A model repository for the in-process server's tests: the demo ONNX models, a Python model,
an ensemble over half_plus_two, a decoupled Python model, and echo models (one gated and
dynamically batched, to see in-process and network requests share batches)."""

from __future__ import annotations

from pathlib import Path

from inferd.backends import echo
from inferd.demo.models import write_demo_repository
from tests.e2e.ensemble_support import CHAIN

SCALE = """
from typing import Annotated, TypedDict

import numpy as np


class Inputs(TypedDict):
    X: Annotated[np.ndarray, "FP32", [3]]


class Outputs(TypedDict):
    Y: Annotated[np.ndarray, "FP32", [3]]


class Model:
    max_batch_size = 16

    def infer(self, inputs: Inputs) -> Outputs:
        return {"Y": inputs["X"] * 3.0}
"""

COUNTDOWN_CONFIG = """name: "countdown"
backend: "python"
max_batch_size: 0
input [ { name: "COUNT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
model_transaction_policy { decoupled: true }
"""
# Sends COUNT responses (COUNT-1 down to 0), then the final flag on its own.
COUNTDOWN = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            count = int(pb_utils.get_input_tensor_by_name(request, "COUNT").as_numpy()[0])
            sender = request.get_response_sender()
            for i in reversed(range(count)):
                out = pb_utils.Tensor("OUT", np.array([i], dtype=np.int32))
                sender.send(pb_utils.InferenceResponse([out]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""

SHARED_GATE = "embedded-shared"
SHARED = f"""name: "shared"
backend: "echo"
max_batch_size: 8
input [{{ name: "INPUT0" data_type: TYPE_FP32 dims: [2] }}]
dynamic_batching {{ }}
parameters {{ key: "gate" value: {{ string_value: "{SHARED_GATE}" }} }}
parameters {{ key: "request_level" value: {{ string_value: "true" }} }}
"""
MIRROR = """name: "mirror"
backend: "echo"
max_batch_size: 8
input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [2] }]
"""


def write_repository(root: Path) -> Path:
    write_demo_repository(root, models=["half_plus_two", "digits"])
    models = {
        "chain": (CHAIN, {}),
        "scale": ('name: "scale"\nbackend: "python"\n', {"model.py": SCALE}),
        "countdown": (COUNTDOWN_CONFIG, {"model.py": COUNTDOWN}),
        "shared": (SHARED, {}),
        "mirror": (MIRROR, {}),
    }
    for name, (config, files) in models.items():
        (root / name / "1").mkdir(parents=True, exist_ok=True)
        (root / name / "config.pbtxt").write_text(config)
        for path, text in files.items():
            (root / name / "1" / path).write_text(text)
    return root


def close_gate() -> None:
    """The shared model's executions wait from now until the gate opens."""
    echo.GATES.pop(SHARED_GATE, None)
    echo.gate(SHARED_GATE)
    echo.reset("shared")


def open_gate() -> None:
    echo.gate(SHARED_GATE).set()
