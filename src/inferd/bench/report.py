"""The results: a table on stdout, CSV and JSON with one row per level, and a PNG plot.

Missing values (no server statistics, no successful request, the other mode's level
column) are ``n/a`` in the table and the CSV, and ``null`` in JSON.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

import orjson

from inferd.bench.measure import columns
from inferd.bench.options import BenchError, BenchOptions
from inferd.install import install_hint
from inferd.version import __version__

NA = "n/a"


def cell(value: Any) -> str:
    if value is None:
        return NA
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def write_csv(path: Path, rows: Sequence[dict[str, Any]], percentile: int | None) -> None:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    names = columns(percentile)
    writer.writerow(names)
    writer.writerows([cell(row.get(n)) for n in names] for row in rows)
    _write(path, out.getvalue().encode())


def write_json(
    path: Path, rows: Sequence[dict[str, Any]], options: BenchOptions, encoding: str
) -> None:
    doc = {
        "tool": f"inferd bench {__version__}",
        "model": options.model,
        "model_version": options.version,
        "protocol": options.protocol,
        "service_kind": options.service_kind,
        "encoding": encoding,
        "batch_size": options.batch_size,
        "measurement_interval_ms": round(options.measurement_interval_s * 1000),
        "percentile": options.percentile,
        "processes": options.processes,
        "columns": list(columns(options.percentile)),
        "rows": list(rows),
    }
    _write(path, orjson.dumps(doc, option=orjson.OPT_INDENT_2) + b"\n")


def _write(path: Path, data: bytes) -> None:
    try:
        path.write_bytes(data)
    except OSError as exc:
        raise BenchError(f"cannot write {path}: {exc.strerror or exc}") from None


def _ms(value: Any) -> str:
    return NA if value is None else f"{value:.3f}" if value < 10 else f"{value:.1f}"


def print_table(
    rows: Sequence[dict[str, Any]], options: BenchOptions, out: TextIO, encoding: str
) -> None:
    rate_mode = bool(options.request_rates)
    several = len({r["server"] for r in rows}) > 1
    pct = options.percentile
    table: list[tuple[str, Any]] = []
    if several:
        table.append(("server", lambda r: r["server"]))
    if rate_mode:
        table += [
            ("rate/s", lambda r: f"{r['request_rate']:g}"),
            ("sent/s", lambda r: f"{r['achieved_request_rate']:.1f}"),
            ("dev %", lambda r: f"{r['request_rate_deviation_pct']:+.1f}"),
        ]
    else:
        table.append(("concurrency", lambda r: str(r["concurrency"])))
    table += [
        ("infer/s", lambda r: f"{r['throughput_infer_per_s']:.1f}"),
        ("avg ms", lambda r: _ms(r["latency_avg_ms"])),
        ("p50 ms", lambda r: _ms(r["latency_p50_ms"])),
        ("p90 ms", lambda r: _ms(r["latency_p90_ms"])),
        ("p95 ms", lambda r: _ms(r["latency_p95_ms"])),
        ("p99 ms", lambda r: _ms(r["latency_p99_ms"])),
    ]
    if pct is not None and pct not in (50, 90, 95, 99):
        table.append((f"p{pct} ms", lambda r: _ms(r[f"latency_p{pct}_ms"])))
    table += [
        ("errors", lambda r: str(r["errors"])),
        ("queue us", lambda r: cell(r["server_queue_us"])),
        ("compute us", lambda r: cell(r["server_compute_us"])),
        (
            "client cpu %",
            lambda r: f"{r['client_cpu_pct']:.0f}" + ("!" if r["client_cpu_saturated"] else ""),
        ),
        ("stable", lambda r: "yes" if r["stable"] else f"no ({r['windows']} windows)"),
    ]
    cells = [[h for h, _ in table], *([f(r) for _, f in table] for r in rows)]
    widths = [max(len(c[i]) for c in cells) for i in range(len(table))]
    servers = ", ".join(t.label for t in options.targets)
    print(
        f"\n{options.model} on {servers}: {encoding}, batch {options.batch_size}, "
        f"{options.processes} generator process(es)",
        file=out,
    )
    for line in cells:
        justified = [
            c.ljust(w) if several and i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(line, widths, strict=True))
        ]
        print("  ".join(justified), file=out)
    if any(r["client_cpu_saturated"] for r in rows):
        print(
            "! the load generator used over 90 % of a core per process at these levels: "
            "its own CPU may cap the figures; raise --processes",
            file=out,
        )


def write_plot(path: Path, rows: Sequence[dict[str, Any]], options: BenchOptions) -> None:
    """Latency (p50 and the chosen percentile) against throughput; p99 against the load."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.ticker import MaxNLocator
    except ImportError:
        raise BenchError(f"--plot needs matplotlib: {install_hint('bench')}") from None
    pct = options.percentile or 99
    rate_mode = bool(options.request_rates)
    figure = Figure(figsize=(12, 4.8), layout="constrained")
    FigureCanvasAgg(figure)
    left, right = figure.subplots(1, 2)
    for server in dict.fromkeys(r["server"] for r in rows):
        mine = [r for r in rows if r["server"] == server]
        throughput = [r["throughput_infer_per_s"] for r in mine]
        p50 = [_nan(r["latency_p50_ms"]) for r in mine]
        chosen = [_nan(r[f"latency_p{pct}_ms"]) for r in mine]
        (line,) = left.plot(throughput, p50, marker="o", label=f"{server} p50")
        left.plot(
            throughput,
            chosen,
            marker="s",
            linestyle="--",
            color=line.get_color(),
            label=f"{server} p{pct}",
        )
        load = [r["request_rate"] if rate_mode else r["concurrency"] for r in mine]
        for x, y, level in zip(throughput, p50, load, strict=True):
            left.annotate(
                f"{level:g}",
                (x, y),
                textcoords="offset points",
                xytext=(0, -12),
                ha="center",
                fontsize="x-small",
                color=line.get_color(),
            )
        right.plot(load, [_nan(r["latency_p99_ms"]) for r in mine], marker="o", label=server)
    left.set_xlabel("throughput (infer/s)")
    left.set_ylabel("latency (ms)")
    left.set_title(
        f"{options.model}: latency vs throughput (points: {'rate' if rate_mode else 'concurrency'})"
    )
    right.set_xlabel("request rate (req/s)" if rate_mode else "concurrency")
    right.set_ylabel("p99 latency (ms)")
    right.set_title(f"{options.model}: p99 vs {'request rate' if rate_mode else 'concurrency'}")
    if not rate_mode:
        right.xaxis.set_major_locator(MaxNLocator(integer=True))
    for axes in (left, right):
        axes.grid(True, alpha=0.3)
        axes.set_ylim(bottom=0)
        axes.legend(fontsize="small")
    try:
        figure.savefig(path, format="png", dpi=100)
    except OSError as exc:
        raise BenchError(f"cannot write {path}: {exc.strerror or exc}") from None


def _nan(value: float | None) -> float:
    return float("nan") if value is None else value
