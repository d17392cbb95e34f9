"""inferd bench options: ranges, shapes, targets, and the checks argparse cannot make."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from inferd.bench.options import (
    BenchError,
    BenchOptions,
    from_args,
    parse_int_range,
    parse_rate_range,
    parse_shape,
    parse_target,
)
from inferd.cli import build_parser


def options(*argv: str) -> BenchOptions:
    return from_args(build_parser().parse_args(["bench", "-m", "m", *argv]))


def test_int_ranges_include_the_end() -> None:
    assert parse_int_range("1:4:1") == (1, 2, 3, 4)
    assert parse_int_range("2:9:3") == (2, 5, 8)
    assert parse_int_range("4") == (4,)
    assert parse_int_range("1:3") == (1, 2, 3)


@pytest.mark.parametrize("text", ["0:2", "3:1", "a", "1:2:0", "1:2:3:4", "1.5:2"])
def test_bad_int_ranges(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        parse_int_range(text)


def test_rate_ranges_are_floats() -> None:
    assert parse_rate_range("100:200:50") == (100.0, 150.0, 200.0)
    assert parse_rate_range("0.5:1.5:0.5") == (0.5, 1.0, 1.5)
    with pytest.raises(argparse.ArgumentTypeError):
        parse_rate_range("0:10:5")


def test_shapes() -> None:
    assert parse_shape("x:1,64") == ("x", (1, 64))
    assert parse_shape("ns:input:3") == ("ns:input", (3,))
    for bad in ("x", "x:a", ":3", "x:-1"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_shape(bad)


def test_targets() -> None:
    assert parse_target("localhost", "http").address == "localhost:8080"
    assert parse_target("localhost", "grpc").address == "localhost:8081"
    mlserver = parse_target("mlserver=http://127.0.0.1:18080", "http")
    assert (mlserver.label, mlserver.host, mlserver.port) == ("mlserver", "127.0.0.1", 18080)
    proxied = parse_target("http://h:9000/serving/", "http")
    assert (proxied.label, proxied.base_path) == ("h:9000/serving", "/serving")
    with pytest.raises(argparse.ArgumentTypeError):
        parse_target("https://h:1", "http")
    with pytest.raises(argparse.ArgumentTypeError):
        parse_target("h:99999", "http")


def test_defaults() -> None:
    o = options()
    assert o.concurrency_levels == (1,) and o.request_rates == ()
    assert o.binary and o.protocol == "http" and o.service_kind == "v2"
    assert o.measurement_interval_s == 2.0 and o.warmup_s == 2.0 and o.max_windows == 10
    assert [t.address for t in o.targets] == ["localhost:8080"]
    assert o.processes >= 1


def test_bare_json_picks_json_tensors_and_json_file_names_the_report() -> None:
    bare = options("--json", "--concurrency-range", "1:2")
    assert not bare.binary and bare.json_path is None
    report = options("--json", "out.json")
    assert report.binary and report.json_path == Path("out.json")
    both = options("--json", "--json", "r.json", "-f", "r.csv", "--plot", "r.png")
    assert not both.binary and both.json_path == Path("r.json")
    assert both.csv_path == Path("r.csv") and both.plot_path == Path("r.png")


def test_request_rate_mode_and_percentile() -> None:
    o = options("--request-rate-range", "10:30:10", "--percentile", "97", "-p", "300")
    assert o.request_rates == (10.0, 20.0, 30.0) and o.concurrency_levels == ()
    assert o.levels == (10.0, 20.0, 30.0)
    assert o.percentile == 97 and o.measurement_interval_s == 0.3


def test_shapes_and_targets_from_the_command_line() -> None:
    o = options("--shape", "x:3,4", "-u", "a=h:1", "-u", "b=h:2", "-i", "grpc")
    assert o.shapes == {"x": (3, 4)}
    assert [(t.label, t.port) for t in o.targets] == [("a", 1), ("b", 2)]
    assert o.binary  # gRPC always sends raw tensors


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--service-kind", "tfserving", "-i", "grpc"], "HTTP only"),
        (["--service-kind", "tfserving", "--binary"], "JSON only"),
        (["--binary", "--json"], "exclude each other"),
        (["-b", "0"], "batch-size"),
        (["--percentile", "100"], "percentile"),
        (["--processes", "0"], "processes"),
        (["--shape", "x:1", "--shape", "x:2"], "twice"),
        (["-u", "h:1", "-u", "h:1"], "same label"),
    ],
)
def test_conflicts_are_bench_errors(argv: list[str], message: str) -> None:
    with pytest.raises(BenchError, match=message):
        options(*argv)


def test_concurrency_and_rate_exclude_each_other(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(
            ["bench", "-m", "m", "--concurrency-range", "1", "--request-rate-range", "1"]
        )
    assert exit_info.value.code == 2
    assert "not allowed with" in capsys.readouterr().err
