"""``inferd bench`` end to end: real subprocesses against a live inferd on the demo models.

Short windows (300 ms, at most 3) keep the file fast; tests assert what the reports hold,
never how fast the server was.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from inferd.bench.measure import COLUMNS, columns
from inferd.bench.report import cell
from tests.support import ServerProcess, free_port

FAST = ["--no-progress", "-p", "300", "--max-windows", "3", "--warmup-ms", "200"]
FAST += ["--processes", "1"]


def bench(*argv: str, timeout_s: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "inferd", "bench", *argv],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def json_rows(path: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = json.loads(path.read_text())["rows"]
    return rows


def one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("inferd bench: ")
    return lines[0]


def test_concurrency_sweep_writes_csv_json_and_plot(server: ServerProcess, tmp_path: Path) -> None:
    out_csv, out_json, out_png = tmp_path / "out.csv", tmp_path / "out.json", tmp_path / "out.png"
    result = bench(
        "-m", "half_plus_two", "-u", server.http_address, "--concurrency-range", "1:2:1",
        "-f", str(out_csv), "--json", str(out_json), "--plot", str(out_png), *FAST,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    with out_csv.open() as f:
        reader = csv.reader(f)
        header = next(reader)
        rows = list(reader)
    assert tuple(header) == columns(None) and tuple(header[: len(COLUMNS)]) == COLUMNS
    assert len(rows) == 2
    table = [dict(zip(header, row, strict=True)) for row in rows]
    assert [r["concurrency"] for r in table] == ["1", "2"]
    assert [r["request_rate"] for r in table] == ["n/a", "n/a"]
    for row in table:
        assert float(row["throughput_infer_per_s"]) > 0
        assert row["errors"] == "0" and int(row["requests"]) > 0
        assert 0 < float(row["latency_p50_ms"]) <= float(row["latency_p99_ms"])
        assert row["client_cpu_saturated"] in ("true", "false")
        assert row["protocol"] == "v2 binary" and row["server"] == server.http_address
        assert 1 <= int(row["windows"]) <= 3
    # The server's statistics split, where it offers the Triton statistics extension.
    has_stats = (
        httpx.get(f"{server.http_url}/v2/models/half_plus_two/stats", timeout=60).status_code == 200
    )
    for row in table:
        for key in ("server_queue_us", "server_compute_us"):
            assert (float(row[key]) >= 0) if has_stats else row[key] == "n/a"

    doc = json.loads(out_json.read_text())
    assert doc["model"] == "half_plus_two" and doc["columns"] == header
    assert [[cell(r[k]) for k in header] for r in doc["rows"]] == rows

    png = out_png.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000

    assert "concurrency" in result.stdout and "infer/s" in result.stdout
    assert "half_plus_two" in result.stdout


def test_grpc_mode(server: ServerProcess, tmp_path: Path) -> None:
    out = tmp_path / "grpc.json"
    result = bench(
        "-m", "half_plus_two", "-i", "grpc", "-u", server.grpc_address, "--json", str(out),
        "--concurrency-range", "2", *FAST,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    (row,) = json_rows(out)
    assert row["protocol"] == "grpc" and row["concurrency"] == 2
    assert row["throughput_infer_per_s"] > 0 and row["errors"] == 0
    assert row["latency_avg_ms"] > 0


def test_request_rate_mode_reports_achieved_rate(server: ServerProcess, tmp_path: Path) -> None:
    out = tmp_path / "rate.json"
    result = bench(
        "-m", "half_plus_two", "-u", server.http_address, "--request-rate-range", "50:100:50",
        "--json", str(out), "--percentile", "97", *FAST,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    rows = json_rows(out)
    assert [r["request_rate"] for r in rows] == [50.0, 100.0]
    for row in rows:
        assert row["concurrency"] is None
        assert row["achieved_request_rate"] > 0
        assert isinstance(row["request_rate_deviation_pct"], float)
        assert row["errors"] == 0 and row["latency_p97_ms"] > 0
    assert "sent/s" in result.stdout and "dev %" in result.stdout


def test_rejected_requests_are_counted_as_errors(server: ServerProcess, tmp_path: Path) -> None:
    data = tmp_path / "int32.json"  # the model takes FP32: the server answers 400
    request = {"inputs": [{"name": "x", "datatype": "INT32", "shape": [1, 1], "data": [1]}]}
    data.write_text(json.dumps(request))
    out = tmp_path / "errors.json"
    result = bench(
        "-m", "half_plus_two", "-u", server.http_address, "--input-data", str(data),
        "--json", str(out), *FAST,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    (row,) = json_rows(out)
    assert row["errors"] > 0 and row["errors"] == row["requests"]
    assert row["throughput_infer_per_s"] == 0 and row["latency_p50_ms"] is None
    assert row["first_error"].startswith("HTTP 400")
    assert "requests failed" in result.stderr and "INT32" in result.stderr


def test_tfserving_and_perf_analyzer_data_file(
    server: ServerProcess, demo_repo: Path, tmp_path: Path
) -> None:
    out = tmp_path / "tf.json"
    result = bench(
        "-m", "half_plus_two", "--service-kind", "tfserving", "-u", server.http_address,
        "-b", "4", "--json", str(out), *FAST,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    (row,) = json_rows(out)
    assert row["protocol"] == "tfserving json" and row["batch_size"] == 4
    assert row["throughput_infer_per_s"] > 0 and row["errors"] == 0

    sample = json.loads((demo_repo / "digits" / "sample.json").read_text())
    data = tmp_path / "digits.json"
    data.write_text(json.dumps({"data": [{"input": r} for r in sample["inputs"][:3]]}))
    result = bench(
        "-m", "digits", "-u", server.http_address, "--input-data", str(data), "-b", "2",
        "--json", "--json", str(out), *FAST,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    (row,) = json_rows(out)
    assert row["protocol"] == "v2 json" and row["errors"] == 0
    assert row["throughput_infer_per_s"] > 0


def test_unknown_model(server: ServerProcess) -> None:
    line = one_line_error(bench("-m", "nope", "-u", server.http_address, *FAST))
    assert "'nope'" in line and "404" in line
    line = one_line_error(bench("-m", "nope", "-i", "grpc", "-u", server.grpc_address, *FAST))
    assert "'nope'" in line and "NOT_FOUND" in line


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_unreachable_server(protocol: str) -> None:
    port = free_port()
    line = one_line_error(
        bench("-m", "half_plus_two", "-i", protocol, "-u", f"127.0.0.1:{port}", *FAST)
    )
    assert f"127.0.0.1:{port}" in line and "reach" in line


def test_shape_that_does_not_match_the_model(server: ServerProcess) -> None:
    line = one_line_error(
        bench("-m", "digits", "-u", server.http_address, "--shape", "input:32", *FAST)
    )
    assert "input 'input'" in line and "[-1, 64]" in line
    line = one_line_error(bench("-m", "half_plus_two", "-u", server.http_address, "-b", "65"))
    assert "max_batch_size 64" in line


def test_unparsable_range_is_an_argparse_error() -> None:
    result = bench("-m", "half_plus_two", "--concurrency-range", "4:1")
    assert result.returncode == 2
    assert "usage:" in result.stderr and "END is below START" in result.stderr
