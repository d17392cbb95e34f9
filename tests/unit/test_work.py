"""The request-level seam: BatchExecutor concatenates, checks and splits inside the instance."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from inferd.backends.work import (
    CANCELLED,
    BatchExecutor,
    InstanceFailed,
    Runtime,
    Work,
    check_rows,
    give_up_inputs,
    run_live,
)
from inferd.core.errors import InternalError, InvalidInput
from inferd.core.types import Handover, Tensors
from tests.echo_support import ok


class Double(Runtime):
    inline = True

    def __init__(self) -> None:
        self.seen: list[int] = []

    def execute(self, inputs: Tensors, output_names: Sequence[str]) -> Tensors:
        self.seen.append(len(inputs["x"]))
        return {"y": inputs["x"] * 2}

    def close(self) -> None:
        pass


def _work(*values: float, id: str = "") -> Work:
    x = np.asarray(values, np.float32).reshape(-1, 1)
    return Work({"x": x}, len(values), ("y",), id)


def test_a_batch_is_concatenated_once_and_split_per_request() -> None:
    runtime = Double()
    executor = BatchExecutor("m", runtime)
    executed = executor.execute([_work(1, 2), _work(3), _work(4, 5, 6)])
    assert runtime.seen == [6]
    assert [ok(r)["y"].ravel().tolist() for r in executed.results] == [[2, 4], [6], [8, 10, 12]]
    assert executed.infer_ns > 0 and executed.input_ns > 0
    assert executor.inline is True


def test_one_request_is_not_copied() -> None:
    work = _work(1, 2)
    executed = BatchExecutor("m", Double()).execute([work])
    (result,) = executed.results
    assert ok(result)["y"].ravel().tolist() == [2, 4]
    assert executed.input_ns == 0


def test_a_wrong_output_batch_size_fails_every_request_of_the_batch() -> None:
    class Short(Double):
        def execute(self, inputs: Tensors, output_names: Sequence[str]) -> Tensors:
            return {"y": inputs["x"][:1]}

    executed = BatchExecutor("m", Short()).execute([_work(1, 2), _work(3)])
    assert all(isinstance(r, InternalError) for r in executed.results)
    assert "returned output 'y' with batch size 1 for a batch of 3 rows" in str(executed.results[0])
    with pytest.raises(InternalError, match="a scalar"):
        check_rows("m", {"y": np.array(1, np.float32)}, 1)


def test_a_backend_exception_becomes_an_error_per_request_and_a_crash_propagates() -> None:
    class Broken(Double):
        def execute(self, inputs: Tensors, output_names: Sequence[str]) -> Tensors:
            raise ValueError("boom")

    executed = BatchExecutor("m", Broken()).execute([_work(1)])
    assert isinstance(executed.results[0], InternalError)
    assert executed.results[0].message == "model 'm' failed: boom"

    class Crashing(Double):
        def execute(self, inputs: Tensors, output_names: Sequence[str]) -> Tensors:
            raise InstanceFailed("gone")

    with pytest.raises(InstanceFailed):
        BatchExecutor("m", Crashing()).execute([_work(1)])


def test_cancelled_work_is_skipped_and_answered_cancelled() -> None:
    runtime = Double()
    executor = BatchExecutor("m", runtime)
    first, gone, last = _work(1), _work(2), _work(3)
    gone.cancelled = True
    executed = run_live(executor, [first, gone, last])
    assert executed is not None
    assert runtime.seen == [2]
    assert executed.results[1] is CANCELLED
    assert [ok(r)["y"].ravel().tolist() for r in (executed.results[0], executed.results[2])] == [
        [2],
        [6],
    ]
    first.cancelled = last.cancelled = True
    assert run_live(executor, [first, gone, last]) is None


class RefusesNegatives(Runtime):
    """A runtime that refuses bad input for the whole batch it is given."""

    inline = True

    def execute(self, inputs: Tensors, output_names: Sequence[str]) -> Tensors:
        if (inputs["x"] < 0).any():
            raise InvalidInput("x must not be negative")
        return {"y": inputs["x"] * 2}

    def close(self) -> None:
        pass


def test_a_batch_refused_as_bad_input_fails_only_the_culprit() -> None:
    executed = BatchExecutor("m", RefusesNegatives()).execute(
        [_work(1.0, id="a"), _work(-1.0, id="b"), _work(3.0, id="c")]
    )
    first, second, third = executed.results
    assert isinstance(second, InvalidInput) and second.message == "x must not be negative"
    assert isinstance(first, dict) and first["y"].ravel().tolist() == [2.0]
    assert isinstance(third, dict) and third["y"].ravel().tolist() == [6.0]


class Signatures(Double):
    def execute_signature(
        self, signature: str, inputs: Tensors, output_names: Sequence[str]
    ) -> Tensors:
        return {"y": inputs["x"] + float(len(signature))}


def test_a_work_runs_its_signature() -> None:
    work = _work(1.0)
    work.signature = "abc"
    (result,) = BatchExecutor("m", Signatures()).execute([work]).results
    assert isinstance(result, dict) and result["y"].ravel().tolist() == [4.0]


def test_a_request_that_hands_its_inputs_over_gives_up_its_bytearrays() -> None:
    """Once its inputs are in a worker's shared memory, a request with a ``Handover`` empties
    its bytearrays (whoever else refers to them) and is marked taken; bytes stay as they are,
    and a request without one keeps everything."""
    body, other = bytearray(b"x" * 1000), b"y" * 10
    inputs = {"body": np.array([[body, other]], dtype=object)}
    kept = Work(dict(inputs), 0, ())
    give_up_inputs(kept)
    assert len(body) == 1000
    handover = Handover()
    work = Work(inputs, 0, (), handover=handover)
    give_up_inputs(work)
    assert handover.taken and len(body) == 0 and inputs["body"][0, 1] == other
