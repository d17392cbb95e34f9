"""The accuracy check: agreement per output kind, accuracy against labels."""

from __future__ import annotations

import numpy as np

from inferd.optimize import check


def test_top1_agreement_for_scores() -> None:
    ref = np.array([[0.1, 0.9], [0.8, 0.2], [0.4, 0.6], [0.3, 0.7]], dtype=np.float32)
    got = ref.copy()
    got[2] = [0.7, 0.3]
    (result,) = check.compare({"scores": ref}, {"scores": got})
    assert result.kind == "top-1" and result.agreement == 0.75
    assert result.max_abs_error is not None and np.isclose(result.max_abs_error, 0.3)
    assert result.describe().startswith("scores: 75.00% top-1 (max |err| 0.3")


def test_exact_agreement_for_integers() -> None:
    (result,) = check.compare({"label": np.array([1, 2, 3, 4])}, {"label": np.array([1, 2, 0, 4])})
    assert (result.kind, result.agreement, result.max_abs_error) == ("exact", 0.75, None)


def test_regression_outputs_within_one_percent_of_the_range() -> None:
    ref = np.linspace(0, 100, 10, dtype=np.float32).reshape(10, 1)
    got = ref + np.array([0.5] * 9 + [2.0], dtype=np.float32).reshape(10, 1)
    (result,) = check.compare({"y": ref}, {"y": got})
    assert result.kind == "within 1%" and result.agreement == 0.9
    assert result.max_abs_error == 2.0


def test_overall_agreement_is_the_lowest_output() -> None:
    outputs = (
        check.OutputAgreement("a", "exact", 1.0),
        check.OutputAgreement("b", "top-1", 0.97),
    )
    assert check.CheckResult(10, outputs, None, 0).agreement == 0.97


def test_accuracy_against_labels() -> None:
    ref = {"label": np.array([0, 1, 2, 3]), "p": np.zeros((4, 4), dtype=np.float32)}
    got = {"label": np.array([0, 1, 2, 0]), "p": np.zeros((4, 4), dtype=np.float32)}
    assert check.accuracy(ref, got, np.array([0, 1, 2, 2])) == (0.75, 0.75)
    scores = {"s": np.eye(3, dtype=np.float32)}
    assert check.accuracy(scores, scores, np.array([0, 1, 0])) == (2 / 3, 2 / 3)
    assert check.accuracy(scores, scores, None) is None


def test_batch_of_repeats_rows() -> None:
    rows = check.Rows({"x": np.arange(3, dtype=np.float32).reshape(3, 1)})
    assert check.batch_of(rows, 5)["x"].ravel().tolist() == [0, 1, 2, 0, 1]
