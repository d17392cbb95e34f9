"""The sequence batcher with unmodified tritonclient: an ONNX accumulator whose running sum is
implicit state kept by the server, 4 sequences of 10 requests interleaved under ``direct`` and
``oldest`` (HTTP and gRPC), control inputs as the model sees them, unknown and idle sequences."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import tritonclient.grpc.aio as grpc_aio
import tritonclient.http as triton_http
import tritonclient.http.aio as http_aio
from onnx import TensorProto, helper
from tritonclient.utils import InferenceServerException

from tests.support import ServerProcess

CONTROLS = """
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START fp32_false_true: [ 0, 1 ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] },
    { name: "END" control [ { kind: CONTROL_SEQUENCE_END bool_false_true: [ false, true ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }
  ]
  state [ {
    input_name: "STATE_IN" output_name: "STATE_OUT" data_type: TYPE_FP32 dims: [ 1 ]
    initial_state: { data_type: TYPE_FP32 dims: [ 1 ] zero_data: true name: "zeros" }
  } ]
"""
IO = """
input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_FP32 dims: [ 1 ] },
         { name: "SEEN" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""
CONFIGS = {
    "acc_direct": f"""max_batch_size: 4
{IO}
instance_group [ {{ count: 2 kind: KIND_CPU }} ]
sequence_batching {{
  direct {{ max_queue_delay_microseconds: 2000 minimum_slot_utilization: 1.0 }}
  {CONTROLS}
}}""",
    "acc_oldest": f"""max_batch_size: 4
{IO}
sequence_batching {{
  oldest {{ max_candidate_sequences: 4 preferred_batch_size: [ 4 ]
           max_queue_delay_microseconds: 2000 }}
  {CONTROLS}
}}""",
    "acc_idle": f"""max_batch_size: 1
{IO}
sequence_batching {{
  max_sequence_idle_microseconds: 300000
  {CONTROLS.replace("TYPE_UINT64", "TYPE_STRING")}
}}""",
}


PY_CONFIG = """
backend: "python"
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "CORR" data_type: TYPE_INT64 dims: [ 1 ] },
         { name: "FLAGS" data_type: TYPE_INT32 dims: [ 1 ] } ]
sequence_batching { }
"""
PY_ACC_CONFIG = """
backend: "python"
input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "SUM" data_type: TYPE_FP32 dims: [ 1 ] } ]
sequence_batching {
  state [ { input_name: "ACC_IN" output_name: "ACC_OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
}
"""
PY_ACC = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for r in requests:
            total = (pb_utils.get_input_tensor_by_name(r, "ACC_IN").as_numpy()
                     + pb_utils.get_input_tensor_by_name(r, "X").as_numpy())
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("SUM", total), pb_utils.Tensor("ACC_OUT", total)]))
        return responses
"""
PY_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [
            pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("CORR", np.array([r.correlation_id()], dtype=np.int64)),
                pb_utils.Tensor("FLAGS", np.array([r.flags()], dtype=np.int32)),
            ])
            for r in requests
        ]
"""


def _accumulator(path: Path, batch: str, corr_type: int) -> None:
    """STATE_OUT = STATE_IN * (1 - START) + INPUT; OUTPUT = STATE_OUT;
    SEEN = [START, READY, END, CORRID or its length] as the model received them."""
    f = TensorProto.FLOAT
    corr_as_float = (
        [helper.make_node("Cast", ["CORRID"], ["corr_f"], to=f)]
        if corr_type != TensorProto.STRING
        else [
            helper.make_node("Constant", [], ["forty_two"], value_float=42.0),
            helper.make_node("Shape", ["START"], ["shape"]),
            helper.make_node("Expand", ["forty_two", "shape"], ["corr_f"]),
        ]
    )
    nodes = [
        helper.make_node("Constant", [], ["one"], value_float=1.0),
        helper.make_node("Sub", ["one", "START"], ["keep"]),
        helper.make_node("Mul", ["STATE_IN", "keep"], ["carried"]),
        helper.make_node("Add", ["carried", "INPUT"], ["STATE_OUT"]),
        helper.make_node("Identity", ["STATE_OUT"], ["OUTPUT"]),
        helper.make_node("Cast", ["READY"], ["ready_f"], to=f),
        helper.make_node("Cast", ["END"], ["end_f"], to=f),
        *corr_as_float,
        helper.make_node("Concat", ["START", "ready_f", "end_f", "corr_f"], ["SEEN"], axis=1),
    ]
    shape: list[str | int | None] = [batch, 1]
    graph = helper.make_graph(
        nodes,
        "accumulator",
        [
            helper.make_tensor_value_info("INPUT", f, shape),
            helper.make_tensor_value_info("STATE_IN", f, shape),
            helper.make_tensor_value_info("START", f, shape),
            helper.make_tensor_value_info("READY", TensorProto.INT32, shape),
            helper.make_tensor_value_info("END", TensorProto.BOOL, shape),
            helper.make_tensor_value_info("CORRID", corr_type, shape),
        ],
        [
            helper.make_tensor_value_info("OUTPUT", f, shape),
            helper.make_tensor_value_info("STATE_OUT", f, shape),
            helper.make_tensor_value_info("SEEN", f, [batch, 4]),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    path.mkdir(parents=True)
    onnx.save(model, str(path / "model.onnx"))


@pytest.fixture(scope="module")
def sequences(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("sequence") / "models"
    for name, config in CONFIGS.items():
        corr = TensorProto.UINT64 if name != "acc_idle" else TensorProto.STRING
        _accumulator(root / name / "1", "N", corr)
        (root / name / "config.pbtxt").write_text(f'name: "{name}"\n{config}\n')
    (root / "py_seq" / "1").mkdir(parents=True)
    (root / "py_seq" / "1" / "model.py").write_text(PY_MODEL)
    (root / "py_seq" / "config.pbtxt").write_text(f'name: "py_seq"\n{PY_CONFIG}')
    (root / "py_acc" / "1").mkdir(parents=True)
    (root / "py_acc" / "1" / "model.py").write_text(PY_ACC)
    (root / "py_acc" / "config.pbtxt").write_text(f'name: "py_acc"\n{PY_ACC_CONFIG}')
    server = ServerProcess(root).start()
    yield server
    server.stop()


def _x(module: Any, value: float, shape: list[int]) -> Any:
    tensor = module.InferInput("INPUT", shape, "FP32")
    tensor.set_data_from_numpy(np.full(shape, value, dtype=np.float32))
    return tensor


async def _interleaved(client: Any, module: Any, model: str, base: int) -> dict[int, list[Any]]:
    """4 sequences, 10 requests each (values 1..10), each step sent to all 4 at once."""
    ids = [base + i for i in range(4)]
    seen: dict[int, list[Any]] = {i: [] for i in ids}
    for step in range(1, 11):
        calls = [
            client.infer(
                model,
                [_x(module, step * (1 + k), [1, 1])],
                sequence_id=corr,
                sequence_start=step == 1,
                sequence_end=step == 10,
            )
            for k, corr in enumerate(ids)
        ]
        for corr, result in zip(ids, await asyncio.gather(*calls), strict=True):
            seen[corr].append((result.as_numpy("OUTPUT")[0, 0], result.as_numpy("SEEN")[0]))
    return seen


@pytest.mark.parametrize("model", ["acc_direct", "acc_oldest"])
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_interleaved_sequences_accumulate(
    sequences: ServerProcess, model: str, protocol: str
) -> None:
    async def run() -> dict[int, list[Any]]:
        if protocol == "http":
            client: Any = http_aio.InferenceServerClient(sequences.http_address)
            module: Any = http_aio
        else:
            client, module = grpc_aio.InferenceServerClient(sequences.grpc_address), grpc_aio
        try:
            return await _interleaved(client, module, model, 1000 if protocol == "http" else 2000)
        finally:
            await client.close()

    seen = asyncio.run(run())
    for k, (corr, answers) in enumerate(sorted(seen.items())):
        sums = [float(total) for total, _ in answers]
        assert sums == [(1 + k) * s * (s + 1) / 2 for s in range(1, 11)]
        assert answers[0][1].tolist() == [1.0, 1.0, 0.0, float(corr)]  # START, READY, CORRID
        assert answers[4][1].tolist() == [0.0, 1.0, 0.0, float(corr)]
        assert answers[9][1].tolist() == [0.0, 1.0, 1.0, float(corr)]  # END
    stats = triton_http.InferenceServerClient(sequences.http_address).get_inference_statistics(
        model
    )["model_stats"][0]
    assert stats["inference_count"] >= 40
    assert stats["execution_count"] <= stats["inference_count"]


def test_unknown_ended_and_idle_sequences(sequences: ServerProcess) -> None:
    client = triton_http.InferenceServerClient(sequences.http_address)
    x = _x(triton_http, 2.0, [1, 1])
    with pytest.raises(InferenceServerException, match="must specify the START flag") as info:
        client.infer("acc_idle", [x], sequence_id="never-started")
    assert info.value.status() == "400"
    with pytest.raises(InferenceServerException, match="non-zero 'sequence_id'"):
        client.infer("acc_idle", [x])
    # String ids (CORRID as TYPE_STRING here); an ended sequence is gone.
    first = client.infer("acc_idle", [x], sequence_id="s-1", sequence_start=True)
    assert first.as_numpy("OUTPUT").tolist() == [[2.0]]
    assert first.as_numpy("SEEN").tolist() == [[1.0, 1.0, 0.0, 42.0]]
    last = client.infer("acc_idle", [x], sequence_id="s-1", sequence_end=True)
    assert last.as_numpy("OUTPUT").tolist() == [[4.0]]
    with pytest.raises(InferenceServerException, match="must specify the START flag"):
        client.infer("acc_idle", [x], sequence_id="s-1")
    # A sequence idle past max_sequence_idle_microseconds (0.3 s) is released.
    client.infer("acc_idle", [x], sequence_id="s-2", sequence_start=True)
    time.sleep(1.0)
    with pytest.raises(InferenceServerException, match="released after more than 300000"):
        client.infer("acc_idle", [x], sequence_id="s-2")
    # Started again, it begins from the initial state.
    again = client.infer("acc_idle", [x], sequence_id="s-2", sequence_start=True)
    assert again.as_numpy("OUTPUT").tolist() == [[2.0]]
    with pytest.raises(InferenceServerException, match="numeric sequence_id"):
        client.infer(
            "acc_direct", [_x(triton_http, 1.0, [1, 1])], sequence_id="x", sequence_start=True
        )


def test_python_models_see_the_sequence(sequences: ServerProcess) -> None:
    client = triton_http.InferenceServerClient(sequences.http_address)
    x = triton_http.InferInput("X", [1], "FP32")
    x.set_data_from_numpy(np.array([1.0], dtype=np.float32))
    seen = []
    for start, end in ((True, False), (False, False), (False, True)):
        result = client.infer("py_seq", [x], sequence_id=77, sequence_start=start, sequence_end=end)
        seen.append((result.as_numpy("CORR").tolist(), result.as_numpy("FLAGS").tolist()))
    assert seen == [([77], [1]), ([77], [0]), ([77], [2])]  # SEQUENCE_START = 1, END = 2


def test_python_models_get_implicit_state(sequences: ServerProcess) -> None:
    client = triton_http.InferenceServerClient(sequences.http_address)
    x = triton_http.InferInput("X", [1], "FP32")
    sums = []
    for step in range(1, 5):
        x.set_data_from_numpy(np.array([float(step)], dtype=np.float32))
        result = client.infer(
            "py_acc", [x], sequence_id="py", sequence_start=step == 1, sequence_end=step == 4
        )
        sums.append(result.as_numpy("SUM").tolist())
        assert result.as_numpy("ACC_OUT") is None  # state stays on the server
    assert sums == [[1.0], [3.0], [6.0], [10.0]]
