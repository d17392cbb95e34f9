"""What ``inferd tune`` shows: a table of the trials (best level within the budget), the verdict
against the default config, a CSV of every level, and a plot of p99 latency vs throughput."""

from __future__ import annotations

import csv
import importlib.util
import io
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from inferd.tune import choice

if TYPE_CHECKING:
    from inferd.tune.trials import Measured

# Ten strong colours, three line styles and six markers: a style of its own for each of up to
# 30 configs (the default grid has 13 to 25), and no colour pale enough to vanish.
_MARKERS = ("o", "s", "^", "D", "v", "P")
_LINES = ("-", "--", ":")


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


def print_table(
    measured: Sequence[Measured], budget_ms: float | None, tie_pct: float, out: TextIO
) -> None:
    header = ["config", "instances", "dyn. batching", "threads", "conc.", "infer/s", "p99 ms"]
    rows = [_summary(m) for m in measured]
    ranked = sorted(rows[1:], key=lambda r: float(r[5]) if r[5] != "-" else -1.0, reverse=True)
    table = [header, rows[0], *ranked]
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    print(f"best level of each config ({choice.describe(budget_ms, tie_pct)}):", file=out)
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
        f", p99 {winner.best['latency_p99_ms']:.2f} ms"
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

    figure = plot_figure(measured, budget_ms, model)
    figure.savefig(path, dpi=100, bbox_inches="tight")  # the legend sits right of the axes
    plt.close(figure)


def plot_figure(measured: Sequence[Measured], budget_ms: float | None, model: str) -> Any:
    """The figure ``write_plot`` saves: p99 on a log axis, so that one slow outlier does not
    squash the other lines, and each config a colour and marker of its own."""
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(10, 6))
    colours = [plt.get_cmap("tab10")(i) for i in range(10)]
    for index, item in enumerate(measured):
        points: list[tuple[float, float]] = [
            (r["latency_p99_ms"], r["throughput_infer_per_s"])
            for r in item.rows
            if r["latency_p99_ms"] is not None and r["latency_p99_ms"] > 0
        ]
        if points:
            xs, ys = zip(*points, strict=True)
            default = item.trial.label == "default"
            style: dict[str, Any] = {
                "color": "black" if default else colours[index % len(colours)],
                "marker": _MARKERS[index % len(_MARKERS)],
                "linewidth": 2.5 if default else 1.5,
                "linestyle": _LINES[(index // len(colours)) % len(_LINES)],
            }
            axes.plot(xs, ys, label=item.trial.label, **style)
    if budget_ms is not None:
        axes.axvline(
            budget_ms, color="crimson", linewidth=2.5, alpha=0.5, label=f"budget {budget_ms:g} ms"
        )
    axes.set_xscale("log")
    axes.set_xlabel("p99 latency (ms, log scale)")
    axes.set_ylabel("throughput (infer/s)")
    axes.set_title(f"inferd tune: {model}")
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(fontsize="small", ncol=2, loc="center left", bbox_to_anchor=(1.01, 0.5))
    figure.tight_layout()
    return figure
