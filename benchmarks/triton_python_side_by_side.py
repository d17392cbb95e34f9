"""inferd against the real Triton Inference Server on the same Triton Python-backend models.

The models, unmodified Triton Python-backend models in one repository: ``half_plus_two``
(y = 0.5·x + 2, FP32 [-1, 1], max_batch_size 64, dynamic batching, one CPU instance) and
Triton's ``add_sub`` example (python_backend/examples/add_sub: FP32 [4] twice, no batching).
Each server runs alone in turn on that repository, the order alternating over the passes:
Triton 2.51 (``shared/anchors/triton``: the ``tritonserver`` of PyPI's nvidia-pytriton wheel,
CPU, its Python backend) and ``inferd serve`` in its default layout (a model host and
frontends; ``--inferd-args`` adds flags). Per cell (model, protocol, clients; closed loop, one
load process: KServe v2 binary tensors over keep-alive HTTP/1.1, or pre-serialized
ModelInferRequest bytes on one grpc.aio channel): requests per second, the server's CPU per
request over its whole process tree, and the average executed batch (inferences ÷ executions,
from each server's statistics API); per server, the tree's idle RSS after start. Printed per
pass, then inferd ÷ Triton as median [min-max] over the passes.

    .venv/bin/python benchmarks/triton_python_side_by_side.py [--passes 3] [--seconds 8]
        [--warmup 2] [--inferd-args "--http-workers 1"] [--cells hpt-http-1,...]
        [--by-process] [--floor]

``--by-process`` shares each cell's CPU per request out among the parts of the tree (inferd:
supervisor, model host, frontends, model processes; Triton: tritonserver, Python stubs).

``--floor`` measures instead the least a Python server can do for ``half_plus_two`` over v2
JSON HTTP, beside Triton on the same request: ``empty_rsgi.py --busy 0 --processes 1`` (granian
and uvloop as inferd runs them; parse the body, pickle the array to one forked process over a
Unix socket, which sends it back; write the JSON answer: no batching, validation, routing or
statistics): CPU per request of each tree, floor ÷ Triton, one client and sixteen.

The Triton side runs only where the anchor is set up (``TRITON_ANCHOR_ROOT``, by default
/tmp/triton-anchor, holds ``wheel/pytriton/tritonserver/bin/tritonserver``; see the anchor's
README); otherwise inferd is measured alone and the ratios are skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np
import psutil
from tritonclient.grpc import service_pb2 as pb

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

from pytriton_side_by_side import measure  # noqa: E402

from tests.support import free_port  # noqa: E402

# The anchor's scripts: beside the checkout (shared/anchors/triton), or where TRITON_ANCHOR says.
ANCHOR = Path(
    os.environ.get("TRITON_ANCHOR")
    or next(
        (str(p / "shared/anchors/triton") for p in ROOT.parents if (p / "shared/anchors").is_dir()),
        "shared/anchors/triton",
    )
)
ANCHOR_ROOT = Path(os.environ.get("TRITON_ANCHOR_ROOT", "/tmp/triton-anchor"))
TRITONSERVER = ANCHOR_ROOT / "wheel" / "pytriton" / "tritonserver" / "bin" / "tritonserver"

HALF_PLUS_TWO_CONFIG = """name: "half_plus_two"
backend: "python"
max_batch_size: 64
input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] }]
output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] }]
dynamic_batching { }
instance_group [{ kind: KIND_CPU count: 1 }]
"""

HALF_PLUS_TWO = """import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            y = (0.5 * x + 2.0).astype(np.float32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", y)]))
        return responses
"""

ADD_SUB_CONFIG = """name: "add_sub"
backend: "python"
input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }]
input [{ name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] }]
output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }]
output [{ name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] }]
instance_group [{ kind: KIND_CPU }]
"""

# Triton's python_backend/examples/add_sub/model.py, its comments and docstrings left out.
ADD_SUB = """import json

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.model_config = model_config = json.loads(args["model_config"])
        output0_config = pb_utils.get_output_config_by_name(model_config, "OUTPUT0")
        output1_config = pb_utils.get_output_config_by_name(model_config, "OUTPUT1")
        self.output0_dtype = pb_utils.triton_string_to_numpy(output0_config["data_type"])
        self.output1_dtype = pb_utils.triton_string_to_numpy(output1_config["data_type"])

    def execute(self, requests):
        output0_dtype = self.output0_dtype
        output1_dtype = self.output1_dtype
        responses = []
        for request in requests:
            in_0 = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            in_1 = pb_utils.get_input_tensor_by_name(request, "INPUT1")
            out_0, out_1 = (
                in_0.as_numpy() + in_1.as_numpy(),
                in_0.as_numpy() - in_1.as_numpy(),
            )
            out_tensor_0 = pb_utils.Tensor("OUTPUT0", out_0.astype(output0_dtype))
            out_tensor_1 = pb_utils.Tensor("OUTPUT1", out_1.astype(output1_dtype))
            inference_response = pb_utils.InferenceResponse(
                output_tensors=[out_tensor_0, out_tensor_1]
            )
            responses.append(inference_response)
        return responses

    def finalize(self):
        print("Cleaning up...")
"""

# cell name: (model, protocol, clients)
CELLS = {
    "hpt-http-1": ("half_plus_two", "http", 1),
    "hpt-http-16": ("half_plus_two", "http", 16),
    "hpt-grpc-1": ("half_plus_two", "grpc", 1),
    "hpt-grpc-16": ("half_plus_two", "grpc", 16),
    "addsub-grpc-16": ("add_sub", "grpc", 16),
}
INPUTS = {
    "half_plus_two": {"INPUT0": np.array([[0.5]], dtype=np.float32)},
    "add_sub": {
        "INPUT0": np.arange(4, dtype=np.float32),
        "INPUT1": np.ones(4, dtype=np.float32),
    },
}
OUTPUTS = {"half_plus_two": ["OUTPUT0"], "add_sub": ["OUTPUT0", "OUTPUT1"]}


def write_repository(folder: Path) -> Path:
    repository = folder / "models"
    for name, config, model in (
        ("half_plus_two", HALF_PLUS_TWO_CONFIG, HALF_PLUS_TWO),
        ("add_sub", ADD_SUB_CONFIG, ADD_SUB),
    ):
        (repository / name / "1").mkdir(parents=True)
        (repository / name / "config.pbtxt").write_text(config)
        (repository / name / "1" / "model.py").write_text(model)
    return repository


def http_request(port: int, model: str) -> bytes:
    """One KServe v2 request with binary tensors, whole (head and body)."""
    inputs = INPUTS[model]
    header = json.dumps(
        {
            "inputs": [
                {"name": n, "datatype": "FP32", "shape": list(a.shape),
                 "parameters": {"binary_data_size": a.nbytes}}
                for n, a in inputs.items()
            ],
            "outputs": [{"name": n, "parameters": {"binary_data": True}} for n in OUTPUTS[model]],
        }
    ).encode()  # fmt: skip
    body = header + b"".join(a.tobytes() for a in inputs.values())
    head = (
        f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Inference-Header-Content-Length: {len(header)}\r\n"
        f"Content-Type: application/octet-stream\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


def grpc_request(model: str) -> bytes:
    request = pb.ModelInferRequest(model_name=model)
    for name, array in INPUTS[model].items():
        request.inputs.add(name=name, datatype="FP32", shape=list(array.shape))
        request.raw_input_contents.append(array.tobytes())
    data: bytes = request.SerializeToString()
    return data


def json_request(port: int, model: str) -> bytes:
    """One KServe v2 JSON request, whole (the floor server reads JSON only)."""
    inputs = [
        {"name": n, "datatype": "FP32", "shape": list(a.shape), "data": a.ravel().tolist()}
        for n, a in INPUTS[model].items()
    ]
    body = json.dumps({"inputs": inputs}).encode()
    head = (
        f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


def _get(url: str) -> bytes | None:
    try:
        with urllib.request.urlopen(url, timeout=5) as reply:
            return bytes(reply.read()) if reply.status == 200 else None
    except OSError:
        return None


def batch_counts(http_port: int, model: str) -> tuple[int, int]:
    """(inferences, executions) of a model so far, from the statistics API."""
    raw = _get(f"http://127.0.0.1:{http_port}/v2/models/{model}/stats")
    if raw is None:
        return 0, 0
    stats = json.loads(raw)["model_stats"]
    return (
        sum(int(s.get("inference_count", 0)) for s in stats),
        sum(int(s.get("execution_count", 0)) for s in stats),
    )


def tree(pid: int) -> list[psutil.Process]:
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


def tree_memory_mib(pid: int) -> tuple[float, float]:
    """RSS and PSS summed over a process tree. The RSS sum counts a page shared by forked
    processes once per process; PSS shares it out among them."""
    rss = pss = 0
    for process in tree(pid):
        try:
            memory = process.memory_full_info()
        except psutil.Error:
            continue
        rss += memory.rss
        pss += getattr(memory, "pss", memory.rss)
    return rss / 2**20, pss / 2**20


def roles(pid: int) -> dict[int, str]:
    """Each process of a server's tree by its part: for inferd the supervisor, the model host
    (the serving process whose children run the models), frontends and model processes (and
    their zygote); for Triton the server and its Python stubs."""
    root = psutil.Process(pid)
    found: dict[int, str] = {}
    for process in tree(pid):
        try:
            name, children = process.name(), process.children()
            command = " ".join(process.cmdline())
        except psutil.Error:
            continue
        if "stub" in name:
            found[process.pid] = "python stubs"
        elif "tritonserver" in name:
            found[process.pid] = "tritonserver"
        elif "INFERD_WORKER" in command:
            found[process.pid] = "model processes"
        elif process.pid == root.pid and not any(
            "INFERD_WORKER" in " ".join(child.cmdline()) for child in children
        ):
            found[process.pid] = "supervisor"
        else:  # one serving process (the root) or the model host runs the model processes
            found[process.pid] = "model host" if children else "frontends"
    return found


def cpu_by_role(pid: int) -> dict[str, float]:
    totals: dict[str, float] = {}
    for process_id, role in roles(pid).items():
        try:
            times = psutil.Process(process_id).cpu_times()
        except psutil.Error:
            continue
        totals[role] = totals.get(role, 0.0) + times.user + times.system
    return totals


class Server:
    def __init__(self, kind: str, repository: Path, folder: Path, inferd_args: list[str]) -> None:
        self.kind = kind
        self.http, self.grpc, self.metrics = free_port(), free_port(), free_port()
        log = (folder / f"{kind}-{self.http}.log").open("wb")
        env = dict(os.environ)
        if kind == "floor":
            command = [
                sys.executable, str(ROOT / "benchmarks" / "empty_rsgi.py"), str(self.http),
                "--busy", "0", "--processes", "1",
            ]  # fmt: skip
        elif kind == "triton":
            command = [
                str(ANCHOR / "start_triton.sh"), str(repository),
                str(self.http), str(self.grpc), str(self.metrics),
            ]  # fmt: skip
            env["TRITON_ANCHOR_ROOT"] = str(ANCHOR_ROOT)
        else:
            command = [
                sys.executable, "-m", "inferd", "serve", "--model-repository", str(repository),
                "--http-port", str(self.http), "--grpc-port", str(self.grpc), *inferd_args,
            ]  # fmt: skip
            env["PYTHONPATH"] = str(ROOT / "src")
        began = time.perf_counter()
        self.process = subprocess.Popen(
            command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        deadline = time.monotonic() + 300
        while not self._ready():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{kind} did not start; see {log.name}")
            time.sleep(0.2)
        self.start_s = time.perf_counter() - began
        time.sleep(2.0)  # let start-up settle before reading the idle memory
        self.idle_rss_mib, self.idle_pss_mib = tree_memory_mib(self.process.pid)

    def _ready(self) -> bool:
        if self.kind == "floor":  # it answers any POST
            request = urllib.request.Request(
                f"http://127.0.0.1:{self.http}/", data=json_request(0, "half_plus_two")
                .split(b"\r\n\r\n", 1)[1], method="POST"
            )  # fmt: skip
            try:
                with urllib.request.urlopen(request, timeout=5) as reply:
                    return bool(reply.status == 200)
            except OSError:
                return False
        return all(
            _get(f"http://127.0.0.1:{self.http}/v2/models/{m}/ready") is not None for m in INPUTS
        )

    def stop(self) -> None:
        os.killpg(self.process.pid, signal.SIGINT)
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


Cell = tuple[float, float, float]  # req/s, CPU µs per request, average executed batch


def run_cells(server: Server, cells: list[str], args: argparse.Namespace) -> dict[str, Cell]:
    results: dict[str, Cell] = {}
    for cell in cells:
        model, protocol, clients = CELLS[cell]
        port = server.http if protocol == "http" else server.grpc
        request = http_request(port, model) if protocol == "http" else grpc_request(model)
        before = batch_counts(server.http, model)
        split_before = cpu_by_role(server.process.pid)
        rps, cpu_us = measure(protocol, port, server.process.pid, clients, args, request)
        split_after = cpu_by_role(server.process.pid)
        after = batch_counts(server.http, model)
        executions = after[1] - before[1]
        batch = (after[0] - before[0]) / executions if executions else float("nan")
        results[cell] = (rps, cpu_us, batch)
        print(
            f"  {server.kind:6} {cell:15} {rps:8,.0f} req/s {cpu_us:7,.0f} CPU µs/req "
            f"batch {batch:5.2f}",
            flush=True,
        )
        if args.by_process:  # the tree's CPU over the whole load (warm-up included), shared out
            spent = {r: split_after.get(r, 0.0) - split_before.get(r, 0.0) for r in split_after}
            whole = sum(spent.values()) or 1.0
            print(
                "      "
                + ", ".join(f"{r} {cpu_us * v / whole:,.0f}" for r, v in spent.items() if v > 0)
                + " (CPU µs/req)",
                flush=True,
            )
    return results


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} [{min(values):.2f}-{max(values):.2f}]"


def floor(args: argparse.Namespace) -> None:
    """The floor's CPU per request and Triton's on the same JSON request, passes alternating."""
    ratios: dict[int, list[float]] = {1: [], 16: []}
    with tempfile.TemporaryDirectory(prefix="triton-python-floor-") as tmp:
        repository = write_repository(Path(tmp))
        for number in range(args.passes):
            print(f"pass {number + 1} (load average {os.getloadavg()[0]:.2f})", flush=True)
            cpu: dict[tuple[str, int], float] = {}
            kinds = ["triton", "floor"] if number % 2 == 0 else ["floor", "triton"]
            for kind in kinds:
                server = Server(kind, repository, Path(tmp), [])
                try:
                    for clients in (1, 16):
                        request = json_request(server.http, "half_plus_two")
                        rps, cpu_us = measure(
                            "http", server.http, server.process.pid, clients, args, request
                        )
                        cpu[kind, clients] = cpu_us
                        print(
                            f"  {kind:6} JSON c={clients:<2} {rps:8,.0f} req/s "
                            f"{cpu_us:7,.0f} CPU µs/req",
                            flush=True,
                        )
                finally:
                    server.stop()
            for clients in (1, 16):
                ratios[clients].append(cpu["floor", clients] / cpu["triton", clients])
    for clients, values in ratios.items():
        print(f"floor ÷ Triton CPU per request, c={clients}: {spread(values)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--inferd-args", default="", help="extra flags for inferd serve")
    parser.add_argument("--cells", default=",".join(CELLS), help=f"of {', '.join(CELLS)}")
    parser.add_argument(
        "--by-process", action="store_true", help="each cell's CPU per request by process role"
    )
    parser.add_argument("--floor", action="store_true", help="the floor beside Triton")
    args = parser.parse_args()
    if args.floor:
        if not TRITONSERVER.exists():
            sys.exit(f"Triton is not set up ({TRITONSERVER} is missing)")
        floor(args)
        return
    cells = args.cells.split(",")
    kinds = ["triton", "inferd"] if TRITONSERVER.exists() and ANCHOR.is_dir() else ["inferd"]
    if len(kinds) == 1:
        print(f"Triton is not set up ({TRITONSERVER} is missing): inferd alone, no ratios")
    results: dict[str, list[dict[str, Cell]]] = {kind: [] for kind in kinds}
    memory: dict[str, list[tuple[float, float]]] = {kind: [] for kind in kinds}
    started: dict[str, list[float]] = {kind: [] for kind in kinds}
    with tempfile.TemporaryDirectory(prefix="triton-python-bench-") as tmp:
        repository = write_repository(Path(tmp))
        for number in range(args.passes):
            print(f"pass {number + 1} (load average {os.getloadavg()[0]:.2f})", flush=True)
            for kind in kinds if number % 2 == 0 else kinds[::-1]:
                server = Server(kind, repository, Path(tmp), args.inferd_args.split())
                try:
                    memory[kind].append((server.idle_rss_mib, server.idle_pss_mib))
                    started[kind].append(server.start_s)
                    print(
                        f"  {kind:6} started in {server.start_s:.1f} s, idle tree RSS "
                        f"{server.idle_rss_mib:,.0f} MiB, PSS {server.idle_pss_mib:,.0f} MiB",
                        flush=True,
                    )
                    results[kind].append(run_cells(server, cells, args))
                finally:
                    server.stop()
        print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if len(kinds) == 1:
        return
    print("\n| cell | inferd ÷ Triton req/s | CPU per request | inferd batch | Triton batch |")
    print("|---|---|---|---|---|")
    passes = range(args.passes)
    for cell in cells:
        rps = [results["inferd"][p][cell][0] / results["triton"][p][cell][0] for p in passes]
        cpu = [results["inferd"][p][cell][1] / results["triton"][p][cell][1] for p in passes]
        i_batch = statistics.median(results["inferd"][p][cell][2] for p in passes)
        t_batch = statistics.median(results["triton"][p][cell][2] for p in passes)
        print(f"| {cell} | {spread(rps)} | {spread(cpu)} | {i_batch:.2f} | {t_batch:.2f} |")
    rss = [memory["inferd"][p][0] / memory["triton"][p][0] for p in passes]
    pss = [memory["inferd"][p][1] / memory["triton"][p][1] for p in passes]
    start = [started["inferd"][p] / started["triton"][p] for p in passes]
    print(
        f"\nidle tree inferd ÷ Triton: RSS {spread(rss)}, PSS {spread(pss)}; "
        f"start time {spread(start)}"
    )


if __name__ == "__main__":
    main()
