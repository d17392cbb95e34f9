"""Command-line options of ``inferd bench`` and the checked settings built from them.

Flag names follow Triton's perf_analyzer where it has one (``--concurrency-range``,
``--request-rate-range``, ``--measurement-interval``, ``--percentile``, ``-f``).
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

N = TypeVar("N", int, float)

DEFAULT_PORTS = {"http": 8080, "grpc": 8081}


class BenchError(Exception):
    """Bad input or an unreachable server: one line on stderr and exit status 2."""


@dataclass(frozen=True, slots=True)
class Target:
    """One server to measure: a label for the reports and where it listens."""

    label: str
    host: str
    port: int
    base_path: str  # "" or "/prefix", prepended to every HTTP route

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}{self.base_path}"


@dataclass(frozen=True, slots=True)
class BenchOptions:
    model: str
    version: str
    targets: tuple[Target, ...]
    protocol: str  # "http" | "grpc"
    service_kind: str  # "v2" | "tfserving"
    concurrency_levels: tuple[int, ...]  # empty in request-rate mode
    request_rates: tuple[float, ...]  # empty in concurrency mode
    batch_size: int
    shapes: dict[str, tuple[int, ...]]
    input_data: str  # "random" | "zero" | a JSON file
    binary: bool
    measurement_interval_s: float
    warmup_s: float
    max_windows: int
    stability_pct: float
    percentile: int | None
    processes: int
    csv_path: Path | None
    json_path: Path | None
    plot_path: Path | None
    progress: bool

    @property
    def levels(self) -> tuple[int | float, ...]:
        return self.concurrency_levels or self.request_rates


def parse_int_range(text: str) -> tuple[int, ...]:
    """``START[:END[:STEP]]`` of positive integers, END included."""
    start, end, step = _split_range(text, int)
    if start < 1 or step < 1:
        raise argparse.ArgumentTypeError(f"'{text}': START and STEP must be at least 1")
    return tuple(range(start, end + 1, step))


def parse_rate_range(text: str) -> tuple[float, ...]:
    """``START[:END[:STEP]]`` of positive request rates (per second), END included."""
    start, end, step = _split_range(text, float)
    if start <= 0 or step <= 0:
        raise argparse.ArgumentTypeError(f"'{text}': START and STEP must be above 0")
    count = int((end - start) / step + 1e-9) + 1
    return tuple(round(start + i * step, 6) for i in range(count))


def _split_range(text: str, kind: type[N]) -> tuple[N, N, N]:
    parts = text.split(":")
    if not 1 <= len(parts) <= 3:
        raise argparse.ArgumentTypeError(f"'{text}' is not START[:END[:STEP]]")
    try:
        values = [kind(p) for p in parts]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"'{text}' is not START[:END[:STEP]] of {kind.__name__} values"
        ) from None
    start = values[0]
    end = values[1] if len(values) > 1 else start
    step = values[2] if len(values) > 2 else kind(1)
    if end < start:
        raise argparse.ArgumentTypeError(f"'{text}': END is below START")
    return start, end, step


def parse_shape(text: str) -> tuple[str, tuple[int, ...]]:
    """``NAME:D1,D2,...`` as perf_analyzer takes it."""
    name, sep, dims = text.rpartition(":")
    try:
        shape = tuple(int(d) for d in dims.split(",")) if dims else ()
    except ValueError:
        shape = (-1,)
    if not sep or not name or any(d < 0 for d in shape):
        raise argparse.ArgumentTypeError(
            f"'{text}' is not NAME:DIMS (non-negative integers, comma-separated)"
        )
    return name, shape


def parse_target(text: str, protocol: str) -> Target:
    """``[LABEL=][http://]HOST[:PORT][/PREFIX]``."""
    label, sep, url = text.partition("=")
    if not sep or "/" in label or ":" in label:
        label, url = "", text
    rest = url
    for scheme in ("http://", "grpc://"):
        if rest.startswith(scheme):
            rest = rest[len(scheme) :]
    if "://" in rest:
        raise argparse.ArgumentTypeError(f"'{text}': only plain http and grpc are supported")
    hostport, slash, path = rest.partition("/")
    host, colon, port_text = hostport.rpartition(":")
    if not colon:
        host, port_text = hostport, str(DEFAULT_PORTS[protocol])
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise argparse.ArgumentTypeError(f"'{text}' is not [LABEL=]HOST[:PORT]")
    base_path = ("/" + path.strip("/")) if slash and path.strip("/") else ""
    return Target(label or f"{host}:{port_text}{base_path}", host, int(port_text), base_path)


def default_processes() -> int:
    """One generator process per four cores, at most four: the server keeps the rest."""
    return max(1, min(4, (os.cpu_count() or 2) // 4))


class _JsonAction(argparse.Action):
    """``--json`` alone picks JSON tensors; ``--json FILE`` names the JSON report."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        if values is None:
            namespace.json_data = True
        else:
            namespace.json_path = Path(str(values))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("-m", "--model-name", dest="model", required=True, help="model to measure")
    add("-x", "--model-version", default="", help="model version (default: the server's choice)")
    add(
        "-u",
        "--url",
        dest="urls",
        action="append",
        metavar="[LABEL=]HOST:PORT",
        help="server to measure; repeat to compare servers in one run "
        "(default localhost:8080 for http, localhost:8081 for grpc)",
    )
    add("-i", "--protocol", choices=("http", "grpc"), default="http")
    add("--service-kind", choices=("v2", "tfserving"), default="v2")
    load = parser.add_mutually_exclusive_group()
    load.add_argument(
        "--concurrency-range",
        type=parse_int_range,
        metavar="START:END:STEP",
        help="closed loop: this many clients each sending its next request on an answer "
        "(default 1)",
    )
    load.add_argument(
        "--request-rate-range",
        type=parse_rate_range,
        metavar="START:END:STEP",
        help="open loop: requests per second sent at fixed intervals, answered or not",
    )
    add("-b", "--batch-size", type=int, default=1, help="rows per request (default 1)")
    add(
        "--shape",
        dest="shapes",
        action="append",
        type=parse_shape,
        default=[],
        metavar="NAME:DIMS",
        help="shape of an input with variable dims, without the batch dim when the model "
        "batches (repeat per input)",
    )
    add(
        "--input-data",
        default="random",
        metavar="random|zero|FILE.json",
        help='request data: random, zeros, or a JSON file (perf_analyzer\'s {"data": [...]} '
        'or a v2 request {"inputs": [...]})',
    )
    add("--binary", action="store_true", help="HTTP v2: tensors as binary data (the default)")
    add(
        "--json",
        dest="json_flag",
        action=_JsonAction,
        nargs="?",
        metavar="FILE.json",
        help="alone: HTTP v2 tensors as JSON data; with a file: write the JSON report there",
    )
    add("--json-data", dest="json_data", action="store_true", help="same as a bare --json")
    add(
        "-p",
        "--measurement-interval-ms",
        "--measurement-interval",
        dest="measurement_interval_ms",
        type=int,
        default=2000,
        metavar="MS",
        help="length of one measurement window (default 2000)",
    )
    add("--warmup-ms", type=int, default=None, metavar="MS", help="default: one window")
    add(
        "--max-windows",
        "--max-trials",
        dest="max_windows",
        type=int,
        default=10,
        help="windows per level before giving up on stability (default 10)",
    )
    add(
        "-s",
        "--stability-percentage",
        type=float,
        default=10.0,
        help="the last 3 windows must agree within this percentage (default 10)",
    )
    add(
        "--percentile",
        type=int,
        default=None,
        help="judge stability on this latency percentile instead of the average, and plot it "
        "(plot default 99)",
    )
    add(
        "--processes",
        type=int,
        default=None,
        help=f"load generator processes (default {default_processes()}: one per 4 cores)",
    )
    add("-f", "--latency-report-file", dest="csv_path", type=Path, help="write a CSV here")
    add("--json-report", dest="json_path", type=Path, help="same as --json FILE.json")
    add("--plot", dest="plot_path", type=Path, help="write a PNG plot here (needs matplotlib)")
    add("--no-progress", dest="progress", action="store_false", help="no progress bar")


def from_args(args: argparse.Namespace) -> BenchOptions:
    """Cross-checks argparse cannot express; a conflict is a BenchError."""
    protocol: str = args.protocol
    if args.service_kind == "tfserving" and protocol != "http":
        raise BenchError("--service-kind tfserving speaks HTTP only (-i http)")
    if args.batch_size < 1:
        raise BenchError("--batch-size must be at least 1")
    if args.measurement_interval_ms < 10:
        raise BenchError("--measurement-interval-ms must be at least 10")
    if args.max_windows < 1:
        raise BenchError("--max-windows must be at least 1")
    if args.percentile is not None and not 0 < args.percentile < 100:
        raise BenchError("--percentile must be between 1 and 99")
    processes = args.processes if args.processes is not None else default_processes()
    if processes < 1:
        raise BenchError("--processes must be at least 1")
    shapes: dict[str, tuple[int, ...]] = {}
    for name, shape in args.shapes:
        if name in shapes:
            raise BenchError(f"--shape for input '{name}' is given twice")
        shapes[name] = shape
    try:
        targets = tuple(parse_target(u, protocol) for u in args.urls or ["localhost"])
    except argparse.ArgumentTypeError as exc:
        raise BenchError(f"-u {exc}") from None
    if len({t.label for t in targets}) != len(targets):
        raise BenchError("two -u targets have the same label; name them LABEL=HOST:PORT")
    if args.binary and args.json_data:
        raise BenchError("--binary and --json (JSON tensors) exclude each other")
    binary = protocol == "grpc" or (args.service_kind == "v2" and not args.json_data)
    if args.service_kind == "tfserving" and args.binary:
        raise BenchError("--binary is a KServe v2 extension; TF Serving REST is JSON only")
    interval_s = args.measurement_interval_ms / 1000
    rates = args.request_rate_range or ()
    return BenchOptions(
        model=args.model,
        version=args.model_version,
        targets=targets,
        protocol=protocol,
        service_kind=args.service_kind,
        concurrency_levels=() if rates else (args.concurrency_range or (1,)),
        request_rates=rates,
        batch_size=args.batch_size,
        shapes=shapes,
        input_data=args.input_data,
        binary=binary,
        measurement_interval_s=interval_s,
        warmup_s=interval_s if args.warmup_ms is None else max(0, args.warmup_ms) / 1000,
        max_windows=args.max_windows,
        stability_pct=args.stability_percentage,
        percentile=args.percentile,
        processes=processes,
        csv_path=args.csv_path,
        json_path=args.json_path,
        plot_path=args.plot_path,
        progress=args.progress,
    )
