"""``inferd tune`` on a tiny sweep against a real server in explicit mode."""

from __future__ import annotations

import csv
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from inferd.config.text import parse_config_text
from tests.optimize_support import inferd
from tests.support import ServerProcess


@pytest.fixture(scope="module")
def explicit(tmp_path_factory: pytest.TempPathFactory, demo_repo: Path) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("tune") / "models"
    shutil.copytree(demo_repo / "digits", root / "digits")
    args = ["--model-control-mode", "explicit", "--load-model", "digits"]
    proc = ServerProcess(root, extra_args=args).start()
    yield proc
    proc.stop()


def test_tiny_sweep_writes_a_valid_config(explicit: ServerProcess, tmp_path: Path) -> None:
    out = tmp_path / "tuned"
    done = inferd(
        "tune",
        "digits",
        "-u",
        explicit.http_address,
        "--model-repository",
        str(explicit.repository),
        "--latency-budget-ms",
        "1000",
        "--concurrency",
        "1:2",
        "--instances",
        "1",
        "--max-delay-us",
        "100",
        "--threads",
        "1",
        "--measurement-interval-ms",
        "200",
        "--max-windows",
        "3",
        "--output-dir",
        str(out),
        "--no-progress",
    )
    assert done.returncode == 0, done.stderr
    assert (
        "best level of each config (p99 <= 1000 ms; throughputs within 5% count as equal, "
        "the lower p99 wins):" in done.stdout
    )
    assert "vs default" in done.stdout and "at p99 <= 1000 ms" in done.stdout
    config = parse_config_text((out / "config.pbtxt").read_text())
    assert config.name == "digits"
    assert config.max_batch_size == 64
    assert [i.name for i in config.input] == ["input"]
    assert not [k for k in config.parameters if k.startswith("optimize.")]
    with (out / "results.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert {r["config"] for r in rows} == {"default", "i1-t1", "i1-db100-t1"}
    assert {r["concurrency"] for r in rows} == {"1", "2"}
    assert all(float(r["throughput_infer_per_s"]) > 0 for r in rows)
    assert (out / "tune.png").stat().st_size > 0
    # the temporary models are gone; the model itself still serves
    models = httpx.post(f"{explicit.http_url}/v2/repository/index", json={}, timeout=60).json()
    assert [m["name"] for m in models if m["state"] == "READY"] == ["digits"]
    assert httpx.get(f"{explicit.http_url}/v2/models/digits/ready", timeout=60).status_code == 200


def test_refuses_without_model_files(explicit: ServerProcess, tmp_path: Path) -> None:
    done = inferd(
        "tune", "digits", "-u", explicit.http_address, "--model-repository", str(tmp_path)
    )
    assert done.returncode == 2
    assert f"no model folder {tmp_path / 'digits'}" in done.stderr
