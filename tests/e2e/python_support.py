"""Python models for the end-to-end tests: Triton's form, the native form, BLS, broken ones."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.support import PYTHON_PAGE, docs_block

ADD_SUB_CONFIG = """
backend: "python"
input [
  { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] }
]
output [
  { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] }
]
instance_group [{ kind: KIND_CPU }]
"""

# Triton's add_sub example, as a Triton user writes it.
ADD_SUB = """
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.model_config = model_config = json.loads(args["model_config"])
        output0_config = pb_utils.get_output_config_by_name(model_config, "OUTPUT0")
        output1_config = pb_utils.get_output_config_by_name(model_config, "OUTPUT1")
        self.output0_dtype = pb_utils.triton_string_to_numpy(output0_config["data_type"])
        self.output1_dtype = pb_utils.triton_string_to_numpy(output1_config["data_type"])

    def execute(self, requests):
        responses = []
        for request in requests:
            in_0 = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            in_1 = pb_utils.get_input_tensor_by_name(request, "INPUT1")
            out_0 = in_0.as_numpy() + in_1.as_numpy()
            out_1 = in_0.as_numpy() - in_1.as_numpy()
            out_tensor_0 = pb_utils.Tensor("OUTPUT0", out_0.astype(self.output0_dtype))
            out_tensor_1 = pb_utils.Tensor("OUTPUT1", out_1.astype(self.output1_dtype))
            inference_response = pb_utils.InferenceResponse(
                output_tensors=[out_tensor_0, out_tensor_1]
            )
            responses.append(inference_response)
        return responses

    def finalize(self):
        pb_utils.Logger.log_info("add_sub: cleaning up")
"""

BATCH_SIZES_CONFIG = """
backend: "python"
max_batch_size: 8
input [{ name: "X" data_type: TYPE_FP32 dims: [ 1 ] }]
output [
  { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] },
  { name: "N" data_type: TYPE_INT32 dims: [ 1 ] }
]
dynamic_batching { preferred_batch_size: [ 4 ] max_queue_delay_microseconds: 5000000 }
"""

# Answers each request with 2x and the number of requests execute() was given.
BATCH_SIZES = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            n = np.full(x.shape, len(requests), dtype=np.int32)
            tensors = [pb_utils.Tensor("Y", x * 2), pb_utils.Tensor("N", n)]
            out.append(pb_utils.InferenceResponse(tensors))
        return out
"""

INTROSPECT_CONFIG = """
backend: "python"
input [{ name: "DATA" data_type: TYPE_STRING dims: [ -1 ] }]
output [
  { name: "INFO" data_type: TYPE_STRING dims: [ 1 ] },
  { name: "ECHO" data_type: TYPE_STRING dims: [ -1 ] }
]
parameters { key: "custom" value: { string_value: "yes" } }
"""

# Says what it was given (request and initialize args) and echoes its BYTES input.
INTROSPECT = """
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.args = args

    def execute(self, requests):
        responses = []
        for request in requests:
            info = {
                "id": request.request_id(),
                "parameters": json.loads(request.parameters()),
                "outputs": request.requested_output_names(),
                "correlation_id": request.correlation_id(),
                "flags": request.flags(),
                "args": {k: v for k, v in self.args.items() if k != "model_config"},
                "config_parameters": json.loads(self.args["model_config"])["parameters"],
            }
            data = pb_utils.get_input_tensor_by_name(request, "DATA").as_numpy()
            responses.append(
                pb_utils.InferenceResponse(
                    output_tensors=[
                        pb_utils.Tensor("INFO", np.array([json.dumps(info)], dtype=object)),
                        pb_utils.Tensor("ECHO", data),
                    ]
                )
            )
        return responses
"""

SCALAR_INT_CONFIG = """
backend: "python"
input [{ name: "X" data_type: TYPE_INT32 dims: [ 1 ] }]
output [{ name: "Y" data_type: TYPE_INT32 dims: [ 1 ] }]
"""

# X=1: execute raises; X=2: an error response (INVALID_ARG); X=3: TritonModelException.
FAILING = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            if x[0] == 1:
                raise ValueError("x must not be 1")
            if x[0] == 2:
                error = pb_utils.TritonError("x=2 is not allowed", pb_utils.TritonError.INVALID_ARG)
                responses.append(pb_utils.InferenceResponse(error=error))
                continue
            if x[0] == 3:
                raise pb_utils.TritonModelException("three is right out")
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x + 1)]))
        return responses
"""

# The third execution of a worker kills it (SIGKILL, as the OOM killer would).
CRASHER = """
import os
import signal

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.executions = 0

    def execute(self, requests):
        self.executions += 1
        if self.executions == 3:
            os.kill(os.getpid(), signal.SIGKILL)
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x * 10)]))
        return responses
"""

BLS_CONFIG = """
backend: "python"
input [{ name: "X" data_type: TYPE_FP32 dims: [ 1 ] }]
output [
  { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] },
  { name: "SUM" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "ERROR" data_type: TYPE_STRING dims: [ 1 ] }
]
"""

# Calls an ONNX model (half_plus_two), then a Python model (add_sub), then a missing model.
BLS = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            hpt = pb_utils.InferenceRequest(
                model_name="half_plus_two",
                requested_output_names=["y"],
                inputs=[pb_utils.Tensor("x", x.reshape(1, 1))],
            ).exec()
            if hpt.has_error():
                raise pb_utils.TritonModelException(hpt.error().message())
            y = pb_utils.get_output_tensor_by_name(hpt, "y").as_numpy().reshape(1)
            add = pb_utils.InferenceRequest(
                model_name="add_sub",
                requested_output_names=["OUTPUT0"],
                inputs=[
                    pb_utils.Tensor("INPUT0", np.repeat(y, 4)),
                    pb_utils.Tensor("INPUT1", np.arange(4, dtype=np.float32)),
                ],
            ).exec()
            total = pb_utils.get_output_tensor_by_name(add, "OUTPUT0").as_numpy()
            missing = pb_utils.InferenceRequest(
                model_name="no_such_model", requested_output_names=["y"], inputs=[]
            ).exec()
            error = missing.error().message() if missing.has_error() else ""
            responses.append(
                pb_utils.InferenceResponse(
                    [
                        pb_utils.Tensor("Y", y),
                        pb_utils.Tensor("SUM", total),
                        pb_utils.Tensor("ERROR", np.array([error.encode()], dtype=object)),
                    ]
                )
            )
        return responses
"""

BLS_ASYNC_CONFIG = """
backend: "python"
input [{ name: "X" data_type: TYPE_FP32 dims: [ 1 ] }]
output [
  { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] },
  { name: "SUM" data_type: TYPE_FP32 dims: [ 4 ] }
]
"""

# Both calls in flight at once, from an async execute.
BLS_ASYNC = """
import asyncio

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            hpt, add = await asyncio.gather(
                pb_utils.InferenceRequest(
                    model_name="half_plus_two",
                    requested_output_names=["y"],
                    inputs=[pb_utils.Tensor("x", x.reshape(1, 1))],
                ).async_exec(),
                pb_utils.InferenceRequest(
                    model_name="add_sub",
                    requested_output_names=["OUTPUT1"],
                    inputs=[
                        pb_utils.Tensor("INPUT0", np.repeat(x, 4)),
                        pb_utils.Tensor("INPUT1", np.arange(4, dtype=np.float32)),
                    ],
                ).async_exec(),
            )
            y = pb_utils.get_output_tensor_by_name(hpt, "y").as_numpy().reshape(1)
            diff = pb_utils.get_output_tensor_by_name(add, "OUTPUT1").as_numpy()
            tensors = [pb_utils.Tensor("Y", y), pb_utils.Tensor("SUM", diff)]
            responses.append(pb_utils.InferenceResponse(tensors))
        return responses
"""

NATIVE_CONFIG = """
backend: "python"
dynamic_batching { preferred_batch_size: [ 4 ] max_queue_delay_microseconds: 5000000 }
"""

# The native form: whole batches in, the config from the type hints.
NATIVE = """
from typing import Annotated, TypedDict

import numpy as np


class Inputs(TypedDict):
    X: Annotated[np.ndarray, "FP32", [3]]


class Outputs(TypedDict):
    Y: Annotated[np.ndarray, "FP32", [3]]
    ROWS: Annotated[np.ndarray, np.int64, [1]]


class Model:
    max_batch_size = 8

    def load(self):
        self.scale = 3.0

    def infer(self, inputs: Inputs) -> Outputs:
        x = inputs["X"]
        return {"Y": x * self.scale, "ROWS": np.full((len(x), 1), len(x))}
"""

VENV_CONFIG = """
backend: "python"
input [{ name: "X" data_type: TYPE_FP32 dims: [ 1 ] }]
output [{ name: "WHERE" data_type: TYPE_STRING dims: [ 2 ] }]
parameters { key: "EXECUTION_ENV_PATH" value: { string_value: "%s" } }
"""

# Says which Python runs it, and uses a package only its environment has.
VENV_MODEL = """
import sys

import numpy as np
import only_in_venv
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        where = np.array([sys.prefix.encode(), only_in_venv.GREETING.encode()], dtype=object)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("WHERE", where)]) for _ in requests]
"""

FINALIZER_CONFIG = """
backend: "python"
input [{ name: "X" data_type: TYPE_FP32 dims: [ 1 ] }]
output [{ name: "Y" data_type: TYPE_FP32 dims: [ 1 ] }]
parameters { key: "marker" value: { string_value: "%s" } }
"""

# Holds each request until the file ``<marker>.gate`` exists (a minute at most), then answers
# X; finalize() writes how many requests it had answered.
FINALIZER = """
import json
import os
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.marker = config["parameters"]["marker"]["string_value"]
        self.answered = 0

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            deadline = time.monotonic() + 60
            while not os.path.exists(self.marker + ".gate") and time.monotonic() < deadline:
                time.sleep(0.005)
            self.answered += 1
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x)]))
        return responses

    def finalize(self):
        with open(self.marker, "w") as f:
            f.write(f"finalized after {self.answered}")
"""

SWAPPER_CONFIG = """
backend: "python"
input [{ name: "X" data_type: TYPE_FP32 dims: [ 1 ] }]
output [{ name: "VERSION" data_type: TYPE_FP32 dims: [ 1 ] }]
parameters { key: "marker" value: { string_value: "%s" } }
"""

# Answers its version; finalize() leaves a file named after it.
SWAPPER = """
import json

import numpy as np
import triton_python_backend_utils as pb_utils

VERSION = 1.0


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.marker = config["parameters"]["marker"]["string_value"] + "-" + args["model_version"]

    def execute(self, requests):
        version = np.array([VERSION], np.float32)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("VERSION", version)]) for _ in requests]

    def finalize(self):
        open(self.marker, "w").close()
"""

CACHED_CONFIG = """
backend: "python"
max_batch_size: 4
input [{ name: "X" data_type: TYPE_FP32 dims: [ 1 ] }]
output [
  { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] },
  { name: "N" data_type: TYPE_INT32 dims: [ 1 ] }
]
response_cache { enable: true }
model_warmup [{ name: "zeros" batch_size: 1 inputs { key: "X" value: {
  data_type: TYPE_FP32 dims: [ 1 ] zero_data: true } } }]
"""

ECHO_PROCESS_CONFIG = """
backend: "echo"
max_batch_size: 8
input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 2 ] }]
instance_group [{ count: 2 }]
parameters { key: "process_instances" value: { string_value: "true" } }
parameters { key: "request_level" value: { string_value: "true" } }
parameters { key: "log_file" value: { string_value: "%s" } }
"""

ONNX_PROCESS_CONFIG = """
platform: "onnxruntime_onnx"
max_batch_size: 8
parameters { key: "process_instances" value: { string_value: "true" } }
"""


def write_model(root: Path, name: str, config: str, source: str | None) -> None:
    (root / name / "1").mkdir(parents=True)
    (root / name / "config.pbtxt").write_text(f'name: "{name}"\n{config}')
    if source is not None:
        (root / name / "1" / "model.py").write_text(textwrap.dedent(source))


def make_venv(where: Path) -> Path:
    """A venv that sees the system's packages, plus a module only it has (fast: no pip)."""
    subprocess.run(
        [sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(where)],
        check=True,
    )
    (site,) = where.glob("lib/python*/site-packages")
    (site / "only_in_venv.py").write_text('GREETING = "hello from the venv"\n')
    return where


def write_repository(root: Path, demo_repo: Path, venv: Path, marker: Path, log: Path) -> None:
    root.mkdir(parents=True)
    hpt = root / "half_plus_two" / "1"
    hpt.mkdir(parents=True)
    os.link(demo_repo / "half_plus_two" / "1" / "model.onnx", hpt / "model.onnx")
    write_model(root, "add_sub", ADD_SUB_CONFIG, ADD_SUB)
    write_model(root, "batch_sizes", BATCH_SIZES_CONFIG, BATCH_SIZES)
    write_model(root, "introspect", INTROSPECT_CONFIG, INTROSPECT)
    write_model(root, "failing", SCALAR_INT_CONFIG, FAILING)
    write_model(root, "crasher", SCALAR_INT_CONFIG, CRASHER)
    write_model(root, "bls", BLS_CONFIG, BLS)
    write_model(root, "bls_async", BLS_ASYNC_CONFIG, BLS_ASYNC)
    write_model(root, "native", NATIVE_CONFIG, NATIVE)
    (root / "scale" / "1").mkdir(parents=True)  # the docs' native model: no config.pbtxt
    (root / "scale" / "1" / "model.py").write_text(
        docs_block(PYTHON_PAGE, "models/scale/1/model.py")
    )
    write_model(root, "in_venv", VENV_CONFIG % venv, VENV_MODEL)
    write_model(root, "finalizer", FINALIZER_CONFIG % marker, FINALIZER)
    write_model(root, "no_file", SCALAR_INT_CONFIG, None)
    write_model(root, "bad_import", SCALAR_INT_CONFIG, "import not_a_module_anywhere\n")
    write_model(root, "no_class", SCALAR_INT_CONFIG, "def execute(requests):\n    return []\n")
    write_model(root, "echo_proc", ECHO_PROCESS_CONFIG % log, None)
    write_model(root, "swapper", SWAPPER_CONFIG % (marker.parent / "swapper-finalized"), SWAPPER)
    write_model(root, "cached_py", CACHED_CONFIG, BATCH_SIZES)
    (root / "onnx_proc" / "1").mkdir(parents=True)
    os.link(hpt / "model.onnx", root / "onnx_proc" / "1" / "model.onnx")
    (root / "onnx_proc" / "config.pbtxt").write_text('name: "onnx_proc"\n' + ONNX_PROCESS_CONFIG)
