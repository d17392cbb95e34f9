"""What ``inferd tune`` shows: a table of the trials (best level within the budget), the verdict
against the default config, a CSV of every level, and a plot of p99 latency vs throughput."""

from __future__ import annotations

import csv
import importlib.util
import io
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

if TYPE_CHECKING:
    from inferd.tune.trials import Measured


def _summary(item: Measured) -> list[str]:
    described = item.trial.describe()
    best = item.best
    return [
        str(described["trial"]),
        str(described["instances"]),
        str(described["dynamic_batching"]),
        str(described["threads"]),
        str(best["concurrency"]) if best else "-",
        f"{best['throughput_infer_per_s']:.1f}" if best else "-",
        f"{best['latency_p99_ms']:.2f}" if best else "-",
    ]


def print_table(measured: Sequence[Measured], budget_ms: float | None, out: TextIO) -> None:
    header = ["config", "instances", "dyn. batching", "threads", "conc.", "infer/s", "p99 ms"]
    rows = [_summary(m) for m in measured]
    ranked = sorted(rows[1:], key=lambda r: float(r[5]) if r[5] != "-" else -1.0, reverse=True)
    table = [header, rows[0], *ranked]
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    budget = f"p99 <= {budget_ms:g} ms" if budget_ms is not None else "no latency budget"
    print(f"best level of each config ({budget}):", file=out)
    for row in table:
        cells = [row[0].ljust(widths[0])] + [
            c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True)
        ]
        print("  ".join(cells), file=out)


def print_verdict(
    default: Measured, winner: Measured, budget_ms: float | None, out_dir: Path, out: TextIO
) -> None:
    assert winner.best is not None
    rate = winner.best["throughput_infer_per_s"]
    described = winner.trial.describe()
    line = (
        f"best: {winner.trial.label} ({described['instances']} instance(s), dynamic batching "
        f"{described['dynamic_batching']}, threads {described['threads']}): {rate:.1f} infer/s"
    )
    if default.best is not None and default.best["throughput_infer_per_s"] > 0:
        base = default.best["throughput_infer_per_s"]
        line += f" vs default {base:.1f} infer/s ({(rate / base - 1) * 100:+.1f}%)"
    else:
        line += " (the default config does not meet the budget)"
    if budget_ms is not None:
        line += f" at p99 <= {budget_ms:g} ms"
    print(line, file=out)
    print(f"wrote {out_dir / 'config.pbtxt'}", file=out)


def write_csv(path: Path, measured: Sequence[Measured]) -> None:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    columns = ["concurrency", "throughput_infer_per_s", "latency_p99_ms", "errors"]
    writer.writerow(["config", "instances", "dynamic_batching", "threads", *columns])
    for item in measured:
        described = item.trial.describe()
        fixed = [described[k] for k in ("trial", "instances", "dynamic_batching", "threads")]
        for row in item.rows:
            writer.writerow(fixed + [row.get(c) for c in columns])
    path.write_text(out.getvalue(), encoding="utf-8")


def can_plot() -> bool:
    return importlib.util.find_spec("matplotlib") is not None


def write_plot(
    path: Path, measured: Sequence[Measured], budget_ms: float | None, model: str
) -> None:
    """Model Analyzer's chart: p99 latency (x) against throughput (y), one line per config."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(9, 5.5))
    for item in measured:
        points: list[tuple[float, float]] = [
            (r["latency_p99_ms"], r["throughput_infer_per_s"])
            for r in item.rows
            if r["latency_p99_ms"] is not None
        ]
        if points:
            xs, ys = zip(*points, strict=True)
            style: dict[str, Any] = {"linewidth": 2.5} if item.trial.label == "default" else {}
            axes.plot(xs, ys, marker="o", label=item.trial.label, **style)
    if budget_ms is not None:
        axes.axvline(budget_ms, color="red", linestyle="--", label=f"budget {budget_ms:g} ms")
    axes.set_xlabel("p99 latency (ms)")
    axes.set_ylabel("throughput (infer/s)")
    axes.set_title(f"inferd tune: {model}")
    axes.grid(True, alpha=0.3)
    axes.legend(fontsize="small", ncol=2)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
