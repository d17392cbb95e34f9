"""The ``inferd optimize REPO/MODEL`` command: build the optimized copy in a hidden folder, check
it against the original, time both, and only then move it in as the new version (exit 2, nothing
written, when the check fails, the copy is slower, or nothing could be optimized)."""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import orjson

from inferd.core.errors import InferdError
from inferd.optimize import data, speed
from inferd.optimize.steps import Options, Refused, Result


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "optimize",
        help="write an optimized copy of a model (graph optimizations, INT8, FP16) as a new "
        "version, after an accuracy check",
    )
    add = parser.add_argument
    add("model", type=Path, metavar="REPO/MODEL", help="the model's folder in a repository")
    add(
        "--int8",
        nargs="?",
        const="auto",
        choices=("auto", "dynamic", "static"),
        help="quantize to INT8: static (QDQ, calibrated; CNNs), dynamic (MatMul-heavy models), "
        "auto (static when the model has convolutions); alone: auto",
    )
    add("--fp16", action="store_true", help="convert weights and compute to FP16 (for GPUs)")
    source = parser.add_mutually_exclusive_group()
    source.add_argument(
        "--calibration", type=Path, metavar="FILE.npz", help="input rows (one array per input)"
    )
    add(
        "--calibration-samples",
        type=int,
        default=100,
        metavar="N",
        help="rows used to calibrate (default 100); the data's other rows are held out for the "
        "check, random rows in the input range make up for missing ones",
    )
    add("--check-samples", type=int, default=200, metavar="N", help="held-out rows (default 200)")
    add(
        "--input-range",
        dest="ranges",
        action="append",
        default=[],
        metavar="[NAME=]LOW:HIGH",
        help="range of random rows for an input (default: the range seen in the data, else 0:1)",
    )
    add("--source-version", type=int, help="version to optimize (default: the latest)")
    add("--as-version", type=int, metavar="N", help="version to write (default: latest + 1)")
    add(
        "--min-agreement",
        type=float,
        default=0.99,
        help="refuse (exit 2, nothing written) below this agreement with the original "
        "(default 0.99)",
    )
    add(
        "--latency-runs",
        type=int,
        default=3,
        help="timing rounds per batch size, at least (default 3; a fast model gets more, up to "
        "25 in about a second): each round times the original and the copy on the same batch",
    )
    add(
        "--allow-slower",
        action="store_true",
        help="write the copy even where it measured slower than the original (by default: "
        "refused, exit 2, nothing written)",
    )
    add(
        "--reduce-range",
        choices=("on", "off"),
        default="off",
        help="7-bit INT8 weights, which ONNX Runtime advises where 8-bit u8s8 kernels saturate "
        "(CPUs without VNNI) and accuracy suffers (default off)",
    )
    add(
        "--max-fp32-nodes",
        type=int,
        default=2,
        metavar="K",
        help="below --min-agreement, keep up to K of the most sensitive nodes in FP32 "
        "(models with up to 16 quantizable nodes; default 2; 0: never)",
    )
    add("--no-progress", dest="progress", action="store_false", help="no progress bars")
    add("--report", type=Path, metavar="FILE.json", help="also write the summary as JSON")
    parser.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    try:
        options = _options(args)
        result = optimize(options)
    except (Refused, InferdError) as exc:
        message = exc.message if isinstance(exc, InferdError) else str(exc)
        print(f"inferd optimize: {message}", file=sys.stderr)
        return 2
    print_summary(result, sys.stdout)
    if options.report:
        options.report.write_bytes(orjson.dumps(report(result), option=orjson.OPT_INDENT_2))
    return 0


def _options(args: argparse.Namespace) -> Options:
    if args.int8 and args.fp16:
        raise Refused("--int8 and --fp16 exclude each other")
    if args.calibration_samples < 1 or args.check_samples < 1:
        raise Refused("--calibration-samples and --check-samples must be at least 1")
    if not 0.0 <= args.min_agreement <= 1.0:
        raise Refused("--min-agreement must be between 0 and 1")
    return Options(
        model_dir=args.model,
        int8=args.int8,
        fp16=args.fp16,
        calibration=args.calibration,
        calibration_rows=args.calibration_samples,
        check_rows=args.check_samples,
        ranges=tuple(data.parse_range(r) for r in args.ranges),
        source_version=args.source_version,
        as_version=args.as_version,
        min_agreement=args.min_agreement,
        latency_runs=args.latency_runs,
        reduce_range=args.reduce_range == "on",
        max_fp32_nodes=args.max_fp32_nodes,
        progress=args.progress,
        report=args.report,
        allow_slower=args.allow_slower,
    )


def optimize(options: Options) -> Result:
    from inferd.backends import select_backend
    from inferd.repository.config import read_config
    from inferd.repository.layout import version_dirs

    folder = options.model_dir
    if not folder.is_dir():
        raise Refused(f"{folder} is not a model folder")
    config = read_config(folder)
    versions = version_dirs(folder)
    if not versions:
        raise Refused(f"{folder} has no version folder")
    source_version = options.source_version or max(versions)
    if source_version not in versions:
        raise Refused(f"model {config.name} has no version {source_version}")
    target_version = options.as_version or max(versions) + 1
    if target_version < 1:
        raise Refused(f"--as-version must be a positive integer, got {target_version}")
    if (folder / str(target_version)).exists():
        raise Refused(f"version {target_version} of {config.name} exists already")
    backend = select_backend(config, [versions[source_version]])
    if backend.name not in ("onnxruntime", "openvino"):
        raise Refused(
            f"model {config.name} is served by the {backend.name} backend; inferd optimize "
            "handles ONNX and OpenVINO models"
        )
    staging = Path(tempfile.mkdtemp(prefix=".optimize-", dir=folder))  # hidden from servers
    try:
        if backend.name == "onnxruntime":
            from inferd.optimize.onnx_flow import optimize_onnx

            result = optimize_onnx(options, config, versions[source_version], staging)
        else:
            from inferd.optimize.openvino_flow import optimize_openvino

            result = optimize_openvino(options, config, versions[source_version], staging)
        result.source_version, result.version = source_version, target_version
        try:
            # mkdtemp's folder is the writer's alone (0700): the version gets the mode of the
            # folder it joins, so a server running as another user reads it.
            staging.chmod(folder.stat().st_mode & 0o777)
            staging.rename(folder / str(target_version))
        except OSError as exc:
            raise Refused(
                f"cannot write version {target_version} of {config.name}: {exc}"
            ) from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return result


def print_summary(result: Result, out: Any) -> None:
    res = result.result
    header = ["", "version", "size", *[f"batch {b}" for b in result.timings], "agreement"]
    agreement = f"{res.agreement:.2%}" if res else "n/a"
    rows = [
        ["original", str(result.source_version), _mb(result.sizes_bytes[0])]
        + [_time(t.original_ms) for t in result.timings.values()]
        + ["-"],
        ["optimized", str(result.version), _mb(result.sizes_bytes[1])]
        + [_time(t.optimized_ms) for t in result.timings.values()]
        + [agreement],
    ]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip(), file=out)
    print(f"method: {result.method}", file=out)
    if result.notes.get("op_types"):
        print(f"int8 op types: {result.notes['op_types']}", file=out)
    if result.notes.get("fp32_nodes"):
        print(f"kept in FP32 (most sensitive): {result.notes['fp32_nodes']}", file=out)
    if res is not None:
        print(f"check: {'; '.join(result.check_sources)}", file=out)
        for output in res.outputs:
            print(f"  {output.describe()}", file=out)
        if res.accuracy is not None:
            before, after = res.accuracy
            print(
                f"accuracy on {res.labelled_rows} labelled rows: original {before:.2%}, "
                f"optimized {after:.2%} ({(after - before) * 100:+.2f} points)",
                file=out,
            )
    if result.timings:
        print("speedup: " + ", ".join(t.describe(n) for n, t in result.timings.items()), file=out)
    slower = speed.slower_at(result.timings)
    if slower:
        batches = ", ".join(str(b) for b in slower)
        print(
            f"SLOWER than the original at batch {batches}: written only because of --allow-slower",
            file=out,
        )


def report(result: Result) -> dict[str, Any]:
    res = result.result
    return {
        "model": result.model,
        "source_version": result.source_version,
        "version": result.version,
        "method": result.method,
        "notes": result.notes,
        "size_bytes": {"original": result.sizes_bytes[0], "optimized": result.sizes_bytes[1]},
        "latency_ms": {
            str(size): {
                "original": t.original_ms,
                "optimized": t.optimized_ms,
                "speedup": t.speedup,
                "verdict": t.verdict,
                "rounds": t.rounds,
                "faster_rounds": t.faster_rounds,
            }
            for size, t in result.timings.items()
        },
        "agreement": None if res is None else res.agreement,
        "outputs": [] if res is None else [o.describe() for o in res.outputs],
        "accuracy": None
        if res is None or res.accuracy is None
        else {"original": res.accuracy[0], "optimized": res.accuracy[1], "rows": res.labelled_rows},
        "check_rows": None if res is None else res.rows,
        "check_sources": result.check_sources,
    }


def _mb(size: int) -> str:
    return f"{size / 1e6:.1f} MB" if size >= 100_000 else f"{size / 1e3:.1f} KB"


def _time(ms: float) -> str:
    return f"{ms:.2f} ms" if ms >= 1 else f"{ms * 1000:.1f} µs"
