"""The steps every format's ``inferd optimize`` flow shares: options, rows for calibration and
the check, the check itself, latency figures, and the refusal when agreement is too low."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from inferd.optimize import check, data, speed
from inferd.optimize.data import InputSpec, Rows

_SEED = 0


class Refused(Exception):
    """The optimized copy is not written: one line on stderr, exit status 2."""


@dataclass(frozen=True, slots=True)
class Options:
    model_dir: Path
    int8: str | None  # None | "auto" | "dynamic" | "static"
    fp16: bool
    calibration: Path | None
    calibration_rows: int
    check_rows: int
    ranges: tuple[tuple[str, float, float], ...]
    source_version: int | None
    as_version: int | None
    min_agreement: float
    latency_runs: int
    reduce_range: bool
    max_fp32_nodes: int
    progress: bool
    report: Path | None
    allow_slower: bool = False  # write a copy measured slower than the original


@dataclass(slots=True)
class Result:
    model: str
    source_version: int
    version: int
    method: str
    notes: dict[str, str] = field(default_factory=dict)
    result: check.CheckResult | None = None
    check_sources: list[str] = field(default_factory=list)
    sizes_bytes: tuple[int, int] = (0, 0)
    timings: dict[int, speed.Timing] = field(default_factory=dict)  # batch size -> both models


def split_rows(
    options: Options,
    inputs: list[InputSpec],
    model_folder: Path,
    calibrate: bool,
) -> tuple[Rows | None, Rows]:
    """Calibration rows (None when not calibrating) and held-out check rows."""
    rng = np.random.default_rng(_SEED)
    pool = Rows({})
    if options.calibration is not None:
        pool = data.load_npz(options.calibration, inputs)
    elif (model_folder / data.SAMPLE_FILE).is_file():
        pool = data.load_sample_json(model_folder / data.SAMPLE_FILE, inputs)
    ranges = data.input_ranges(inputs, options.ranges, pool)
    calibration: Rows | None = None
    used = 0
    if calibrate:
        # keep at least a quarter of the data's rows for the check
        used = min(options.calibration_rows, len(pool) - len(pool) // 4)
        calibration = pool.take(0, used)
        missing = options.calibration_rows - used
        if missing > 0:
            calibration = data.concat(calibration, data.random_rows(inputs, ranges, missing, rng))
    held_out = pool.take(used, used + options.check_rows) if len(pool) else pool
    if len(held_out):
        held_out.sources = [f"{len(held_out)} held-out rows of {pool.sources[0].split(' of ')[-1]}"]
    missing = options.check_rows - len(held_out)
    if missing > 0:
        held_out = data.concat(held_out, data.random_rows(inputs, ranges, missing, rng))
    return calibration, held_out


def progress_bar(enabled: bool, total: int, description: str) -> Any:
    if enabled:
        try:
            from tqdm import tqdm

            return tqdm(total=total, desc=description, unit="row", file=sys.stderr, leave=False)
        except ImportError:
            pass
    return _Silent()


class _Silent:
    def update(self, count: int) -> None:
        pass

    def close(self) -> None:
        pass


def run_check(
    options: Options,
    original: check.Run,
    optimized: check.Run,
    rows: Rows,
    inputs: list[InputSpec],
) -> check.CheckResult:
    bar = progress_bar(options.progress, 2 * len(rows), "accuracy check")
    try:
        reference = check.run_all(original, rows, inputs, bar)
        candidate = check.run_all(optimized, rows, inputs, bar)
    finally:
        bar.close()
    labels = rows.labels
    return check.CheckResult(
        rows=len(rows),
        outputs=check.compare(reference, candidate),
        accuracy=check.accuracy(reference, candidate, labels),
        labelled_rows=0 if labels is None else len(labels),
    )


def enforce(options: Options, result: check.CheckResult, model: str) -> None:
    if result.agreement < options.min_agreement:
        details = "; ".join(o.describe() for o in result.outputs)
        raise Refused(
            f"model {model}: agreement {result.agreement:.2%} with the original is below "
            f"--min-agreement {options.min_agreement:.2%} on {result.rows} held-out rows "
            f"({details}); nothing written"
        )


def measure_latency(
    options: Options,
    original: check.Run,
    optimized: check.Run,
    rows: Rows,
    inputs: list[InputSpec],
    max_batch_size: int,
    model: str,
) -> dict[int, speed.Timing]:
    """Both models timed at batch 1 and 32 (or the model's largest); a copy slower at either is
    refused (nothing written) unless ``--allow-slower``."""
    batching = all(s.batching for s in inputs)
    sizes = sorted({1, min(32, max_batch_size) if max_batch_size > 0 else 32}) if batching else [1]
    timings = {}
    for size in sizes:
        feed = check.batch_of(rows, size) if batching else {k: v[0] for k, v in rows.arrays.items()}
        timings[size] = speed.compare(original, optimized, feed, options.latency_runs)
    slower = speed.slower_at(timings)
    if slower and not options.allow_slower:
        raise Refused(
            f"model {model}: the optimized copy is slower than the original: "
            + ", ".join(timings[b].describe(b) for b in slower)
            + "; nothing written (--allow-slower writes it anyway)"
        )
    return timings


def folder_bytes(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
