"""The accuracy check of ``inferd optimize`` (its timing is ``inferd.optimize.speed``): the
original and the optimized model run on the same held-out rows; outputs are compared per output.

Agreement per output: top-1 (argmax over the last axis) for float outputs with more than one
value per row, exact equality for integer and boolean outputs, and for other float outputs the
share of rows within 1 % of the reference's value range (max and mean absolute errors shown).
The model's agreement is its lowest output agreement.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from inferd.optimize.data import Arrays, InputSpec, Rows, feeds

Run = Callable[[Arrays], Arrays]
_CLOSE_FRACTION = 0.01


@dataclass(frozen=True, slots=True)
class OutputAgreement:
    name: str
    kind: str  # "top-1" | "exact" | "within 1%"
    agreement: float
    max_abs_error: float | None = None
    mean_abs_error: float | None = None

    def describe(self) -> str:
        text = f"{self.name}: {self.agreement:.2%} {self.kind}"
        if self.max_abs_error is not None:
            text += f" (max |err| {self.max_abs_error:.3g}, mean {self.mean_abs_error:.3g})"
        return text


@dataclass(frozen=True, slots=True)
class CheckResult:
    rows: int
    outputs: tuple[OutputAgreement, ...]
    accuracy: tuple[float, float] | None  # (original, optimized) on labelled rows
    labelled_rows: int

    @property
    def agreement(self) -> float:
        return min((o.agreement for o in self.outputs), default=1.0)


def run_all(run: Run, rows: Rows, inputs: Sequence[InputSpec], progress: Any) -> Arrays:
    """Every row through ``run``; outputs stacked along the rows."""
    parts: dict[str, list[npt.NDArray[Any]]] = {}
    batching = all(s.batching for s in inputs)
    for feed in feeds(rows, inputs, 32):
        for name, value in run(feed).items():
            parts.setdefault(name, []).append(value if batching else value[None, ...])
        progress.update(len(next(iter(feed.values()))) if batching else 1)
    return {name: np.concatenate(values) for name, values in parts.items()}


def compare(reference: Arrays, candidate: Arrays) -> tuple[OutputAgreement, ...]:
    return tuple(_compare_one(name, reference[name], candidate[name]) for name in reference)


def _compare_one(name: str, ref: npt.NDArray[Any], got: npt.NDArray[Any]) -> OutputAgreement:
    rows = len(ref)
    if ref.dtype.kind in "iub":
        equal = (ref.reshape(rows, -1) == got.reshape(rows, -1)).all(axis=1)
        return OutputAgreement(name, "exact", float(equal.mean()))
    ref64 = ref.astype(np.float64)
    got64 = got.astype(np.float64)
    errors = np.abs(ref64 - got64)
    max_err, mean_err = float(errors.max(initial=0.0)), float(errors.mean()) if errors.size else 0.0
    if ref.ndim >= 2 and ref.shape[-1] > 1:
        same = ref64.argmax(axis=-1) == got64.argmax(axis=-1)
        return OutputAgreement(name, "top-1", float(same.mean()), max_err, mean_err)
    span = float(np.ptp(ref64)) if ref64.size else 0.0
    tolerance = _CLOSE_FRACTION * max(span, 1e-12)
    close = (errors.reshape(rows, -1) <= tolerance).all(axis=1)
    return OutputAgreement(name, "within 1%", float(close.mean()), max_err, mean_err)


def predictions(outputs: Arrays) -> npt.NDArray[Any] | None:
    """Class predictions, for the accuracy against labels: the first integer output of one
    value per row, else the argmax of the first float output with several values per row."""
    for value in outputs.values():
        if value.dtype.kind in "iu" and value.reshape(len(value), -1).shape[1] == 1:
            return value.reshape(len(value))
    for value in outputs.values():
        if value.dtype.kind == "f" and value.ndim == 2 and value.shape[1] > 1:
            found: npt.NDArray[Any] = value.argmax(axis=1)
            return found
    return None


def accuracy(
    reference: Arrays, candidate: Arrays, labels: npt.NDArray[Any] | None
) -> tuple[float, float] | None:
    if labels is None or not len(labels):
        return None
    ref, got = predictions(reference), predictions(candidate)
    if ref is None or got is None:
        return None
    n = len(labels)
    truth = labels.reshape(n)
    return float((ref[:n] == truth).mean()), float((got[:n] == truth).mean())


def batch_of(rows: Rows, size: int) -> Arrays:
    """``size`` rows (repeating the rows when there are fewer)."""
    count = len(rows)
    index = np.arange(size) % count
    return {k: np.ascontiguousarray(v[index]) for k, v in rows.arrays.items()}
