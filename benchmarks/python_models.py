"""Python models against their references, each in the same run.

1. identity FP32 [1,16], v2 HTTP JSON, concurrency 16 (wrk): a Python identity (Triton's form)
   against the same identity as ONNX, served by the same inferd; and, with ``--mlserver VENV``,
   MLServer's custom Python runtime (an ``MLModel`` subclass) doing the same, same load;
2. a CPU-bound pure-Python model (~2 ms per call, calibrated here) with 1 and with 2 instances,
   concurrency 8: req/s; beside it, the same loop run in this machine's processes with no
   server: two processes at once against one alone (calls per second), the most that 2
   instances can give over 1 here (``pair_ceiling``); and the same model behind the least a
   server can do (``empty_rsgi.py --busy``: parse, pickle to a forked worker, answer; no
   queue, validation or statistics) with 1 and 2 worker processes (``minimal_2_vs_1``): the
   scaling of a server with no cost of its own beyond that;
3. a 16 MB FP32 tensor, binary HTTP, one request at a time: round-trip time through the Python
   identity and through the ONNX identity (median); and without HTTP, the echo backend in
   process instances against thread instances, beside a 16 MB copy in this process, to show
   what crossing to a worker costs (two copies, one each way);
4. BLS: a Python model that calls ``half_plus_two`` N times per request against the same model
   making none, one request at a time: the added median latency per nested call; and the same
   calls through the minimal server (``empty_rsgi.py --busy 0 --calls N``: a pickled array
   over a Unix socket, ``half_plus_two`` run on the event loop, the answer pickled back).

Every inferd figure comes with the server's CPU-µs per request (its process tree: workers
included). Needs ``wrk``.

    .venv/bin/python benchmarks/python_models.py [--seconds 6] [--passes 1]
        [--mlserver /path/to/venv-with-mlserver] [--only identity,cpu,large,bls]
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from core_bench import binary_body, cpu_window, floor_server, wrk  # noqa: E402

from tests.support import ServerProcess, free_port  # noqa: E402

TESTS = ("identity", "cpu", "large", "bls")
BLS_CALLS = 10
LARGE_ELEMENTS = 4 * 1024 * 1024  # 16 MB of FP32

IDENTITY_CONFIG = """
max_batch_size: 0
input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1, -1 ] }]
output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1, -1 ] }]
"""

IDENTITY = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]))
        return responses
"""

BUSY = """
import json

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.loops = int(config["parameters"]["loops"]["string_value"])

    def execute(self, requests):
        responses = []
        for request in requests:
            total = 0
            for i in range(self.loops):  # pure Python: holds this worker's GIL
                total += i
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]))
        return responses
"""

CALLER = """
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.calls = int(config["parameters"]["calls"]["string_value"])

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            for _ in range(self.calls):
                response = pb_utils.InferenceRequest(
                    model_name="half_plus_two",
                    requested_output_names=["y"],
                    inputs=[pb_utils.Tensor("x", np.ones((1, 1), np.float32))],
                ).exec()
                if response.has_error():
                    raise pb_utils.TritonModelException(response.error().message())
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]))
        return responses
"""

MLSERVER_RUNTIME = """
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse


class Identity(MLModel):
    async def load(self) -> bool:
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        x = NumpyCodec.decode_input(payload.inputs[0])
        return InferenceResponse(
            model_name=self.name, outputs=[NumpyCodec.encode_output(name="OUTPUT0", payload=x)]
        )
"""


def identity_onnx(path: Path) -> None:
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])],
        "identity",
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["a", "b"])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["a", "b"])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path.write_bytes(model.SerializeToString())


def calibrate_loops(target_s: float = 0.002) -> int:
    """Loop iterations that take ``target_s`` of pure Python here (best of 5)."""
    loops = 20_000
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        _spin(loops)
        best = min(best, time.perf_counter() - start)
    return max(1000, int(loops * target_s / best))


def _spin(loops: int) -> int:
    """The busy model's loop (``BUSY``), here in the benchmark's own processes."""
    total = 0
    for i in range(loops):
        total += i
    return total


def _model(repo: Path, name: str, config: str, source: str | None = None) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(f'name: "{name}"\n{config}')
    if source is not None:
        (repo / name / "1" / "model.py").write_text(textwrap.dedent(source))


def build_repository(root: Path, loops: int) -> Path:
    from inferd.demo.models import write_demo_repository

    repo = root / "models"
    write_demo_repository(root / "demo", models=["half_plus_two"])
    (repo / "half_plus_two" / "1").mkdir(parents=True)
    os.link(
        root / "demo" / "half_plus_two" / "1" / "model.onnx",
        repo / "half_plus_two" / "1" / "model.onnx",
    )
    _model(repo, "identity_onnx", 'platform: "onnxruntime_onnx"\n' + IDENTITY_CONFIG)
    identity_onnx(repo / "identity_onnx" / "1" / "model.onnx")
    _model(repo, "identity_py", 'backend: "python"\n' + IDENTITY_CONFIG, IDENTITY)
    loops_param = f'parameters {{ key: "loops" value: {{ string_value: "{loops}" }} }}\n'
    for count in (1, 2):
        config = f'backend: "python"\ninstance_group [{{ count: {count} }}]\n{loops_param}'
        _model(repo, f"busy_{count}", config + IDENTITY_CONFIG, BUSY)
    for calls in (0, BLS_CALLS):
        calls_param = f'parameters {{ key: "calls" value: {{ string_value: "{calls}" }} }}\n'
        config = 'backend: "python"\n' + calls_param + IDENTITY_CONFIG
        _model(repo, f"caller_{calls}", config, CALLER)
    return repo


def json_body(work: Path) -> Path:
    body = work / "identity.json"
    data = np.arange(16, dtype=np.float32).tolist()
    doc = {"inputs": [{"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": data}]}
    body.write_text(json.dumps(doc))
    return body


def load(server_pid: int, url: str, body: Path, conns: int, seconds: float) -> dict[str, float]:
    """wrk on one URL after a 2 s warm-up: req/s, p50 µs, the server's CPU-µs per request."""
    headers = {"Content-Type": "application/json"}
    wrk(url, body, headers, conns, 2)
    with cpu_window(server_pid) as cpu:
        result = wrk(url, body, headers, conns, seconds)
    return {
        "rps": result["rps"],
        "p50_us": result["p50"],
        "cpu_us": cpu["cpu_s"] / max(1, result["requests"]) * 1e6,
        "errors": result["errors"],
    }


def round_trip_ms(address: str, model: str, count: int) -> float:
    """Median round trip of a 16 MB tensor, binary HTTP (http.client: httpx reads a 16 MB
    body in small pieces and would measure itself)."""
    x = np.random.default_rng(0).standard_normal((1, LARGE_ELEMENTS), dtype=np.float32)
    body, headers = binary_body("INPUT0", x)
    host, port = address.rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=120)
    times = []
    for i in range(count + 2):
        start = time.perf_counter()
        connection.request("POST", f"/v2/models/{model}/infer", body, headers)
        response = connection.getresponse()
        data = response.read()
        assert response.status == 200 and len(data) > x.nbytes, data[:200]
        if i >= 2:
            times.append(time.perf_counter() - start)
    connection.close()
    return statistics.median(times) * 1e3


def in_process_crossing_ms(count: int) -> dict[str, float]:
    """16 MB through the echo backend: process instances, thread instances, and one copy."""
    from inferd.backends import get_backend
    from inferd.backends.base import InstancePlacement
    from inferd.backends.echo import EchoRuntime
    from inferd.backends.work import BatchExecutor, Work
    from inferd.config.text import parse_config_text
    from inferd.scheduling.instances import ThreadInstances
    from inferd.scheduling.processes import ProcessInstances
    from inferd.scheduling.recipe import backend_recipe

    config = parse_config_text(
        'name: "echo" backend: "echo" max_batch_size: 0\n'
        'input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }]\n'
        'output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }]\n'
    )
    x = np.random.default_rng(0).standard_normal(LARGE_ELEMENTS, dtype=np.float32)
    work = Work({"INPUT0": x}, 0, ("OUTPUT0",))
    placement = InstancePlacement("CPU", 0, 1, 0)
    recipe = backend_recipe(get_backend("echo"), Path("."), config, placement, "echo")
    pools = {
        "process": ProcessInstances("echo", [recipe]),
        "thread": ThreadInstances("echo", [BatchExecutor("echo", EchoRuntime(config, 0))]),
    }

    async def time_pool(pool: Any) -> float:
        times = []
        for i in range(count + 2):
            start = time.perf_counter()
            executed = await pool.submit([work])
            out = executed.results[0]["OUTPUT0"]
            assert out.shape == x.shape
            del out, executed
            if i >= 2:
                times.append(time.perf_counter() - start)
        await pool.close()
        return statistics.median(times) * 1e3

    result = {f"{k}_ms": asyncio.run(time_pool(pool)) for k, pool in pools.items()}
    target = np.empty_like(x)
    copies = []
    for _ in range(count):
        start = time.perf_counter()
        np.copyto(target, x)
        copies.append(time.perf_counter() - start)
    result["one_copy_ms"] = statistics.median(copies) * 1e3
    return result


def mlserver_identity(venv: Path, work: Path, body: Path, seconds: float) -> dict[str, float]:
    """MLServer's custom Python runtime on the same identity, same load."""
    folder = work / "mlserver"
    (folder / "identity").mkdir(parents=True)
    port = free_port()
    settings = {
        "debug": False,
        "host": "127.0.0.1",
        "http_port": port,
        "grpc_port": free_port(),
        "metrics_port": free_port(),
        "load_models_at_startup": True,
    }
    (folder / "settings.json").write_text(json.dumps(settings))
    (folder / "identity" / "model-settings.json").write_text(
        json.dumps({"name": "identity", "implementation": "identity_runtime.Identity"})
    )
    (folder / "identity" / "identity_runtime.py").write_text(textwrap.dedent(MLSERVER_RUNTIME))
    with open(work / "mlserver.log", "wb") as log:
        proc = subprocess.Popen(
            [str(venv / "bin" / "mlserver"), "start", str(folder)],
            cwd=folder,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{url}/v2/models/identity/ready", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"MLServer did not start: see {work / 'mlserver.log'}")
            time.sleep(0.5)
        return load(proc.pid, f"{url}/v2/models/identity/infer", body, 16, seconds)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # its own session: MLServer and its workers
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _loop_calls(loops: int, seconds: float) -> int:
    calls, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        _spin(loops)
        calls += 1
    return calls


def pair_ceiling(loops: int, seconds: float) -> float:
    """Calls per second of the busy loop in two processes at once ÷ in one: what two cores
    give two CPU-bound Python processes here with nothing else running."""
    import multiprocessing

    with multiprocessing.get_context("fork").Pool(2) as pool:
        one = pool.apply(_loop_calls, (loops, seconds))
        two = sum(pool.starmap(_loop_calls, [(loops, seconds)] * 2))
    return two / one


def minimal_busy(
    body: Path,
    loops: int,
    processes: int,
    seconds: float,
    calls: tuple[Path, int] | None = None,
    conns: int = 8,
) -> dict[str, float]:
    """The busy model behind ``empty_rsgi.py --busy`` with ``processes`` workers, as ``load``;
    ``calls``: (model.onnx, nested calls per request)."""
    args = ["--busy", str(loops), "--processes", str(processes)]
    if calls is not None:
        args += ["--minimal", str(calls[0]), "--calls", str(calls[1])]
    headers = {"Content-Type": "application/json"}
    path = "/v2/models/busy/infer"
    with floor_server(*args, path=path, body=body.read_bytes(), headers=headers) as (url, pid):
        return load(pid, url, body, conns, seconds)


def measure(repo: Path, work: Path, seconds: float, only: set[str], loops: int) -> dict[str, Any]:
    server = ServerProcess(repo, log_path=work / "inferd.log").start(timeout_s=300)
    assert server.proc is not None
    pid = server.proc.pid
    url = server.http_url
    row: dict[str, Any] = {}
    try:
        body = json_body(work)
        if "identity" in only:
            for model in ("identity_onnx", "identity_py"):
                r = load(pid, f"{url}/v2/models/{model}/infer", body, 16, seconds)
                row.update({f"{model}_{k}": v for k, v in r.items()})
            row["identity_py_vs_onnx"] = row["identity_py_rps"] / row["identity_onnx_rps"]
        if "cpu" in only:
            for model in ("busy_1", "busy_2"):
                r = load(pid, f"{url}/v2/models/{model}/infer", body, 8, seconds)
                row.update({f"{model}_{k}": v for k, v in r.items()})
            row["busy_2_vs_1"] = row["busy_2_rps"] / row["busy_1_rps"]
            row["pair_ceiling"] = pair_ceiling(loops, min(seconds, 4.0))
            for processes in (1, 2):
                r = minimal_busy(body, loops, processes, seconds)
                row.update({f"minimal_{processes}_{k}": v for k, v in r.items()})
            row["minimal_2_vs_1"] = row["minimal_2_rps"] / row["minimal_1_rps"]
        if "large" in only:
            for model in ("identity_onnx", "identity_py"):
                row[f"large_{model}_ms"] = round_trip_ms(server.http_address, model, 15)
            row["large_py_vs_onnx"] = row["large_identity_py_ms"] / row["large_identity_onnx_ms"]
        if "bls" in only:
            for calls in (0, BLS_CALLS):
                r = load(pid, f"{url}/v2/models/caller_{calls}/infer", body, 1, seconds)
                row.update({f"caller_{calls}_{k}": v for k, v in r.items()})
            added = row[f"caller_{BLS_CALLS}_p50_us"] - row["caller_0_p50_us"]
            row["bls_added_us_per_call"] = added / BLS_CALLS
            row["bls_cpu_us_per_call"] = (
                row[f"caller_{BLS_CALLS}_cpu_us"] - row["caller_0_cpu_us"]
            ) / BLS_CALLS
            onnx_model = repo / "half_plus_two" / "1" / "model.onnx"
            floor = {
                calls: minimal_busy(body, 0, 1, seconds, (onnx_model, calls), conns=1)["p50_us"]
                for calls in (0, BLS_CALLS)
            }
            row["minimal_bls_added_us_per_call"] = (floor[BLS_CALLS] - floor[0]) / BLS_CALLS
    finally:
        server.stop()
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--passes", type=int, default=1)
    parser.add_argument("--mlserver", type=Path, help="a venv with mlserver installed")
    parser.add_argument("--only", default=",".join(TESTS))
    args = parser.parse_args()
    only = set(args.only.split(","))
    work = Path(tempfile.mkdtemp(prefix="inferd-python-bench-"))
    loops = calibrate_loops()
    repo = build_repository(work, loops)
    print(f"load average at start: {os.getloadavg()[0]:.2f}; {loops} loops ~ 2 ms", flush=True)
    rows = []
    for p in range(args.passes):
        row = measure(repo, work, args.seconds, only, loops)
        if "identity" in only and args.mlserver:
            ml = mlserver_identity(args.mlserver, work / f"pass{p}", json_body(work), args.seconds)
            row.update({f"mlserver_identity_{k}": v for k, v in ml.items()})
            row["identity_py_vs_mlserver"] = row["identity_py_rps"] / ml["rps"]
        if "large" in only:
            row.update({f"echo16mb_{k}": v for k, v in in_process_crossing_ms(15).items()})
        row["pass"] = p + 1
        rows.append(row)
        print(json.dumps(row), flush=True)
    print(f"load average at end: {os.getloadavg()[0]:.2f}")
    print("\nmedian over passes")
    for key in rows[0]:
        if key != "pass":
            print(f"| {key} | {statistics.median(r[key] for r in rows):,.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
