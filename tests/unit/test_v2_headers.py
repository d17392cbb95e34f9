"""Binary v2 headers decoded once (``protocols.v2.headers``): a remembered header's plan reads
the next body's tensors, gives every request its own parameters, and leaves out the headers it
must not keep."""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson

from inferd.protocols.v2 import headers as v2_headers
from inferd.protocols.v2.headers import HeaderPlans
from inferd.protocols.v2.http import decode_request


def _header(**extra: Any) -> tuple[bytes, dict[str, Any]]:
    doc = {
        "inputs": [
            {
                "name": "a",
                "shape": [1, 3],
                "datatype": "FP32",
                "parameters": {"binary_data_size": 12},
            },
            {
                "name": "b",
                "shape": [2],
                "datatype": "INT64",
                "parameters": {"binary_data_size": 16},
            },
        ],
        "parameters": {"binary_data_output": True},
        **extra,
    }
    return orjson.dumps(doc), doc


def _binary(a: list[float], b: list[int]) -> memoryview:
    return memoryview(np.array(a, np.float32).tobytes() + np.array(b, np.int64).tobytes())


def _remembered(**extra: Any) -> tuple[HeaderPlans, bytes]:
    plans = HeaderPlans()
    header, doc = _header(**extra)
    first = decode_request(doc, _binary([1, 2, 3], [4, 5]), "m", "")
    plans.remember(header, doc, first)
    return plans, header


def test_a_remembered_header_reads_the_next_body() -> None:
    plans, header = _remembered()
    plan = plans.get(header)
    assert plan is not None
    request = plan.decode(_binary([7, 8, 9], [-1, 10]), "m", "2")
    assert request is not None
    assert (request.model_name, request.model_version, request.id) == ("m", "2", "")
    assert request.inputs["a"].dtype == np.float32
    assert request.inputs["a"].tolist() == [[7.0, 8.0, 9.0]]
    assert request.inputs["b"].tolist() == [-1, 10]
    assert request.outputs is None
    assert request.parameters == {"binary_data_output": True}
    assert request.input_parameters == {
        "a": {"binary_data_size": 12},
        "b": {"binary_data_size": 16},
    }


def test_each_request_has_its_own_parameters() -> None:
    plans, header = _remembered()
    plan = plans.get(header)
    assert plan is not None
    one = plan.decode(_binary([1, 1, 1], [1, 1]), "m", "")
    assert one is not None
    one.parameters["version_label"] = "canary"  # as the handler of /labels/{l} does
    two = plan.decode(_binary([2, 2, 2], [2, 2]), "m", "")
    assert two is not None
    assert two.parameters == {"binary_data_output": True}


def test_requested_outputs_are_kept() -> None:
    plans, header = _remembered(outputs=[{"name": "y", "parameters": {"binary_data": True}}])
    plan = plans.get(header)
    assert plan is not None
    request = plan.decode(_binary([1, 2, 3], [4, 5]), "m", "")
    assert request is not None
    assert request.outputs is not None
    assert [(o.name, o.parameters) for o in request.outputs] == [("y", {"binary_data": True})]


def test_a_body_of_another_size_takes_the_full_decode() -> None:
    plans, header = _remembered()
    plan = plans.get(header)
    assert plan is not None
    assert plan.decode(memoryview(b"\0" * 27), "m", "") is None
    assert plan.decode(memoryview(b"\0" * 29), "m", "") is None


def test_headers_that_are_not_kept() -> None:
    plans, header = _remembered(id="req-1")  # numbered requests: a new header each time
    assert plans.get(header) is None
    doc = {"inputs": [{"name": "a", "shape": [1], "datatype": "FP32", "data": [1.0]}]}
    header = orjson.dumps(doc)
    plans.remember(header, doc, decode_request(doc, None, "m", ""))  # JSON data
    assert plans.get(header) is None
    assert len(plans) == 0


def test_a_long_header_is_not_kept_and_a_full_table_starts_over(monkeypatch: Any) -> None:
    header, doc = _header(parameters={"binary_data_output": True, "pad": "x" * 5000})
    plans = HeaderPlans()
    plans.remember(header, doc, decode_request(doc, _binary([1, 2, 3], [4, 5]), "m", ""))
    assert len(plans) == 0
    monkeypatch.setattr(v2_headers, "KEPT", 2)
    for i in range(3):
        header, doc = _header(parameters={"n": i})
        plans.remember(header, doc, decode_request(doc, _binary([1, 2, 3], [4, 5]), "m", ""))
    assert len(plans) == 1  # forgotten all at once when full, then the third kept
    assert plans.get(header) is not None
