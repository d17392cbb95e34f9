"""What an open dashboard costs inference: half_plus_two req/s at c=16, without and with one
dashboard page open in headless Chromium, in the same run on the same server.

Phases alternate (off, on, off, on, ...) so drift on a shared machine hits both alike. "On" is
the Traffic panel open in Debian's chromium (Playwright), which polls the most: the series every
second, the models every 5 s and /metrics every 5 s, and redraws six charts. "Off" closes the
page (the idle browser stays). The load is wrk, one thread, 16 keep-alive connections, POSTing
one FP32 row as v2 JSON. Per phase it prints req/s, the server's CPU-µs per request, and the
browser's CPU use (on a 2-core machine the browser competes with the server for CPU, which an
operator's own laptop would not).

    .venv/bin/python benchmarks/dashboard_overhead.py [--phase-s 10] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "src"))
# The server subprocess runs this checkout too.
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH", "")) if p
)

from inferd.demo.models import write_demo_repository  # noqa: E402
from tests.support import ServerProcess  # noqa: E402

BODY = {"inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [1.0]}]}
LAUNCH_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of one process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def tree_cpu_s(pid: int) -> dict[int, float]:
    """CPU seconds of a process and each descendant alive now (the browser's processes)."""
    found: dict[int, float] = {}
    pending = [pid]
    while pending:
        current = pending.pop()
        try:
            found[current] = cpu_s(current)
            children = Path(f"/proc/{current}/task/{current}/children").read_text().split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        pending.extend(int(c) for c in children)
    return found


def spent_s(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU seconds the processes alive at the end spent in between (new ones count whole)."""
    return sum(cpu - before.get(pid, 0.0) for pid, cpu in after.items())


_ENDPOINT_SUM = re.compile(
    r'^inferd_endpoint_duration_seconds_sum\{endpoint="([^"]+)",protocol="http"\} (\S+)$', re.M
)
_ENDPOINT_COUNT = re.compile(
    r'^inferd_endpoint_duration_seconds_count\{endpoint="([^"]+)",protocol="http"\} (\S+)$', re.M
)


def page_time(base: str) -> tuple[float, float]:
    """Seconds the server spent answering, and requests it answered, on every HTTP route
    but infer (the page's own requests, and this scrape's): from /metrics."""
    text = httpx.get(f"{base}/metrics").text
    seconds = sum(float(v) for e, v in _ENDPOINT_SUM.findall(text) if e != "V2Http.infer")
    count = sum(float(v) for e, v in _ENDPOINT_COUNT.findall(text) if e != "V2Http.infer")
    return seconds, count


def wrk(url: str, seconds: float, script: Path) -> float:
    out = subprocess.run(
        ["wrk", "-t1", "-c16", f"-d{round(seconds)}s", "-s", str(script), url],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    found = re.search(r"Requests/sec:\s+([\d.]+)", out)
    if found is None:
        raise RuntimeError(f"wrk printed no rate:\n{out}")
    return float(found.group(1))


def idle_cost(browser: Any, server: ServerProcess, seconds: float) -> tuple[float, float]:
    """The server's CPU use (% of one core) with no load, without and with the page open:
    the page's own cost, which CPU contention does not inflate as it does wall times."""
    assert server.proc is not None
    found = []
    for dashboard in (False, True):
        page = None
        if dashboard:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto(f"{server.http_url}/dashboard/#traffic")
            page.wait_for_selector("#panel-traffic .chart")
            time.sleep(1.5)
        before, started = cpu_s(server.proc.pid), time.monotonic()
        time.sleep(seconds)
        found.append((cpu_s(server.proc.pid) - before) / (time.monotonic() - started) * 100)
        if page is not None:
            page.close()
            time.sleep(2.0)
    print(
        f"idle server: {found[0]:.2f} % of one core without the page, {found[1]:.2f} % with it",
        flush=True,
    )
    return found[0], found[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--phase-s", type=float, default=10.0, help="seconds per phase")
    parser.add_argument("--rounds", type=int, default=5, help="off/on pairs")
    parser.add_argument("--idle-s", type=float, default=20.0, help="seconds per idle phase")
    parser.add_argument("--chromium", default=shutil.which("chromium") or "/usr/bin/chromium")
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        print("needs wrk (apt-get install wrk)", file=sys.stderr)
        return 2
    from playwright.sync_api import sync_playwright

    work = Path(tempfile.mkdtemp(prefix="dash-bench-"))
    repo = work / "models"
    write_demo_repository(repo, models=["half_plus_two"])
    script = work / "post.lua"
    script.write_text(
        'wrk.method = "POST"\n'
        'wrk.headers["Content-Type"] = "application/json"\n'
        f"wrk.body = [[{json.dumps(BODY)}]]\n"
    )
    server = ServerProcess(repo, extra_args=["--allow-grpc=false"]).start()
    assert server.proc is not None
    url = f"{server.http_url}/v2/models/half_plus_two/infer"
    results: list[dict[str, Any]] = []
    try:
        httpx.post(url, json=BODY).raise_for_status()
        wrk(url, 2, script)  # warm-up
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=args.chromium, args=LAUNCH_ARGS)
            browser_pid = _browser_pid()
            idle = idle_cost(browser, server, args.idle_s)
            for dashboard in [*(False, True) * args.rounds, False]:  # off, on, ..., on, off
                page = None
                if dashboard:
                    page = browser.new_page(viewport={"width": 1280, "height": 900})
                    page.goto(f"{server.http_url}/dashboard/#traffic")
                    page.wait_for_selector("#panel-traffic .chart")
                    time.sleep(1.5)
                page_before = page_time(server.http_url)
                server_before = cpu_s(server.proc.pid)
                browser_before = tree_cpu_s(browser_pid) if browser_pid else {}
                started = time.monotonic()
                rate = wrk(url, args.phase_s, script)
                wall = time.monotonic() - started
                server_cpu = cpu_s(server.proc.pid) - server_before
                browser_cpu = (
                    spent_s(browser_before, tree_cpu_s(browser_pid)) if browser_pid else 0.0
                )
                page_after = page_time(server.http_url)
                if page is not None:
                    page.close()
                    time.sleep(2.0)  # let the browser tear the page down before "off"
                results.append(
                    {
                        "dashboard": dashboard,
                        "req_s": rate,
                        "server_cpu_us_per_req": server_cpu / (rate * wall) * 1e6,
                        "browser_cpu_pct": browser_cpu / wall * 100,
                        "page_requests_s": (page_after[1] - page_before[1] - 1) / wall,
                        "page_server_ms_s": (page_after[0] - page_before[0]) / wall * 1e3,
                    }
                )
                r = results[-1]
                print(
                    f"dashboard {'on ' if dashboard else 'off'}: {rate:8.0f} req/s, "
                    f"server {r['server_cpu_us_per_req']:5.0f} CPU-us/req, "
                    f"browser {r['browser_cpu_pct']:4.1f} % CPU, page "
                    f"{r['page_requests_s']:.1f} req/s taking {r['page_server_ms_s']:.2f} "
                    "ms/s of the server",
                    flush=True,
                )
            browser.close()
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    off = [r["req_s"] for r in results if not r["dashboard"]]
    on = [r["req_s"] for r in results if r["dashboard"]]
    off_cpu = statistics.mean(r["server_cpu_us_per_req"] for r in results if not r["dashboard"])
    on_cpu = statistics.mean(r["server_cpu_us_per_req"] for r in results if r["dashboard"])
    loss = (1 - statistics.mean(on) / statistics.mean(off)) * 100
    median_loss = (1 - statistics.median(on) / statistics.median(off)) * 100
    # Each "on" phase against the mean of the "off" phases either side of it: slow drift of a
    # shared machine cancels out of these ratios.
    ratios = []
    for i, r in enumerate(results):
        if r["dashboard"]:
            around = [results[j]["req_s"] for j in (i - 1, i + 1) if 0 <= j < len(results)]
            ratios.append(r["req_s"] / statistics.mean(around))
    paired_loss = (1 - statistics.median(ratios)) * 100
    page_ms = statistics.mean(r["page_server_ms_s"] for r in results if r["dashboard"])
    page_rate = statistics.mean(r["page_requests_s"] for r in results if r["dashboard"])
    browser = statistics.mean(r["browser_cpu_pct"] for r in results if r["dashboard"])
    print(
        f"\nhalf_plus_two, c=16, {args.rounds} x {args.phase_s:.0f} s per side:\n"
        f"  without dashboard: mean {statistics.mean(off):6.0f} req/s, median "
        f"{statistics.median(off):6.0f}  ({off_cpu:.0f} server CPU-us/req)\n"
        f"  with dashboard:    mean {statistics.mean(on):6.0f} req/s, median "
        f"{statistics.median(on):6.0f}  ({on_cpu:.0f} server CPU-us/req)\n"
        f"  loss: {loss:.1f} % of the mean, {median_loss:.1f} % of the median; "
        f"load average {os.getloadavg()[0]:.2f}\n"
        f"  paired (each 'on' phase against the 'off' phases beside it): median loss "
        f"{paired_loss:.1f} %\n"
        f"  the open page: {page_rate:.1f} requests/s, answered in {page_ms:.2f} ms per second "
        f"(wall time, inflated by CPU contention); the browser itself: {browser:.1f} % of one "
        f"core\n  the page's server CPU with no load: {idle[1] - idle[0]:.2f} % of one core "
        f"({idle[0]:.2f} % -> {idle[1]:.2f} %)"
    )
    return 0


def _browser_pid() -> int | None:
    """The pid of the chromium this script launched (the newest chromium child of ours)."""
    me = os.getpid()
    found: list[int] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if b"chromium" not in cmdline or b"--headless" not in cmdline:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        if _descends_from(parent, me):
            found.append(int(entry.name))
    return min(found) if found else None


def _descends_from(pid: int, ancestor: int) -> bool:
    while pid > 1:
        if pid == ancestor:
            return True
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except OSError:
            return False
    return False


if __name__ == "__main__":
    sys.exit(main())
