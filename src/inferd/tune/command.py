"""The ``inferd tune MODEL -u HOST:PORT`` command: load each trial config through the repository
API under a temporary name (the model's files uploaded from ``--model-repository``), measure it
with ``inferd bench``'s sweep, and report like Triton's Model Analyzer: a table, a plot of p99
latency against throughput, and the best ``config.pbtxt`` that meets the latency budget.
"""

from __future__ import annotations

import argparse
import base64
import os
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import orjson
from google.protobuf import text_format

from inferd.bench.options import BenchError, BenchOptions, Target, parse_target
from inferd.config.model_config_pb2 import ModelConfig
from inferd.config.text import config_to_dict, parse_config_json
from inferd.core.errors import InferdError
from inferd.tune import report
from inferd.tune.choice import TIE_PCT, best, pick
from inferd.tune.trials import Measured, Trial, default_trial, final_config, grid

_TIMEOUT_S = 300.0


class TuneError(Exception):
    """Bad input or a server that refuses: one line on stderr and exit status 2."""


def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a comma-separated list") from None
    if not values or any(v < 0 for v in values):
        raise argparse.ArgumentTypeError(f"'{text}': give non-negative integers")
    return values


def concurrency_levels(text: str) -> tuple[int, ...]:
    """``A:B``: A, then powers of two up to B, and B (Model Analyzer's sweep)."""
    low_text, _, high_text = text.partition(":")
    try:
        low, high = int(low_text), int(high_text or low_text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not A:B") from None
    if low < 1 or high < low:
        raise argparse.ArgumentTypeError(f"'{text}': need 1 <= A <= B")
    levels = {low, high}
    level = 1
    while level < high:
        if level > low:
            levels.add(level)
        level *= 2
    return tuple(sorted(levels))


def add_parser(commands: Any) -> None:
    cores = os.cpu_count() or 1
    parser = commands.add_parser(
        "tune",
        help="find the fastest serving config of a model on a running server (p99 budget)",
    )
    add = parser.add_argument
    add("model", help="model name on the server")
    add("-u", "--url", default="localhost:8080", metavar="HOST:PORT", help="the server (HTTP)")
    add(
        "--model-repository",
        type=Path,
        required=True,
        help="the repository holding the model's files (uploaded under a temporary name)",
    )
    add("--model-version", type=int, help="version folder to upload (default: the latest)")
    add("--latency-budget-ms", type=float, help="p99 latency budget (default: none)")
    add(
        "--tie-pct",
        type=float,
        default=TIE_PCT,
        metavar="PCT",
        help=f"throughputs within PCT %% of the highest count as equal, and the lower p99 wins "
        f"(default {TIE_PCT:g}: the noise of a measurement)",
    )
    add(
        "--concurrency",
        type=concurrency_levels,
        default=concurrency_levels("1:8"),
        metavar="A:B",
        help="client concurrency: A, powers of two, B (default 1:8)",
    )
    add("--instances", type=_ints, default=tuple(sorted({1, min(2, cores)})), help="e.g. 1,2")
    add(
        "--max-delay-us",
        type=_ints,
        default=(0, 500, 2000),
        help="dynamic batching max queue delays to try, besides batching off (default 0,500,2000)",
    )
    add(
        "--preferred-batch-size",
        type=_ints,
        default=(),
        help="preferred batch sizes for every dynamic batching trial (default: none)",
    )
    add(
        "--threads",
        type=_ints,
        default=tuple(sorted({1, cores})),
        help=f"thread counts per instance (ONNX Runtime, OpenVINO; default 1,{cores})",
    )
    add("-b", "--batch-size", type=int, default=1, help="rows per request (default 1)")
    add("--input-data", default="random", help="random, zero, or a JSON file (as inferd bench)")
    add("--measurement-interval-ms", type=int, default=1000, help="window length (default 1000)")
    add("--max-windows", type=int, default=5, help="windows per level at most (default 5)")
    add("--output-dir", type=Path, help="where to write config.pbtxt, results and the plot")
    add("--no-progress", dest="progress", action="store_false", help="no progress bar")
    parser.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except (TuneError, BenchError) as exc:
        print(f"inferd tune: {exc}", file=sys.stderr)
        return 2
    except InferdError as exc:
        print(f"inferd tune: {exc.message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("inferd tune: interrupted", file=sys.stderr)
        return 130


def _run(args: argparse.Namespace) -> int:
    if not 0 <= args.tie_pct < 100:
        raise TuneError(f"--tie-pct must be 0 or more and below 100, got {args.tie_pct:g}")
    try:
        target = parse_target(args.url, "http")
    except argparse.ArgumentTypeError as exc:
        raise TuneError(f"-u {exc}") from None
    server = Server(target)
    served = parse_config_json(server.get(f"/v2/models/{args.model}/config"), "served config")
    files = model_files(args.model_repository / args.model, args.model_version)
    temp_name = f"{args.model}.tune-{os.getpid()}"
    trials = [
        default_trial(served, temp_name),
        *grid(
            served,
            temp_name,
            args.instances,
            args.max_delay_us,
            args.threads,
            args.preferred_batch_size,
        ),
    ]
    progress = _progress(args.progress, len(trials))
    measured: list[Measured] = []
    try:
        for trial in trials:
            progress.set_description_str(trial.label)
            rows = measure(server, target, trial, files, args)
            best_level = pick(rows, args.latency_budget_ms, args.tie_pct)
            measured.append(Measured(trial, rows, best_level))
            progress.update(1)
    finally:
        progress.close()
    out_dir = args.output_dir or Path(f"tune-{args.model}")
    out_dir.mkdir(parents=True, exist_ok=True)
    winner = best(measured, args.tie_pct)
    report.print_table(measured, args.latency_budget_ms, args.tie_pct, sys.stdout)
    report.write_csv(out_dir / "results.csv", measured)
    if report.can_plot():
        report.write_plot(out_dir / "tune.png", measured, args.latency_budget_ms, args.model)
    if winner is None:
        print(
            f"no configuration meets the p99 budget of {args.latency_budget_ms} ms; "
            "nothing written but the results",
            file=sys.stdout,
        )
        return 1
    config = final_config(served, winner.trial)
    (out_dir / "config.pbtxt").write_text(text_format.MessageToString(config), encoding="utf-8")
    report.print_verdict(measured[0], winner, args.latency_budget_ms, out_dir, sys.stdout)
    return 0


def measure(
    server: Server, target: Target, trial: Trial, files: dict[str, bytes], args: Any
) -> list[dict[str, Any]]:
    from inferd.bench.runner import sweep

    name = trial.config.name
    server.load(name, trial.config, files)
    try:
        options = BenchOptions(
            model=name,
            version="",
            targets=(target,),
            protocol="http",
            service_kind="v2",
            concurrency_levels=tuple(args.concurrency),
            request_rates=(),
            batch_size=args.batch_size,
            shapes={},
            input_data=args.input_data,
            binary=True,
            measurement_interval_s=args.measurement_interval_ms / 1000,
            warmup_s=args.measurement_interval_ms / 2000,
            max_windows=args.max_windows,
            stability_pct=15.0,
            percentile=99,
            processes=1,
            csv_path=None,
            json_path=None,
            plot_path=None,
            progress=False,
        )
        rows, _ = sweep(options)
        return rows
    finally:
        server.unload(name)


def model_files(folder: Path, version: int | None) -> dict[str, bytes]:
    """One version folder's files as ``1/<path>``, for a load call's ``file:`` parameters."""
    from inferd.repository.layout import version_dirs

    if not folder.is_dir():
        raise TuneError(f"no model folder {folder} (give --model-repository)")
    versions = version_dirs(folder)
    if not versions:
        raise TuneError(f"{folder} has no version folder")
    chosen = version or max(versions)
    if chosen not in versions:
        raise TuneError(f"{folder} has no version {chosen}")
    root = versions[chosen]
    return {
        f"1/{p.relative_to(root).as_posix()}": p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.name.startswith(".")
    }


class Server:
    """The few KServe v2 calls tune makes (blocking, between measurements)."""

    def __init__(self, target: Target) -> None:
        self.base = f"http://{target.host}:{target.port}{target.base_path}"

    def _call(self, method: str, path: str, body: bytes | None = None) -> Any:
        request = urllib.request.Request(self.base + path, data=body, method=method)
        request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=_TIMEOUT_S) as response:
                data = response.read()
        except urllib.error.HTTPError as exc:
            raise TuneError(f"{method} {path}: {_error(exc.read()) or exc.reason}") from None
        except (urllib.error.URLError, OSError) as exc:
            raise TuneError(f"cannot reach {self.base}: {getattr(exc, 'reason', exc)}") from None
        return orjson.loads(data) if data else None

    def get(self, path: str) -> Any:
        return self._call("GET", path)

    def load(self, name: str, config: ModelConfig, files: dict[str, bytes]) -> None:
        parameters: dict[str, str] = {"config": orjson.dumps(config_to_dict(config)).decode()}
        for rel, data in files.items():
            parameters[f"file:{rel}"] = base64.b64encode(data).decode()
        body = orjson.dumps({"parameters": parameters})
        self._call("POST", f"/v2/repository/models/{name}/load", body)

    def unload(self, name: str) -> None:
        try:
            self._call("POST", f"/v2/repository/models/{name}/unload", b"{}")
        except TuneError as exc:
            print(f"inferd tune: could not unload {name}: {exc}", file=sys.stderr)


def _error(body: bytes) -> str:
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body.decode(errors="replace")[:200]
    return str(doc.get("error", "")) if isinstance(doc, dict) else ""


class _NoProgress:
    def set_description_str(self, text: str) -> None:
        pass

    def update(self, count: int) -> None:
        pass

    def close(self) -> None:
        pass


def _progress(enabled: bool, total: int) -> Any:
    if enabled:
        try:
            from tqdm import tqdm

            return tqdm(total=total, unit="config", file=sys.stderr, leave=False)
        except ImportError:
            pass
    return _NoProgress()
