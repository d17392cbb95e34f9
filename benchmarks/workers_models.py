"""Several serving processes with the models in one: the default ``--http-workers`` (auto)
against one process, in the same run, pass after pass (ABBA order, so a load that drifts during
a pass favours neither), with the server's CPU-µs per request (its whole process tree).

- ``json``: half_plus_two v2 JSON at concurrency 16 (wrk, keep-alive): req/s;
- ``digits``: the demo digits MLP at concurrency 64, one row per request, HTTP binary tensors,
  without and with dynamic batching (500 µs): req/s, and the mean executed batch;
- ``mlp``: the wide MLP (1024-4096-4096-1024) at concurrency 64 with dynamic batching, rows/s
  against onnxruntime in this process at batch 32, taken every pass;
- ``memory``: the demo repository (``inferd demo-models``, TensorFlow's SavedModel included
  when TensorFlow is installed, and without it): idle RSS and PSS of the server's process tree
  once every worker serves, and the cold start: until ``/v2/health/ready`` first answers 200
  (a balancer sends traffic), and until every worker listens;
- ``peers``: with ``--peers``, the peer servers of ``../shared/peers`` (set up by its
  ``setup.sh``, started and stopped by their own scripts) and inferd with one worker and with
  the default setting, one pass of the peer harness (wrk, c=16) each, half_plus_two over HTTP
  JSON, in the same run.

    PYTHONPATH=src .venv/bin/python benchmarks/workers_models.py [--passes 3] [--seconds 8] \\
        [--only json,digits,mlp,memory] [--workers auto] [--peers ../shared/peers]

On a host of one or two cores auto is one process: ``--workers 2`` measures the model host and
a frontend there.

Needs ``wrk`` (Debian: wrk).
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
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from core_bench import (  # noqa: E402
    CACHE,
    DIGITS_INPUT,
    JSON_BODY,
    MLP_DIMS,
    binary_body,
    build_repository,
    cpu_window,
    inprocess_mlp_rows_s,
    wrk,
)

from inferd.demo.models import write_demo_repository  # noqa: E402
from tests.support import ServerProcess  # noqa: E402

PARTS = ("json", "digits", "mlp", "memory")
RNG = np.random.default_rng(3)
JSON_HEADERS = {"Content-Type": "application/json"}


def load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def tree(pid: int) -> list[int]:
    """``pid`` and every live descendant."""
    children: dict[int, list[int]] = {}
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except OSError:
                continue
            children.setdefault(ppid, []).append(int(proc.name))
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(children.get(current, []))
    return found


def memory_mb(pid: int) -> tuple[float, float, int]:
    """RSS and PSS of a process tree in MB, and how many processes it has."""
    rss = pss = 0
    pids = tree(pid)
    for p in pids:
        try:
            for line in Path(f"/proc/{p}/smaps_rollup").read_text().splitlines():
                if line.startswith("Rss:"):
                    rss += int(line.split()[1])
                elif line.startswith("Pss:"):
                    pss += int(line.split()[1])
        except OSError:
            continue
    return rss / 1024, pss / 1024, len(pids)


def worker_count(log: str) -> int:
    found = re.search(r"(\d+) HTTP workers", log)
    return int(found.group(1)) if found else 1


def serving(server: ServerProcess) -> bool:
    """Every worker listens (a frontend binds once it has the host's models)."""
    log = server.log()
    return log.count("listening: HTTP") >= worker_count(log)


def start(
    repo: Path, workers: str, name: str, timeout_s: float = 240
) -> tuple[ServerProcess, float, float]:
    """A server with ``--http-workers workers`` once every worker serves; the seconds until
    ``/v2/health/ready`` first answered 200, and until every worker listened."""
    env = {"INFERD_HTTP_WORKERS": workers, "PYTHONPATH": str(ROOT / "src")}
    server = ServerProcess(repo, env=env, log_path=CACHE / f"workers-{name}.log")
    started = time.monotonic()
    first: list[float] = []

    def watch() -> None:
        while not first and time.monotonic() - started < timeout_s:
            try:
                if httpx.get(f"{server.http_url}/v2/health/ready", timeout=1).status_code == 200:
                    first.append(time.monotonic() - started)
            except httpx.HTTPError:
                time.sleep(0.02)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    server.start(timeout_s=timeout_s)
    while not serving(server):
        if time.monotonic() - started > timeout_s:
            server.stop()
            raise RuntimeError(f"not every worker serves:\n{server.log()}")
        time.sleep(0.02)
    every = time.monotonic() - started
    watcher.join(timeout_s)
    return server, (first[0] if first else every), every


# --------------------------------------------------------------------------- throughput


# One load each: (name, model, input name, a row, connections, JSON body?).
LOADS: dict[str, tuple[str, str, np.ndarray | None, int]] = {
    "json": ("half_plus_two", "x", None, 16),
    "digits_plain": ("digits_plain", DIGITS_INPUT, RNG.random((1, 64), dtype=np.float32) * 16, 64),
    "digits_batched": ("digits_batched", DIGITS_INPUT, RNG.random((1, 64), dtype=np.float32), 64),
    "mlp_batched": (
        "mlp_batched",
        "input",
        RNG.standard_normal((1, MLP_DIMS[0]), dtype=np.float32),
        64,
    ),
}


def one_load(server: ServerProcess, load: str, seconds: float, work: Path) -> dict[str, Any]:
    """req/s (rows/s: one row per request), CPU-µs per request and errors of one load on one
    server (wrk, after 2 s of warm-up)."""
    model, input_name, row, conns = LOADS[load]
    body = work / f"{load}.body"
    if row is None:
        body.write_text(JSON_BODY)
        headers = {"Content-Type": "application/json"}
    else:
        raw, headers = binary_body(input_name, row)
        body.write_bytes(raw)
    url = f"{server.http_url}/v2/models/{model}/infer"
    assert server.proc is not None
    wrk(url, body, headers, conns, 2)
    with cpu_window(server.proc.pid) as cpu:
        r = wrk(url, body, headers, conns, seconds)
    return {
        "rps": r["rps"],
        "cpu_us": cpu["cpu_s"] / max(1, r["requests"]) * 1e6,
        "errors": r["errors"],
    }


def mean_batch(server: ServerProcess, model: str) -> float:
    stats = httpx.get(f"{server.http_url}/v2/models/{model}/stats", timeout=30).json()
    executed = stats["model_stats"][0]
    return float(executed["inference_count"]) / max(1, int(executed["execution_count"]))


def throughput(repo: Path, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Both servers up at once (an idle one costs nothing); each load alternates between them
    round after round (ABBA), the wide MLP's in-process reference taken in the same rounds."""
    settings = ("1", args.workers)
    servers = {s: start(repo, s, f"load-{s}")[0] for s in settings}
    work = Path(tempfile.mkdtemp())
    rows: list[dict[str, Any]] = []
    loads = [name for name in LOADS if name.split("_")[0] in args.only]
    try:
        for number in range(1, args.passes + 1):
            order = settings if number % 2 else settings[::-1]
            for load in loads:
                if load == "mlp_batched":
                    rows.append(
                        {"pass": number, "workers": "in-process", "load": load, "rps": (
                            inprocess_mlp_rows_s(min(args.seconds, 5.0))
                        ), "cpu_us": 0.0, "errors": 0, "host": load_average()}
                    )  # fmt: skip
                for setting in order:
                    row = one_load(servers[setting], load, args.seconds, work)
                    row |= {"pass": number, "workers": setting, "load": load}
                    row["host"] = load_average()
                    rows.append(row)
                    print(json.dumps(row), flush=True)
        for setting, server in servers.items():
            for model in ("digits_batched", "mlp_batched"):
                if model.split("_")[0] in args.only:
                    print(f"{setting}: mean executed batch of {model}: "
                          f"{mean_batch(server, model):.1f}")  # fmt: skip
            found = server.log().count("loaded model 'digits_batched' version 1")
            print(f"{setting}: 'loaded model digits_batched' logged {found} time(s)")
    finally:
        for server in servers.values():
            server.stop()
        shutil.rmtree(work, ignore_errors=True)
    return rows


def throughput_report(rows: list[dict[str, Any]], workers: str) -> None:
    def value(setting: str, load: str, number: int, key: str = "rps") -> float:
        for r in rows:
            if (r["workers"], r["load"], r["pass"]) == (setting, load, number):
                return float(r[key])
        return float("nan")

    passes = sorted({r["pass"] for r in rows})
    loads = list(dict.fromkeys(r["load"] for r in rows))
    print(f"\n| load | 1 worker req/s | {workers} req/s | {workers}/1 | CPU-µs/req 1 | {workers} |")
    print("|---|---|---|---|---|---|")
    for load in loads:
        one = statistics.median(value("1", load, n) for n in passes)
        many = statistics.median(value(workers, load, n) for n in passes)
        ratio = statistics.median(value(workers, load, n) / value("1", load, n) for n in passes)
        cpu1 = statistics.median(value("1", load, n, "cpu_us") for n in passes)
        cpun = statistics.median(value(workers, load, n, "cpu_us") for n in passes)
        print(f"| {load} | {one:,.0f} | {many:,.0f} | {ratio:.2f} | {cpu1:,.1f} | {cpun:,.1f} |")
    print("(medians over passes; the ratio is the median of the per-pass ratios)")
    for setting in ("1", workers):
        if "digits_plain" in loads:
            r = statistics.median(
                value(setting, "digits_batched", n) / value(setting, "digits_plain", n)
                for n in passes
            )
            print(f"{setting}: digits batched / unbatched req/s {r:.2f}x")
        if "mlp_batched" in loads:
            r = statistics.median(
                value(setting, "mlp_batched", n) / value("in-process", "mlp_batched", n)
                for n in passes
            )
            print(
                f"{setting}: wide MLP batched rows/s / onnxruntime in process at batch 32 {r:.2f}"
            )


# --------------------------------------------------------------------------- memory


def demo_repositories() -> dict[str, Path]:
    """The demo repository, with and without TensorFlow's SavedModel."""
    full = CACHE / "demo-full"
    if not (full / "resnet" / "config.pbtxt").exists():
        subprocess.run(
            [sys.executable, "-m", "inferd", "demo-models", str(full)],
            check=True, env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
        )  # fmt: skip
    repos = {"demo": full}
    if (full / "saved_model_half_plus_two").exists():
        lean = CACHE / "demo-no-tf"
        if not lean.exists():
            lean.mkdir()
            for child in full.iterdir():
                if child.name != "saved_model_half_plus_two":
                    os.symlink(child, lean / child.name)
        repos = {"demo with TensorFlow": full, "demo without TensorFlow": lean}
    return repos


def memory(repo: Path, workers: str, label: str) -> dict[str, Any]:
    server, ready_s, cold_s = start(repo, workers, f"memory-{workers}")
    assert server.proc is not None
    try:
        time.sleep(3.0)  # idle: warmups done, allocator settled
        rss, pss, processes = memory_mb(server.proc.pid)
        loads = len(re.findall(r"loaded model 'resnet50' version", server.log()))
    finally:
        server.stop()
    return {
        "repository": label,
        "workers": workers,
        "count": worker_count(server.log()),
        "ready_s": ready_s,
        "cold_start_s": cold_s,
        "rss_mb": rss,
        "pss_mb": pss,
        "processes": processes,
        "resnet50_loads": loads,
    }


# --------------------------------------------------------------------------- peers


PEER_PROBES = (
    ("http://127.0.0.1:18080/v2/models/half_plus_two/infer", "v2_half_plus_two.json"),
    ("http://127.0.0.1:18085/predictions/half_plus_two", "plain_half_plus_two.json"),
    ("http://127.0.0.1:18090/predict/half_plus_two", "plain_half_plus_two.json"),
)


def wait_peer(url: str, body: Path, timeout_s: float = 180.0) -> None:
    """Until a peer answers its half_plus_two request with 200 (as the harness's run_all.sh
    waits); a peer that does not is left out of the pass by the harness."""
    deadline = time.monotonic() + timeout_s
    data = body.read_bytes()
    while time.monotonic() < deadline:
        try:
            answer = httpx.post(url, content=data, timeout=5, headers=JSON_HEADERS)
            if answer.status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    print(f"peer {url} did not answer in {timeout_s:.0f} s", flush=True)


def peers_json(peers: Path, workers: str, passes: int, seconds: float) -> list[dict[str, Any]]:
    """half_plus_two v2 JSON on inferd (one worker, and ``workers``) and the same tiny model on
    each peer (their own scripts start them), in one pass of the peer harness
    (``bench_servers.sh``, wrk at c=16) per pass: inferd rides on its EXTRA_CELLS hook."""
    results = CACHE / "peers.jsonl"
    results.unlink(missing_ok=True)
    body = peers / "bodies" / "v2_half_plus_two.json"
    starts = [peers / p / "start.sh" for p in ("mlserver", "torchserve", "litserve")]
    for number in range(1, passes + 1):
        servers = []
        try:
            for start_script in starts:
                subprocess.run([str(start_script)], check=False, capture_output=True)
            for url, probe in PEER_PROBES:
                wait_peer(url, peers / "bodies" / probe)
            repo = CACHE / "peers-repo"
            if not repo.exists():
                write_demo_repository(repo, models=["half_plus_two"])
            cells = CACHE / "peers-cells.txt"
            lines = []
            for setting in ("1", workers):
                server, _, _ = start(repo, setting, f"peers-{setting}")
                servers.append(server)
                assert server.proc is not None
                url = f"{server.http_url}/v2/models/half_plus_two/infer"
                lines.append(
                    f"inferd[{setting}]/half_plus_two(v2 json)|{url}|{body}|{server.proc.pid}|"
                )
            cells.write_text("\n".join(lines) + "\n")
            env = {
                **os.environ,
                "CONCS": "16",
                "DUR": str(int(seconds)),
                "JSON_OUT": str(results),
                "PASS": str(number),
                "EXTRA_CELLS": str(cells),
                "ONLY": "half_plus_two",
            }
            subprocess.run([str(peers / "bench_servers.sh")], env=env, check=False)
        finally:
            for server in servers:
                server.stop()
            for start_script in starts:
                subprocess.run([str(start_script.with_name("stop.sh"))], capture_output=True)
    if not results.exists():
        return []
    return [json.loads(line) for line in results.read_text().splitlines() if line.strip()]


# --------------------------------------------------------------------------- report


def _ratio(a: list[dict[str, Any]], b: list[dict[str, Any]], key: str) -> float:
    """median of ``a``'s figures / median of ``b``'s."""
    mine = statistics.median(float(f[key]) for f in a)
    return mine / statistics.median(float(f[key]) for f in b)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--only", default=",".join(PARTS))
    parser.add_argument("--workers", default="auto", help="the setting against one worker")
    parser.add_argument("--peers", type=Path, help="../shared/peers, set up: measure them too")
    args = parser.parse_args()
    args.only = set(args.only.split(","))
    CACHE.mkdir(parents=True, exist_ok=True)
    print(f"load average at start: {load_average()}", flush=True)
    if args.only & {"json", "digits", "mlp"}:
        throughput_report(throughput(build_repository(), args), args.workers)
    if "memory" in args.only:
        print(
            "\n| repository | workers | processes | idle RSS MB | idle PSS MB | "
            "first ready s | every worker serving s |"
        )
        print("|---|---|---|---|---|---|---|")
        for label, repo in demo_repositories().items():
            found = []
            for number in range(1, max(2, args.passes) + 1):
                order = ("1", args.workers) if number % 2 else (args.workers, "1")
                for workers in order:
                    found.append(memory(repo, workers, label))
            for workers in ("1", args.workers):
                mine = [f for f in found if f["workers"] == workers]
                print(
                    f"| {label} | {workers} ({mine[0]['count']}) | {mine[0]['processes']} | "
                    f"{statistics.median(f['rss_mb'] for f in mine):,.0f} | "
                    f"{statistics.median(f['pss_mb'] for f in mine):,.0f} | "
                    f"{statistics.median(f['ready_s'] for f in mine):.2f} | "
                    f"{statistics.median(f['cold_start_s'] for f in mine):.2f} |",
                    flush=True,
                )
            singles = [f for f in found if f["workers"] == "1"]
            several = [f for f in found if f["workers"] == args.workers]

            x = {
                k: _ratio(several, singles, k)
                for k in ("rss_mb", "pss_mb", "ready_s", "cold_start_s")
            }
            print(
                f"{label}: {args.workers}/1 idle RSS {x['rss_mb']:.2f}x, PSS "
                f"{x['pss_mb']:.2f}x, first ready {x['ready_s']:.2f}x, every worker "
                f"serving {x['cold_start_s']:.2f}x; resnet50 "
                f"loaded {several[0]['resnet50_loads']} time(s) with {args.workers}",
                flush=True,
            )
    if args.peers is not None:
        runs = peers_json(args.peers.resolve(), args.workers, args.passes, args.seconds)
        labels = sorted({r["label"] for r in runs})
        print("\n| half_plus_two, c=16 | req/s (median) | server CPU-us/req | load (1 min) |")
        print("|---|---|---|---|")
        for label in labels:
            mine = [r for r in runs if r["label"] == label]
            rps = statistics.median(float(r["rps"]) for r in mine)
            cpu_us = statistics.median(
                float(r.get("server_cores") or 0) / float(r["rps"]) * 1e6 for r in mine
            )
            load = ", ".join(f"{r['loadavg_1m']:.1f}" for r in mine)
            print(f"| {label} | {rps:,.0f} | {cpu_us:,.0f} | {load} |")
    print(f"load average at end: {load_average()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
