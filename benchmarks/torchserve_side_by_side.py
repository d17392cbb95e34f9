"""inferd against the real TorchServe 0.12 on the same .mar and handler, in one run.

Both serve ``linear.mar`` (a TorchScript model behind a ``BaseHandler`` subclass with its own
preprocess and postprocess, built by ``torch-model-archiver``; ``tests/e2e/torchserve_support``)
with the same number of worker processes and batch size 1, one torch thread per worker
(``OMP_NUM_THREADS=1``), TorchServe with its request logging off (its default logs several
lines per request). wrk sends ``POST /predictions/linear`` with a JSON body at concurrency
16; each pass measures TorchServe then inferd (the order alternates), with the CPU seconds of
each server's whole process tree (Java or the event loop, and every handler worker) over the
window. Prints req/s, p50/p99, errors and CPU-µs per request per pass, then the medians and
the ratios inferd/TorchServe. Needs ``wrk``, Java and a venv with ``torchserve``::

    INFERD_TORCHSERVE_VENV=/tmp/torchserve-venv .venv/bin/python \\
        benchmarks/torchserve_side_by_side.py [--seconds 8] [--passes 3] [--workers 2] [-c 16]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from core_bench import process_cpu_s, wrk  # noqa: E402

from tests.e2e.torchserve_peer import TorchServePeer, peer_venv  # noqa: E402
from tests.e2e.torchserve_support import Ports, build_store  # noqa: E402
from tests.support import ServerProcess  # noqa: E402

BODY = b'{"x": [1, 2, 3, 4]}'
QUIET_LOG = """<?xml version="1.0" encoding="UTF-8"?>
<Configuration>
  <Appenders><Console name="STDOUT" target="SYSTEM_OUT">
    <PatternLayout pattern="%d %-5p %c - %m%n"/></Console></Appenders>
  <Loggers>
    <Logger name="ACCESS_LOG" level="off" additivity="false"/>
    <Logger name="MODEL_LOG" level="warn" additivity="false"><AppenderRef ref="STDOUT"/></Logger>
    <Logger name="MODEL_METRICS" level="off" additivity="false"/>
    <Logger name="TS_METRICS" level="off" additivity="false"/>
    <Root level="warn"><AppenderRef ref="STDOUT"/></Root>
  </Loggers>
</Configuration>
"""


def measure(url: str, pid: int, body: Path, conns: int, seconds: float) -> dict[str, float]:
    headers = {"Content-Type": "application/json"}
    wrk(url, body, headers, conns, 2)  # warm-up
    time.sleep(1)
    start = process_cpu_s(pid)
    result = wrk(url, body, headers, conns, seconds)
    cpu_s = process_cpu_s(pid) - start
    result["cpu_us_per_request"] = cpu_s * 1e6 / max(result["requests"], 1)
    result["cores"] = cpu_s / seconds
    return result


def _line(label: str, r: dict[str, float]) -> str:
    return (
        f"{label:11s} {r['rps']:8.0f} req/s  p50 {r['p50'] / 1000:6.2f} ms  "
        f"p99 {r['p99'] / 1000:6.2f} ms  errors {int(r['errors']):4d}  "
        f"{r['cpu_us_per_request']:7.0f} CPU-us/req  {r['cores']:.2f} cores"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("-c", "--connections", type=int, default=16)
    args = parser.parse_args()
    venv = peer_venv()
    if venv is None:
        sys.exit("set INFERD_TORCHSERVE_VENV to a venv with torchserve 0.12 (Java needed too)")
    os.environ["OMP_NUM_THREADS"] = "1"  # both servers' handler workers inherit it
    work = Path(tempfile.mkdtemp(prefix="ts-bench-"))
    store = build_store(work / "archives")
    body = work / "body.json"
    body.write_bytes(BODY)
    (work / "quiet.xml").write_text(QUIET_LOG)
    models = ["linear=linear.mar"]
    peer = TorchServePeer(venv, store, work / "peer", models, workers=args.workers)
    peer.extra_args = ["--log-config", str(work / "quiet.xml")]
    ports = Ports()
    repository = work / "repository"
    repository.mkdir()
    ours = ServerProcess(
        repository,
        [
            "--model-store",
            str(store),
            "--models",
            *models,
            "--default-workers-per-model",
            str(args.workers),
            *ports.args(),
        ],
    )
    peer.start()
    ours.start(timeout_s=120)
    try:
        assert peer.proc is not None and ours.proc is not None
        targets = {
            "torchserve": (f"{peer.inference_url}/predictions/linear", peer.proc.pid),
            "inferd": (f"{ports.inference_url}/predictions/linear", ours.proc.pid),
        }
        for url, _ in targets.values():
            answer = httpx.post(url, content=BODY, headers={"content-type": "application/json"})
            assert answer.status_code == 200 and answer.json() == {"y": [2.0, 6.0]}, answer.text
        results: dict[str, list[dict[str, float]]] = {name: [] for name in targets}
        print(
            f"linear.mar, {args.workers} worker(s) each, c={args.connections}, "
            f"{args.seconds:g} s x {args.passes} pass(es), load average "
            f"{os.getloadavg()[0]:.2f}"
        )
        for index in range(args.passes):
            order = list(targets) if index % 2 == 0 else list(reversed(targets))
            for name in order:
                url, pid = targets[name]
                found = measure(url, pid, body, args.connections, args.seconds)
                results[name].append(found)
                print(f"pass {index + 1} " + _line(name, found), flush=True)
        medians = {
            name: {k: statistics.median(r[k] for r in runs) for k in runs[0]}
            for name, runs in results.items()
        }
        print("median")
        for name, found in medians.items():
            print("       " + _line(name, found))
        rps = medians["inferd"]["rps"] / medians["torchserve"]["rps"]
        cpu = medians["inferd"]["cpu_us_per_request"] / medians["torchserve"]["cpu_us_per_request"]
        print(f"inferd / TorchServe: {rps:.2f}x req/s, {cpu:.2f}x CPU-us per request")
        per_pass = [
            i["rps"] / t["rps"]
            for i, t in zip(results["inferd"], results["torchserve"], strict=True)
        ]
        print("req/s ratio per pass: " + ", ".join(f"{r:.2f}" for r in per_pass))
        print(f"load average after: {os.getloadavg()[0]:.2f}")
    finally:
        ours.stop()
        peer.stop()


if __name__ == "__main__":
    main()
