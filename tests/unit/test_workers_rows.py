"""Requests that travel as one: which may, their rows joined, each one's rows of the answer."""

from __future__ import annotations

import numpy as np

from inferd.backends.work import Work, batch_key, join, split
from inferd.workers import rows


def _work(values: list[float], **parameters: object) -> Work:
    x = np.array([[v, v] for v in values], dtype=np.float32)
    return Work({"x": x}, len(values), ("y",), parameters=dict(parameters))


def test_compatible_requests_share_a_key() -> None:
    a, b = _work([1.0]), _work([2.0, 3.0], binary_data_output=True)
    assert rows.key(a) == rows.key(b) is not None
    other_outputs = Work({"x": a.inputs["x"]}, 1, ("z",))
    other_dtype = Work({"x": a.inputs["x"].astype(np.float64)}, 1, ("y",))
    other_shape = Work({"x": np.ones((1, 3), np.float32)}, 1, ("y",))
    assert len({rows.key(w) for w in (a, other_outputs, other_dtype, other_shape)}) == 4
    assert rows.key(a) == batch_key(a)  # the batcher's own rule: they would share a batch


def test_a_request_with_its_own_scheduling_travels_alone() -> None:
    for name in rows.SCHEDULING:
        assert rows.key(_work([1.0], **{name: 1})) is None
    unbatched = Work({"x": np.ones(2, np.float32)}, 0, ("y",))
    assert rows.key(unbatched) is None
    signed = _work([1.0])
    signed.signature = "serving_default"
    assert rows.key(signed) is None


def test_rows_join_in_order_and_each_gets_its_own_back() -> None:
    works = [_work([1.0]), _work([2.0, 3.0]), _work([4.0])]
    joined = join(works)
    assert joined["x"][:, 0].tolist() == [1.0, 2.0, 3.0, 4.0]
    answer = {"y": joined["x"] * 10}
    parts = split(answer, [w.rows for w in works])
    assert [p["y"][:, 0].tolist() for p in parts] == [[10.0], [20.0, 30.0], [40.0]]
    assert all(p["y"].base is answer["y"] for p in parts)  # views, not copies
