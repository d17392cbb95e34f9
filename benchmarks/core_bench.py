"""The core request path, measured against one or more source trees in the same run.

For each tree (``--tree LABEL=PATH``; default: this checkout) a server is started from that
tree's ``src`` and measured, trees interleaved pass by pass, so that "before" and "after" a
change are compared under the same host load:

1. ``half_plus_two`` v2 JSON at concurrency 16 (wrk, keep-alive): req/s and server CPU-µs per
   request (the server's process CPU over the requests it answered: the noise-robust figure);
   ``json64``: the same at concurrency 64; ``tfs`` and ``tfs64``: the same model through TF
   Serving's REST predict (``{"instances": [1.0]}``) at 16 and 64, printed as a ratio to v2's;
2. ``half_plus_two`` over gRPC at concurrency 16 (h2load, pre-encoded ModelInfer): req/s and
   CPU-µs/req, and the same tensor over HTTP binary (Inference-Header-Content-Length) with the
   same client (h2load --h1), so gRPC's ratio to HTTP comes from one client and one run;
3. ``resnet50``, batch 1, concurrency 1, HTTP binary tensors: median latency;
4. a wide MLP (1024-4096-4096-1024 FP32, fixed-seed random weights, ~100 MB) at concurrency 64,
   one row per request, HTTP binary tensors, with and without dynamic batching (preferred batch
   64, so that a batch holds every waiting client): rows/s, and against onnxruntime in this
   process at batch 32 (the issue's reference) and at batch 64;
5. the demo ``digits`` MLP at concurrency 64, one row per request, HTTP binary tensors, with and
   without dynamic batching: req/s and CPU-µs/req (batching must never lose);
6. ``empty``: the same JSON request as 1. to an RSGI handler that only reads the body and
   answers (``empty_rsgi.py``, granian with inferd's options), once per pass (also at
   concurrency 64 with ``json64``): the floor under any Python server here, so the JSON path's
   CPU-µs/req is also given as a multiple of it;
7. ``minimal``: the same request to ``empty_rsgi.py --minimal``, which does only the work no v2
   JSON server can skip (parse, array, run half_plus_two on the loop, encode) and nothing a
   server needs besides: a lower bound for the JSON path on this stack, as a multiple of 6;
   with ``mlp`` also selected, the batched wide MLP through ``empty_rsgi.py --batch`` (parse,
   queue, one batch of 64 at a time on a worker thread, answer: no validation, statistics or
   scheduling policy), against the same in-process reference as 4.

    .venv/bin/python benchmarks/core_bench.py --tree before=/tmp/base --tree after=. \\
        [--passes 3] [--seconds 8] [--only json,json64,tfs,tfs64,grpc,resnet,mlp,digits,empty,
        minimal] [--workers 1[,auto]]

``--workers N`` runs each server with ``--http-workers N`` (default 1, so that a figure is one
process's; ``auto`` is the server's default). Several settings (``--workers 1,auto``) measure
every tree with each, interleaved within the pass, and print each setting's req/s and CPU-µs per
request as a ratio to the first's, per tree.

The layout question in one run (the figures ``docs/performance.md`` gives)::

    .venv/bin/python benchmarks/core_bench.py --tree before=/tmp/base --tree after=. \\
        --only json,json64,tfs,tfs64,empty --workers 1,auto --passes 3 --seconds 6

Needs ``wrk`` and ``h2load`` (Debian: wrk, nghttp2-client).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.support import ServerProcess  # noqa: E402

CACHE = Path(os.environ.get("INFERD_BENCH_CACHE", "/tmp/inferd-core-bench"))
MLP_DIMS = (1024, 4096, 4096, 1024)
DIGITS_INPUT = "input"
TESTS = ("json", "json64", "tfs", "tfs64", "grpc", "resnet", "mlp", "digits", "empty", "minimal")
JSON_BODY = '{"inputs":[{"name":"x","shape":[1,1],"datatype":"FP32","data":[1.0]}]}'
TFS_BODY = '{"instances":[1.0]}'
# The JSON loads: test -> (path on the server, body, connections).
JSON_LOADS = {
    "json": ("/v2/models/half_plus_two/infer", JSON_BODY, 16),
    "json64": ("/v2/models/half_plus_two/infer", JSON_BODY, 64),
    "tfs": ("/v1/models/half_plus_two:predict", TFS_BODY, 16),
    "tfs64": ("/v1/models/half_plus_two:predict", TFS_BODY, 64),
}


# --------------------------------------------------------------------------- models


def wide_mlp_onnx(path: Path) -> None:
    """1024-4096-4096-1024 FP32 with ReLU between layers; weights from seed 0."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes, inits = [], []
    current = "input"
    for i, (n_in, n_out) in enumerate(itertools.pairwise(MLP_DIMS)):
        w = (rng.standard_normal((n_in, n_out), dtype=np.float32) / np.sqrt(n_in)).astype(
            np.float32
        )
        inits += [
            numpy_helper.from_array(w, f"w{i}"),
            numpy_helper.from_array(np.zeros(n_out, np.float32), f"b{i}"),
        ]
        out = "output" if i == len(MLP_DIMS) - 2 else f"h{i}"
        mm = f"mm{i}"
        nodes.append(helper.make_node("MatMul", [current, f"w{i}"], [mm]))
        if out == "output":
            nodes.append(helper.make_node("Add", [mm, f"b{i}"], [out]))
        else:
            nodes.append(helper.make_node("Add", [mm, f"b{i}"], [f"a{i}"]))
            nodes.append(helper.make_node("Relu", [f"a{i}"], [out]))
        current = out
    graph = helper.make_graph(
        nodes,
        "wide_mlp",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", MLP_DIMS[0]])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", MLP_DIMS[-1]])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    onnx.save(model, str(tmp))
    tmp.replace(path)


def build_repository() -> Path:
    repo = CACHE / "repo"
    demo = CACHE / "demo"
    if not (demo / "digits" / "1" / "model.onnx").exists():
        subprocess.run(
            [sys.executable, "-m", "inferd", "demo-models", str(demo), "--model",
             "half_plus_two", "--model", "resnet50", "--model", "digits"],
            check=True, env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
        )  # fmt: skip
    mlp = CACHE / "wide_mlp.onnx"
    if not mlp.exists():
        wide_mlp_onnx(mlp)
    sources = {
        "half_plus_two": demo / "half_plus_two" / "1" / "model.onnx",
        "resnet50": demo / "resnet50" / "1" / "model.onnx",
        "mlp_plain": mlp,
        "mlp_batched": mlp,
        "digits_plain": demo / "digits" / "1" / "model.onnx",
        "digits_batched": demo / "digits" / "1" / "model.onnx",
    }
    configs = {
        "mlp_plain": "max_batch_size: 64\n",
        "mlp_batched": "max_batch_size: 64\n"
        "dynamic_batching { preferred_batch_size: [64] max_queue_delay_microseconds: 50000 }\n",
        "digits_plain": "max_batch_size: 64\n",
        "digits_batched": "max_batch_size: 64\n"
        "dynamic_batching { max_queue_delay_microseconds: 500 }\n",
    }
    for name, source in sources.items():
        target = repo / name / "1" / "model.onnx"
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            os.link(source, target)
        if name in configs:
            (repo / name / "config.pbtxt").write_text(f'name: "{name}"\n{configs[name]}')
    return repo


# --------------------------------------------------------------------------- measuring


def process_cpu_s(pid: int) -> float:
    """CPU seconds of a process and every live descendant (worker processes included)."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        ppid, utime, stime = int(fields[1]), int(fields[11]), int(fields[12])
        if int(proc.name) == pid or _descends(ppid, pid):
            total += (utime + stime) / ticks
    return total


def _descends(ppid: int, root: int) -> bool:
    seen = 0
    while ppid > 1 and seen < 32:
        if ppid == root:
            return True
        try:
            ppid = int(
                (Path("/proc") / str(ppid) / "stat").read_text().rsplit(")", 1)[1].split()[1]
            )
        except OSError:
            return False
        seen += 1
    return False


@contextmanager
def cpu_window(pid: int) -> Iterator[dict[str, float]]:
    out: dict[str, float] = {}
    start = process_cpu_s(pid)
    yield out
    out["cpu_s"] = process_cpu_s(pid) - start


def wrk(
    url: str, body_file: Path, headers: dict[str, str], conns: int, seconds: float
) -> dict[str, float]:
    script = body_file.with_suffix(".lua")
    head = "".join(f'wrk.headers["{k}"] = "{v}"\n' for k, v in headers.items())
    script.write_text(
        f'local f = io.open("{body_file}", "rb")\nwrk.body = f:read("*a")\nf:close()\n'
        f'wrk.method = "POST"\n{head}'
        "done = function(summary, latency, requests)\n"
        '  io.write(string.format("JSON {\\"requests\\": %d, \\"errors\\": %d, \\"p50\\": %d, '
        '\\"p99\\": %d}\\n", summary.requests, summary.errors.status + summary.errors.connect '
        "+ summary.errors.read + summary.errors.write + summary.errors.timeout, "
        "latency:percentile(50), latency:percentile(99)))\nend\n"
    )
    out = subprocess.run(
        ["wrk", "-t1", f"-c{conns}", f"-d{int(seconds)}s", "--latency", "-s", str(script), url],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    found = re.search(r"^JSON (.*)$", out.stdout, re.M)
    assert found, out.stdout
    result: dict[str, float] = json.loads(found.group(1))
    result["rps"] = result["requests"] / seconds
    return result


def h2load_grpc(address: str, payload: bytes, conns: int, seconds: float) -> dict[str, float]:
    body = CACHE / "grpc_half_plus_two.bin"
    body.write_bytes(b"\x00" + struct.pack(">I", len(payload)) + payload)
    url = f"http://{address}/inference.GRPCInferenceService/ModelInfer"
    out = subprocess.run(
        ["h2load", "-c", str(conns), "-m", "1", "-D", str(int(seconds)), "--warm-up-time=1",
         "-d", str(body), "-H", "content-type: application/grpc", "-H", "te: trailers", url],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    done = re.search(r"requests: \d+ total, \d+ started, (\d+) done, (\d+) succeeded", out.stdout)
    assert done, out.stdout
    return {"requests": int(done.group(1)), "rps": int(done.group(2)) / seconds}


def h2load_http(
    url: str, body: Path, headers: dict[str, str], conns: int, seconds: float
) -> dict[str, float]:
    heads = [arg for k, v in headers.items() for arg in ("-H", f"{k}: {v}")]
    out = subprocess.run(
        ["h2load", "--h1", "-c", str(conns), "-D", str(int(seconds)), "--warm-up-time=1",
         "-d", str(body), *heads, url],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    done = re.search(r"requests: \d+ total, \d+ started, (\d+) done, (\d+) succeeded", out.stdout)
    assert done, out.stdout
    return {"requests": int(done.group(1)), "rps": int(done.group(2)) / seconds}


def grpc_payload() -> bytes:
    from tritonclient.grpc import service_pb2 as pb

    request = pb.ModelInferRequest(model_name="half_plus_two")
    request.inputs.add(name="x", datatype="FP32", shape=[1, 1])
    request.raw_input_contents.append(np.array([1.0], np.float32).tobytes())
    data: bytes = request.SerializeToString()
    return data


def binary_body(name: str, array: np.ndarray) -> tuple[bytes, dict[str, str]]:
    raw = array.tobytes()
    header = json.dumps(
        {"inputs": [{"name": name, "datatype": "FP32", "shape": list(array.shape),
                     "parameters": {"binary_data_size": len(raw)}}],
         "parameters": {"binary_data_output": True}}
    ).encode()  # fmt: skip
    return header + raw, {
        "Inference-Header-Content-Length": str(len(header)),
        "Content-Type": "application/octet-stream",
    }


def resnet_latency_ms(url: str, count: int) -> float:
    x = np.random.default_rng(0).standard_normal((1, 3, 224, 224), dtype=np.float32)
    body, headers = binary_body("input", x)
    times = []
    with httpx.Client(timeout=60) as client:
        for i in range(count + 3):
            start = time.perf_counter()
            r = client.post(f"{url}/v2/models/resnet50/infer", content=body, headers=headers)
            r.raise_for_status()
            if i >= 3:
                times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def inprocess_mlp_rows_s(seconds: float, batch: int = 32) -> float:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(str(CACHE / "wide_mlp.onnx"), options)
    x = np.random.default_rng(1).standard_normal((batch, MLP_DIMS[0]), dtype=np.float32)
    for _ in range(3):
        session.run(None, {"input": x})
    rows, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        session.run(None, {"input": x})
        rows += batch
    return rows / (time.perf_counter() - start)


def plain_vs_batched(
    server: ServerProcess,
    pid: int,
    body: Path,
    model: str,
    input_name: str,
    x: np.ndarray,
    seconds: float,
    rate: str,
) -> dict[str, float]:
    """``<model>_plain`` and ``<model>_batched`` at concurrency 64, one row per request (HTTP
    binary): the rate (named ``rate``), CPU-µs/req and errors of each, and the mean batch."""
    raw, headers = binary_body(input_name, x)
    body.write_bytes(raw)
    result: dict[str, float] = {}
    for name in (f"{model}_plain", f"{model}_batched"):
        url = f"{server.http_url}/v2/models/{name}/infer"
        wrk(url, body, headers, 64, 2)
        with cpu_window(pid) as cpu:
            r = wrk(url, body, headers, 64, seconds)
        result[f"{name}_{rate}"] = r["rps"]
        result[f"{name}_cpu_us"] = cpu["cpu_s"] / max(1, r["requests"]) * 1e6
        result[f"{name}_errors"] = r["errors"]
    stats = httpx.get(f"{server.http_url}/v2/models/{model}_batched/stats").json()
    executed = stats["model_stats"][0]
    if executed["execution_count"]:
        result[f"{model}_mean_batch"] = executed["inference_count"] / executed["execution_count"]
    return result


@contextmanager
def floor_server(
    *args: str, path: str, body: bytes, headers: dict[str, str], wait_s: float = 60.0
) -> Iterator[tuple[str, int]]:
    """``empty_rsgi.py`` with ``args`` on a free port, once it has answered ``body`` at
    ``path``: its URL and pid. Stopped on exit."""
    from tests.support import free_port

    port = free_port()
    script = str(ROOT / "benchmarks" / "empty_rsgi.py")
    proc = subprocess.Popen([sys.executable, script, str(port), *args])
    url = f"http://127.0.0.1:{port}{path}"
    try:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                httpx.post(url, content=body, headers=headers, timeout=5).raise_for_status()
                break
            except httpx.HTTPError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        yield url, proc.pid
    finally:
        proc.terminate()
        proc.wait(10)


def floor_load(
    args: tuple[str, ...],
    path: str,
    body: bytes,
    headers: dict[str, str],
    conns: int,
    seconds: float,
) -> dict[str, float]:
    """req/s and CPU-µs/req of ``floor_server(*args)`` under wrk (``conns``, after 2 s of
    warm-up) posting ``body``."""
    with (
        floor_server(*args, path=path, body=body, headers=headers) as (url, pid),
        tempfile.TemporaryDirectory() as work,
    ):
        body_file = Path(work) / "body.bin"
        body_file.write_bytes(body)
        wrk(url, body_file, headers, conns, 2)
        with cpu_window(pid) as cpu:
            r = wrk(url, body_file, headers, conns, seconds)
    return {"rps": r["rps"], "cpu_us": cpu["cpu_s"] / max(1, r["requests"]) * 1e6}


def empty_handler(seconds: float, *extra: str, conns: int = 16) -> dict[str, float]:
    """req/s and CPU-µs/req of ``empty_rsgi.py`` (with ``extra`` arguments) under the JSON
    test's load (``conns`` connections)."""
    headers = {"Content-Type": "application/json"}
    path = "/v2/models/half_plus_two/infer"
    return floor_load(extra, path, JSON_BODY.encode(), headers, conns, seconds)


def minimal_batched_mlp(seconds: float) -> dict[str, float]:
    """rows/s and CPU-µs/row of the wide MLP behind ``empty_rsgi.py --batch`` (64 rows, 50 ms),
    under the batched MLP test's load (c=64, one row per request)."""
    x = np.random.default_rng(2).standard_normal((1, MLP_DIMS[0]), dtype=np.float32)
    raw, headers = binary_body("input", x)
    args = ("--batch", str(CACHE / "wide_mlp.onnx"))
    r = floor_load(args, "/v2/models/mlp/infer", raw, headers, 64, seconds)
    return {"rows_s": r["rps"], "cpu_us": r["cpu_us"]}


# --------------------------------------------------------------------------- one pass


def serving(server: ServerProcess) -> bool:
    """Every worker listens (a frontend binds once it has the host's models)."""
    log = server.log()
    found = re.search(r"(\d+) HTTP workers", log)
    return log.count("listening: HTTP") + log.count("takes connections") >= (
        int(found.group(1)) if found else 1
    )


def measure(
    label: str, tree: Path, repo: Path, seconds: float, only: set[str], workers: str
) -> dict[str, Any]:
    env = {"PYTHONPATH": str(tree / "src"), "INFERD_HTTP_WORKERS": workers}
    server = ServerProcess(repo, env=env, log_path=CACHE / f"server-{label}-{workers}.log")
    server.start(timeout_s=180)
    assert server.proc is not None
    pid = server.proc.pid
    deadline = time.monotonic() + 120
    while not serving(server) and time.monotonic() < deadline:
        time.sleep(0.1)
    result: dict[str, Any] = {"tree": label, "workers": workers}
    work = Path(tempfile.mkdtemp())
    try:
        for test, (path, text, conns) in JSON_LOADS.items():
            if test not in only:
                continue
            body = work / f"{test}.json"
            body.write_text(text)
            url = f"{server.http_url}{path}"
            wrk(url, body, {"Content-Type": "application/json"}, conns, 2)  # warm-up
            with cpu_window(pid) as cpu:
                r = wrk(url, body, {"Content-Type": "application/json"}, conns, seconds)
            result[f"{test}_rps"] = r["rps"]
            result[f"{test}_cpu_us"] = cpu["cpu_s"] / max(1, r["requests"]) * 1e6
            result[f"{test}_errors"] = r["errors"]
        if "grpc" in only:
            raw, headers = binary_body("x", np.array([[1.0]], np.float32))
            body = work / "hpt.bin"
            body.write_bytes(raw)
            url = f"{server.http_url}/v2/models/half_plus_two/infer"
            h2load_http(url, body, headers, 16, 2)
            with cpu_window(pid) as cpu:
                r = h2load_http(url, body, headers, 16, seconds)
            result["http_binary_rps"] = r["rps"]
            result["http_binary_cpu_us"] = cpu["cpu_s"] / max(1, r["requests"]) * 1e6
            payload = grpc_payload()
            h2load_grpc(server.grpc_address, payload, 16, 2)
            with cpu_window(pid) as cpu:
                r = h2load_grpc(server.grpc_address, payload, 16, seconds)
            result["grpc_rps"] = r["rps"]
            result["grpc_cpu_us"] = cpu["cpu_s"] / max(1, r["requests"]) * 1e6
        if "resnet" in only:
            result["resnet_ms"] = resnet_latency_ms(server.http_url, 20)
        if "mlp" in only:
            x = np.random.default_rng(2).standard_normal((1, MLP_DIMS[0]), dtype=np.float32)
            body = work / "mlp.bin"
            result |= plain_vs_batched(server, pid, body, "mlp", "input", x, seconds, "rows_s")
        if "digits" in only:
            x = np.random.default_rng(3).random((1, 64), dtype=np.float32) * 16
            body = work / "digits.bin"
            result |= plain_vs_batched(server, pid, body, "digits", DIGITS_INPUT, x, seconds, "rps")
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    return result


def layouts(rows: list[dict[str, Any]], settings: list[str]) -> None:
    """Each worker setting's req/s and CPU-µs per request as a ratio to the first setting's,
    per tree and test: medians of the per-pass ratios."""
    if len(settings) < 2:
        return
    first = settings[0]
    trees = list(dict.fromkeys(r["tree"].rsplit(" w=", 1)[0] for r in rows))
    for tree in trees:
        for setting in settings[1:]:
            for test in [t for t in JSON_LOADS if f"{t}_rps" in rows[0]] + ["http_binary", "grpc"]:
                pairs = [
                    (a, b)
                    for a in rows
                    for b in rows
                    if a["tree"] == f"{tree} w={setting}"
                    and b["tree"] == f"{tree} w={first}"
                    and a["pass"] == b["pass"]
                    and f"{test}_rps" in a
                ]
                if not pairs:
                    continue
                rps = statistics.median(a[f"{test}_rps"] / b[f"{test}_rps"] for a, b in pairs)
                cpu = statistics.median(a[f"{test}_cpu_us"] / b[f"{test}_cpu_us"] for a, b in pairs)
                print(
                    f"{tree}: {test} --http-workers {setting} / {first}: req/s {rps:.2f}x, "
                    f"CPU-us/req {cpu:.2f}x"
                )


def trees_from(specs: list[str]) -> list[tuple[str, Path]]:
    """``--tree LABEL=PATH`` arguments as (label, path); this checkout when none is given."""
    return [(s.split("=", 1)[0], Path(s.split("=", 1)[1]).resolve()) for s in specs] or [
        ("this", ROOT)
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tree", action="append", default=[], help="LABEL=PATH (repeat)")
    parser.add_argument("--passes", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--only", default=",".join(TESTS))
    parser.add_argument(
        "--workers",
        default="1",
        help="serving processes (--http-workers: a number or auto, the server's default); "
        "several, comma-separated, measure each",
    )
    args = parser.parse_args()
    settings = args.workers.split(",")
    trees = [
        (label if len(settings) == 1 else f"{label} w={setting}", path, setting)
        for label, path in trees_from(args.tree)
        for setting in settings
    ]
    only = set(args.only.split(","))
    CACHE.mkdir(parents=True, exist_ok=True)
    repo = build_repository()
    print(f"load average at start: {os.getloadavg()[0]:.2f}", flush=True)
    rows: list[dict[str, Any]] = []
    inprocs: list[float] = []
    inprocs64: list[float] = []
    empties: list[dict[str, float]] = []
    empties64: list[dict[str, float]] = []
    minimals: list[dict[str, float]] = []
    for p in range(args.passes):
        # The in-process reference is taken every pass, between the servers, so each pass's
        # ratio compares figures taken under the same host load.
        inproc = inprocess_mlp_rows_s(min(args.seconds, 5.0)) if "mlp" in only else 0.0
        inprocs.append(inproc)
        inproc64 = inprocess_mlp_rows_s(min(args.seconds, 5.0), 64) if "mlp" in only else 0.0
        inprocs64.append(inproc64)
        empty = empty_handler(args.seconds) if "empty" in only else {}
        if empty:
            empties.append(empty)
            print(json.dumps({"empty_handler": empty, "pass": p + 1}), flush=True)
        empty64 = empty_handler(args.seconds, conns=64) if {"empty", "json64"} <= only else {}
        if empty64:
            empties64.append(empty64)
            print(json.dumps({"empty_handler_c64": empty64, "pass": p + 1}), flush=True)
        if "minimal" in only:
            model = str(repo / "half_plus_two" / "1" / "model.onnx")
            minimal = empty_handler(args.seconds, "--minimal", model)
            if empty:
                minimal["cpu_vs_empty"] = minimal["cpu_us"] / empty["cpu_us"]
            if "mlp" in only:
                batched = minimal_batched_mlp(args.seconds)
                minimal["mlp_rows_s"] = batched["rows_s"]
                minimal["mlp_cpu_us_per_row"] = batched["cpu_us"]
                minimal["mlp_vs_inprocess"] = batched["rows_s"] / inproc
            minimals.append(minimal)
            print(json.dumps({"minimal_handler": minimal, "pass": p + 1}), flush=True)
        # trees (and worker settings) in turn, the order reversed every other pass (ABBA)
        for label, tree, setting in trees if p % 2 == 0 else trees[::-1]:
            row = measure(label, tree, repo, args.seconds, only, setting)
            row["tree"] = label
            row["pass"] = p + 1
            if inproc:
                row["mlp_batched_vs_inprocess"] = row["mlp_batched_rows_s"] / inproc
                row["mlp_batched_vs_inprocess_64"] = row["mlp_batched_rows_s"] / inproc64
            if empty and "json_cpu_us" in row:
                row["json_cpu_vs_empty"] = row["json_cpu_us"] / empty["cpu_us"]
            if empty64 and "json64_cpu_us" in row:
                row["json64_cpu_vs_empty"] = row["json64_cpu_us"] / empty64["cpu_us"]
            for c in ("", "64"):
                if f"tfs{c}_rps" in row and f"json{c}_rps" in row:
                    row[f"tfs{c}_vs_json_rps"] = row[f"tfs{c}_rps"] / row[f"json{c}_rps"]
                    row[f"tfs{c}_vs_json_cpu"] = row[f"tfs{c}_cpu_us"] / row[f"json{c}_cpu_us"]
            rows.append(row)
            print(json.dumps(row), flush=True)
    print(f"load average at end: {os.getloadavg()[0]:.2f}")
    keys = [k for k in rows[0] if k not in ("tree", "pass", "workers")]
    print("\nmedian over passes")
    print("| figure | " + " | ".join(label for label, _, _ in trees) + " |")
    print("|---|" + "---|" * len(trees))
    for key in keys:
        cells = []
        for label, _, _ in trees:
            values = [r[key] for r in rows if r["tree"] == label and key in r]
            cells.append(f"{statistics.median(values):,.1f}" if values else "")
        print(f"| {key} | " + " | ".join(cells) + " |")
    if "mlp" in only:
        reference = statistics.median(inprocs)
        print(f"| onnxruntime in-process wide MLP batch 32, rows/s | {reference:,.1f} |")
        print(f"| the same at batch 64, rows/s | {statistics.median(inprocs64):,.1f} |")
        for label, _, _ in trees:
            mine = [r for r in rows if r["tree"] == label]
            ratio = statistics.median(r["mlp_batched_rows_s"] / r["mlp_plain_rows_s"] for r in mine)
            share = statistics.median(r["mlp_batched_vs_inprocess"] for r in mine)
            share64 = statistics.median(r["mlp_batched_vs_inprocess_64"] for r in mine)
            print(
                f"{label}: batched/unbatched {ratio:.2f}x, batched/in-process at batch 32 "
                f"{share:.2f}, at batch 64 {share64:.2f} (medians of per-pass ratios)"
            )
    if empties:
        rps = statistics.median(e["rps"] for e in empties)
        cpu = statistics.median(e["cpu_us"] for e in empties)
        print(f"| empty RSGI handler (empty_rsgi.py), req/s; CPU-us/req | {rps:,.1f}; {cpu:,.1f} |")
    if empties64:
        rps = statistics.median(e["rps"] for e in empties64)
        cpu = statistics.median(e["cpu_us"] for e in empties64)
        print(f"| empty RSGI handler at c=64, req/s; CPU-us/req | {rps:,.1f}; {cpu:,.1f} |")
    layouts(rows, settings)
    if minimals:
        rps = statistics.median(m["rps"] for m in minimals)
        cpu = statistics.median(m["cpu_us"] for m in minimals)
        line = f"| minimal JSON handler (empty_rsgi.py --minimal), req/s; CPU-us/req | {rps:,.1f}; "
        line += f"{cpu:,.1f} |"
        if empties:
            ratio = statistics.median(m["cpu_vs_empty"] for m in minimals)
            line += f" {ratio:.2f}x the empty handler's CPU (median of per-pass ratios)"
        print(line)
        if "mlp" in only:
            rate = statistics.median(m["mlp_rows_s"] for m in minimals)
            share = statistics.median(m["mlp_vs_inprocess"] for m in minimals)
            cpu = statistics.median(m["mlp_cpu_us_per_row"] for m in minimals)
            print(
                f"| minimal batcher (empty_rsgi.py --batch), wide MLP rows/s; CPU-us/row | "
                f"{rate:,.1f}; {cpu:,.1f} | {share:.2f} of in-process batch 32 |"
            )
    if "grpc" in only:
        for label, _, _ in trees:
            mine = [r for r in rows if r["tree"] == label]
            rps = statistics.median(r["grpc_rps"] / r["http_binary_rps"] for r in mine)
            cpu = statistics.median(r["grpc_cpu_us"] / r["http_binary_cpu_us"] for r in mine)
            print(f"{label}: gRPC/HTTP binary req/s {rps:.2f}x, CPU-us/req {cpu:.2f}x")
    if "digits" in only:
        for label, _, _ in trees:
            mine = [r for r in rows if r["tree"] == label]
            rps = statistics.median(r["digits_batched_rps"] / r["digits_plain_rps"] for r in mine)
            cpu = statistics.median(
                r["digits_batched_cpu_us"] / r["digits_plain_cpu_us"] for r in mine
            )
            print(f"{label}: digits batched/unbatched req/s {rps:.2f}x, CPU-us/req {cpu:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
