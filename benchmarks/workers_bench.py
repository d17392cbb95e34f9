"""``--http-workers``: half_plus_two v2 JSON at concurrency 64, one process against N on one port.

Servers are started in turn (1 worker, then N, pass after pass: interleaved, so both see the
same host load) on the demo ``half_plus_two``; wrk posts the same JSON body over 64 keep-alive
connections. Figures: req/s, and server CPU-µs per request (CPU of the server and every
descendant, workers included, over the requests answered: the noise-robust figure), with the
host's load average when each run started.

    PYTHONPATH=src .venv/bin/python benchmarks/workers_bench.py [--workers 2] [--passes 3] \\
        [--seconds 10] [--conns 64] [--threads 2]

Needs ``wrk`` (Debian: wrk).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from core_bench import process_cpu_s  # noqa: E402

from inferd.demo.models import write_demo_repository  # noqa: E402
from tests.support import ServerProcess  # noqa: E402

BODY = {"inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [1.0]}]}
SCRIPT = """wrk.method = "POST"
wrk.body = '{body}'
wrk.headers["Content-Type"] = "application/json"
done = function(summary, latency, requests)
  io.write(string.format("JSON {{\\"requests\\": %d, \\"errors\\": %d, \\"p50_us\\": %d}}\\n",
    summary.requests, summary.errors.status + summary.errors.connect + summary.errors.read
    + summary.errors.write + summary.errors.timeout, latency:percentile(50)))
end
"""


def load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def wrk(url: str, script: Path, threads: int, conns: int, seconds: int) -> dict[str, Any]:
    out = subprocess.run(
        ["wrk", f"-t{threads}", f"-c{conns}", f"-d{seconds}s", "-s", str(script), url],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    found = re.search(r"^JSON (.*)$", out.stdout, re.M)
    assert found, out.stdout
    result: dict[str, Any] = json.loads(found.group(1))
    return result


def workers_serving(server: ServerProcess) -> int:
    text = httpx.get(f"{server.http_url}/metrics", timeout=10).text
    found = re.search(r"^inferd_workers (\S+)$", text, re.M)
    return int(float(found.group(1))) if found else 1


def measure(repo: Path, workers: int, args: argparse.Namespace, script: Path) -> dict[str, Any]:
    server = ServerProcess(repo, extra_args=["--http-workers", str(workers)]).start()
    try:
        deadline = time.monotonic() + 60
        while workers_serving(server) < workers and time.monotonic() < deadline:
            time.sleep(0.2)
        url = f"{server.http_url}/v2/models/half_plus_two/infer"
        wrk(url, script, args.threads, args.conns, 2)  # warm-up
        assert server.proc is not None
        load = load_average()
        cpu_before = process_cpu_s(server.proc.pid)
        result = wrk(url, script, args.threads, args.conns, args.seconds)
        cpu_s = process_cpu_s(server.proc.pid) - cpu_before
    finally:
        server.stop()
    requests = result["requests"]
    return {
        "workers": workers,
        "rps": requests / args.seconds,
        "cpu_us_per_req": cpu_s * 1e6 / max(1, requests),
        "errors": result["errors"],
        "p50_ms": result["p50_us"] / 1000,
        "load": load,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--conns", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="inferd-workers-bench-") as tmp:
        repo = Path(tmp) / "models"
        write_demo_repository(repo, models=["half_plus_two"])
        script = Path(tmp) / "post.lua"
        script.write_text(SCRIPT.format(body=json.dumps(BODY)))
        rows: list[dict[str, Any]] = []
        print("pass  workers     req/s  CPU-us/req  errors  p50 ms  load average (1/5/15 min)")
        ratios: list[tuple[float, float]] = []
        for number in range(1, args.passes + 1):
            # ABBA order: a load that drifts during a pass favours neither side overall.
            order = (1, args.workers) if number % 2 else (args.workers, 1)
            pair: dict[int, dict[str, Any]] = {}
            for workers in order:
                row = pair[workers] = measure(repo, workers, args, script)
                rows.append(row)
                print(
                    f"{number:>4}  {workers:>7}  {row['rps']:>8.0f}  {row['cpu_us_per_req']:>10.1f}"
                    f"  {row['errors']:>6}  {row['p50_ms']:>6.2f}  {row['load']}",
                    flush=True,
                )
            one, many = pair[1], pair[args.workers]
            ratios.append(
                (many["rps"] / one["rps"], many["cpu_us_per_req"] / one["cpu_us_per_req"])
            )
            print(
                f"      pass {number}: {ratios[-1][0]:.2f}x req/s, {ratios[-1][1]:.2f}x CPU-us/req"
            )
    one_rows = [r for r in rows if r["workers"] == 1]
    many_rows = [r for r in rows if r["workers"] == args.workers]
    rps_1, rps_n = (statistics.median(r["rps"] for r in rs) for rs in (one_rows, many_rows))
    cpu_1, cpu_n = (
        statistics.median(r["cpu_us_per_req"] for r in rs) for rs in (one_rows, many_rows)
    )
    print(
        f"median: 1 worker {rps_1:.0f} req/s, {cpu_1:.1f} CPU-us/req; {args.workers} workers "
        f"{rps_n:.0f} req/s, {cpu_n:.1f} CPU-us/req; median of the per-pass ratios "
        f"{statistics.median(r[0] for r in ratios):.2f}x req/s, "
        f"{statistics.median(r[1] for r in ratios):.2f}x CPU-us/req"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
