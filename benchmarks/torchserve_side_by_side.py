"""inferd against the real TorchServe 0.12 on TorchServe's own example archives, in one run.

Both servers serve the same ``.mar`` files, built by ``torch-model-archiver`` as TorchServe's
repository builds them:

- ``mnist``: TorchServe's ``examples/image_classifier/mnist`` (the eager ``mnist.py`` model, its
  ``mnist_handler.py`` with PIL preprocessing; ``torchserve_examples/``, weights made here),
  batch size 1, a 28x28 PNG per request;
- ``mnist_batch``: the same model and handler with TorchServe's batching (``batchSize: 8``,
  ``maxBatchDelay: 10`` in the archive's ``model-config.yaml``): the handler gets a list;
- ``linear``: a TorchScript linear model behind a ``BaseHandler`` subclass
  (``tests/e2e/torchserve_support``), a small JSON body;
- ``noop``: a handler that answers ``0`` to each request without looking at it, sent mnist's
  PNG: what each server costs around a handler (not in the default list).

The same number of worker processes each, one torch thread per worker (``OMP_NUM_THREADS=1``),
TorchServe with its request logging off (its default logs several lines per request). wrk sends
``POST /predictions/<model>``; each pass measures TorchServe then inferd (the order alternates),
with the CPU seconds of each server's whole process tree (Java or the serving processes, and
every handler worker; psutil over the children) over the window. Prints req/s, p50/p99, errors
and CPU-µs per request per pass (for inferd also the rows per execution and the mean queue time
over the window, from its statistics API: how full its batches were), then the medians and the
ratios inferd/TorchServe (req/s ratios are only meaningful within one run on a shared host; CPU
per request is the steadier figure). Each server gets ``--warmup`` seconds of load before its
first pass of an archive: TorchServe's Java frontend compiles its hot paths over its first minute
or so of traffic, and its CPU per request falls while it does, so a short warm-up measures part
of that compiling.
Needs ``wrk``, Java and a venv with ``torchserve``::

    INFERD_TORCHSERVE_VENV=/tmp/torchserve-venv .venv/bin/python \\
        benchmarks/torchserve_side_by_side.py [--examples mnist,mnist_batch,linear] \\
        [--seconds 8] [--passes 3] [--workers 1] [-c 16] [--warmup 2]
"""

from __future__ import annotations

import argparse
import importlib.util
import io
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "benchmarks" / "torchserve_examples"
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from core_bench import wrk  # noqa: E402

from tests.e2e.torchserve_peer import TorchServePeer, peer_venv  # noqa: E402
from tests.e2e.torchserve_support import Ports, archive, build_store  # noqa: E402
from tests.support import ServerProcess  # noqa: E402

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


@dataclass
class Example:
    """One archive of the store: the body wrk sends and the answer both servers must give
    (None: the same answer, whatever it is: the mnist weights are untrained)."""

    body: bytes
    content_type: str
    expected: object = None


def digit_png() -> bytes:
    """A 28x28 grayscale PNG of a thick vertical stroke (a "1")."""
    from PIL import Image

    picture = Image.new("L", (28, 28))
    for y in range(4, 24):
        for x in range(12, 16):
            picture.putpixel((x, y), 255)
    found = io.BytesIO()
    picture.save(found, "PNG")
    return found.getvalue()


def mnist_archives(work: Path, store: Path) -> None:
    """``mnist.mar`` and ``mnist_batch.mar`` as TorchServe's example README builds them, from
    weights made here (seeded: nothing is downloaded)."""
    import torch

    spec = importlib.util.spec_from_file_location("ts_example_mnist", EXAMPLES / "mnist.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    torch.manual_seed(0)
    work.mkdir(parents=True, exist_ok=True)
    torch.save(module.Net().state_dict(), work / "mnist_cnn.pt")
    files = (
        "--model-file",
        str(EXAMPLES / "mnist.py"),
        "--serialized-file",
        str(work / "mnist_cnn.pt"),
    )
    handler = str(EXAMPLES / "mnist_handler.py")
    archive(work, store, "mnist", "1.0", handler, *files)
    config = ("--config-file", str(EXAMPLES / "mnist_batch.yaml"))
    archive(work, store, "mnist_batch", "1.0", handler, *files, *config)


NOOP_HANDLER = """
def handle(data, context):
    if data is None:  # the initialization call
        return None
    return [0] * len(data)
"""


def noop_archive(work: Path, store: Path) -> None:
    """``noop.mar``: a handler that does nothing, to measure what is around it."""
    work.mkdir(parents=True, exist_ok=True)
    (work / "noop_handler.py").write_text(NOOP_HANDLER)
    archive(work, store, "noop", "1.0", "noop_handler.py")


def tree_cpu_s(pid: int) -> float:
    """CPU seconds of a process and every live descendant."""
    root = psutil.Process(pid)
    total = 0.0
    for proc in [root, *root.children(recursive=True)]:
        try:
            times = proc.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def batching(stats_url: str) -> tuple[int, int, int, int]:
    """inferd's executions, rows, queued requests and their queue ns (statistics API)."""
    found = httpx.get(stats_url, timeout=30).json()["model_stats"]
    queue = [s["inference_stats"]["queue"] for s in found]
    return (
        sum(int(s["execution_count"]) for s in found),
        sum(int(s["inference_count"]) for s in found),
        sum(int(q["count"]) for q in queue),
        sum(int(q["ns"]) for q in queue),
    )


def measure(
    url: str,
    pid: int,
    body: Path,
    content_type: str,
    conns: int,
    seconds: float,
    warmup_s: float = 2.0,
    stats_url: str | None = None,
) -> dict[str, float]:
    """One pass; with ``stats_url`` (inferd's statistics of the model) also the rows per
    execution and the mean queue time over the measured window."""
    headers = {"Content-Type": content_type}
    wrk(url, body, headers, conns, warmup_s)
    time.sleep(1)
    before = batching(stats_url) if stats_url else None
    start = tree_cpu_s(pid)
    result = wrk(url, body, headers, conns, seconds)
    cpu_s = tree_cpu_s(pid) - start
    result["cpu_us_per_request"] = cpu_s * 1e6 / max(result["requests"], 1)
    result["cores"] = cpu_s / seconds
    if stats_url and before:
        after = batching(stats_url)
        executions, rows, queued, queue_ns = (a - b for a, b in zip(after, before, strict=True))
        result["rows_per_execution"] = rows / max(executions, 1)
        result["queue_us"] = queue_ns / 1000 / max(queued, 1)
    return result


def _line(label: str, r: dict[str, float]) -> str:
    line = (
        f"{label:11s} {r['rps']:8.0f} req/s  p50 {r['p50'] / 1000:6.2f} ms  "
        f"p99 {r['p99'] / 1000:6.2f} ms  errors {int(r['errors']):4d}  "
        f"{r['cpu_us_per_request']:7.0f} CPU-us/req  {r['cores']:.2f} cores"
    )
    if "rows_per_execution" in r:
        line += f"  {r['rows_per_execution']:.2f} rows/execution  queue {r['queue_us']:.0f} us"
    return line


def compare(
    name: str,
    example: Example,
    targets: dict[str, tuple[str, int]],
    work: Path,
    args: argparse.Namespace,
    stats_url: str,
) -> None:
    body = work / f"{name}.body"
    body.write_bytes(example.body)
    headers = {"content-type": example.content_type}
    answers = []
    for url, _ in targets.values():
        answer = httpx.post(f"{url}/predictions/{name}", content=example.body, headers=headers)
        assert answer.status_code == 200, answer.text
        answers.append(answer.json())
    assert answers[0] == answers[1], answers
    assert example.expected is None or answers[0] == example.expected, answers
    results: dict[str, list[dict[str, float]]] = {server: [] for server in targets}
    print(
        f"\n{name}.mar, {args.workers} worker(s) each, c={args.connections}, "
        f"{args.seconds:g} s x {args.passes} pass(es) after {args.warmup:g} s of warm-up, "
        f"load average {os.getloadavg()[0]:.2f}"
    )
    for index in range(args.passes):
        order = list(targets) if index % 2 == 0 else list(reversed(targets))
        for server in order:
            url, pid = targets[server]
            found = measure(
                f"{url}/predictions/{name}",
                pid,
                body,
                example.content_type,
                args.connections,
                args.seconds,
                args.warmup if index == 0 else 2.0,
                f"{stats_url}/v2/models/{name}/stats" if server == "inferd" else None,
            )
            results[server].append(found)
            print(f"pass {index + 1} " + _line(server, found), flush=True)
    medians = {
        server: {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        for server, runs in results.items()
    }
    print("median")
    for server, found in medians.items():
        print("       " + _line(server, found))
    rps = medians["inferd"]["rps"] / medians["torchserve"]["rps"]
    cpu = medians["inferd"]["cpu_us_per_request"] / medians["torchserve"]["cpu_us_per_request"]
    print(f"{name}: inferd / TorchServe: {rps:.2f}x req/s, {cpu:.2f}x CPU-us per request")
    per_pass = [
        i["rps"] / t["rps"] for i, t in zip(results["inferd"], results["torchserve"], strict=True)
    ]
    print("req/s ratio per pass: " + ", ".join(f"{r:.2f}" for r in per_pass))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", default="mnist,mnist_batch,linear")
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("-c", "--connections", type=int, default=16)
    parser.add_argument(
        "--warmup",
        type=float,
        default=2.0,
        help="seconds of load on each server before its first pass of an archive (TorchServe's "
        "Java compiles its hot paths during the first tens of seconds, which its CPU then counts)",
    )
    args = parser.parse_args()
    venv = peer_venv()
    if venv is None:
        sys.exit("set INFERD_TORCHSERVE_VENV to a venv with torchserve 0.12 (Java needed too)")
    os.environ["OMP_NUM_THREADS"] = "1"  # both servers' handler workers inherit it
    work = Path(tempfile.mkdtemp(prefix="ts-bench-"))
    store = build_store(work / "archives")
    mnist_archives(work / "mnist", store)
    noop_archive(work / "noop", store)
    png = digit_png()
    examples = {
        "mnist": Example(png, "application/octet-stream"),
        "mnist_batch": Example(png, "application/octet-stream"),
        "linear": Example(b'{"x": [1, 2, 3, 4]}', "application/json", {"y": [2.0, 6.0]}),
        "noop": Example(png, "application/octet-stream", 0),
    }
    chosen = [n for n in args.examples.split(",") if n]
    unknown = set(chosen) - set(examples)
    if unknown:
        sys.exit(f"unknown examples {sorted(unknown)}; choose from {sorted(examples)}")
    (work / "quiet.xml").write_text(QUIET_LOG)
    models = [f"{n}={n}.mar" for n in chosen]
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
            "torchserve": (peer.inference_url, peer.proc.pid),
            "inferd": (ports.inference_url, ours.proc.pid),
        }
        for name in chosen:
            compare(name, examples[name], targets, work, args, ours.http_url)
        print(f"\nload average after: {os.getloadavg()[0]:.2f}")
    finally:
        ours.stop()
        peer.stop()


if __name__ == "__main__":
    main()
