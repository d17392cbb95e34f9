"""Every framework backend through inferd against the same framework in process, same run.

For each backend a model is built here: a small CNN on [3, 32, 32] images (compute-bound,
about 15 M multiply-adds per image) for TensorFlow, PyTorch and OpenVINO; a forest or boosted
trees on 32 features for scikit-learn, XGBoost and LightGBM. It is first called in process (a
fresh process per framework) on the same random rows, one row per call and 8 rows per call
(rows/s); then served alone by inferd with dynamic batching and measured with ``inferd bench``
at concurrency 8, one row per request, HTTP v2 binary (infer/s). The ratio is inferd's infer/s
over the in-process rows/s at batch 8: what the batcher can reach at best.

Both sides run the framework alike: the same thread count (what ``inferd serve`` gives one
instance: every core), and OpenMP threads that sleep when idle (``OMP_WAIT_POLICY=PASSIVE``,
which ``inferd serve`` sets unless the environment says otherwise; spinning OpenMP threads
made in-process torch 5x slower than served on a loaded 2-core host). In process, the
scikit-learn forest gives labels and probabilities from one ``predict_proba``, as inferd does.

The last row serves the echo backend (no compute) the same way: at concurrency 8 each batch of
8 waits for all 8 requests, so the served rate is about 8 / (batch compute + 8 x inferd's cost
per request, client included), and a ratio of 0.8 needs a batch that computes in at least four
times what inferd spends on its 8 requests: in-process rows/s at batch 8 at most a quarter of
the echo row's infer/s.

The CPU budget bounds any server the same way, however it schedules batches: on C cores,
served rows/s <= C / (compute CPU per row + server CPU per request + client CPU per request).
The in-process run also takes the framework's CPU per row at batch 8, and the last column is
what a 0.8 ratio leaves for the server and the client together, per request:
C / (0.8 x in-process rows/s at batch 8) - compute CPU per row. The empty RSGI handler
(``empty_rsgi.py``, measured at the end under wrk) costs more than that budget on its own
where the target is out of reach of any server on this host.

    .venv/bin/python benchmarks/backends_bench.py [--interval-ms 2000] [--only torch,xgboost]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from inferd.backends.base import available_cpus
from tests.support import ServerProcess

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
IMAGE, CLASSES, TREE_FEATURES = (3, 32, 32), 10, 32
# Batches of 8 (the concurrency): wait up to 20 ms for the 8th request, else go with fewer.
BATCHING = (
    "max_batch_size: 32\n"
    "dynamic_batching { preferred_batch_size: [8] max_queue_delay_microseconds: 20000 }\n"
)
PICKLE_OK = 'parameters { key: "allow_pickle" value: { string_value: "true" } }\n'
THREADS = available_cpus()  # what inferd gives a model's one instance
Predict = Callable[[np.ndarray], Any]


def _cnn_weights() -> list[np.ndarray]:
    """A small CNN on [3, 32, 32] images: about 15 M multiply-adds per image, 60 k weights."""
    rng = np.random.default_rng(0)
    shapes = [(32, 3, 3, 3), (64, 32, 3, 3), (64, 64, 3, 3), (64, CLASSES)]
    return [(rng.standard_normal(s) / np.sqrt(np.prod(s[1:]))).astype(np.float32) for s in shapes]


def _tree_data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4000, TREE_FEATURES)).astype(np.float32)
    y = np.digitize(x[:, 0] + x[:, 1] * x[:, 2] - x[:, 3], [-1.0, 0.0, 1.0])
    return x, y


def build_torch(model_dir: Path) -> tuple[str, Predict]:
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(THREADS)
    w1, w2, w3, fc = (torch.from_numpy(w) for w in _cnn_weights())

    class Cnn(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = torch.relu(F.conv2d(x, w1, padding=1))
            h = torch.relu(F.conv2d(h, w2, stride=2, padding=1))
            h = torch.relu(F.conv2d(h, w3, padding=1))
            return h.mean(dim=(2, 3)) @ fc

    module = torch.jit.trace(Cnn(), torch.zeros((8, *IMAGE)))
    module.save(str(model_dir / "1" / "model.pt"))
    config = (
        f'input [{{ name: "INPUT__0" data_type: TYPE_FP32 dims: {list(IMAGE)} }}]\n'
        f'output [{{ name: "OUTPUT__0" data_type: TYPE_FP32 dims: [{CLASSES}] }}]\n'
    )
    loaded = torch.jit.load(str(model_dir / "1" / "model.pt"))

    def run(x: np.ndarray) -> Any:
        with torch.inference_mode():
            return loaded(torch.from_numpy(x)).numpy()

    return config, run


def build_tensorflow(model_dir: Path) -> tuple[str, Predict]:
    import tensorflow as tf

    w1, w2, w3 = (tf.constant(w.transpose(2, 3, 1, 0)) for w in _cnn_weights()[:3])  # HWIO
    fc = tf.constant(_cnn_weights()[3])
    signature = [tf.TensorSpec([None, *IMAGE], tf.float32, name="x")]

    class Cnn(tf.Module):  # type: ignore[misc]
        @tf.function(input_signature=signature)  # type: ignore[untyped-decorator]
        def serve(self, x: Any) -> dict[str, Any]:
            h = tf.transpose(x, [0, 2, 3, 1])  # NCHW in, NHWC for the CPU kernels
            h = tf.nn.relu(tf.nn.conv2d(h, w1, 1, "SAME"))
            h = tf.nn.relu(tf.nn.conv2d(h, w2, 2, "SAME"))
            h = tf.nn.relu(tf.nn.conv2d(h, w3, 1, "SAME"))
            return {"y": tf.matmul(tf.reduce_mean(h, axis=[1, 2]), fc)}

    module = Cnn()
    path = model_dir / "1" / "model.savedmodel"
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.serve})
    serve = tf.saved_model.load(str(path)).signatures["serving_default"]
    return "", lambda x: serve(x=tf.constant(x))["y"].numpy()


def build_openvino(model_dir: Path) -> tuple[str, Predict]:
    import openvino as ov
    from openvino import opset13 as ops

    w1, w2, w3, fc = (ops.constant(w) for w in _cnn_weights())

    def conv(h: Any, w: Any, stride: int) -> Any:
        return ops.relu(ops.convolution(h, w, [stride] * 2, [1, 1], [1, 1], [1, 1]))

    x = ops.parameter(ov.PartialShape([-1, *IMAGE]), ov.Type.f32, name="x")
    h = conv(conv(conv(x, w1, 1), w2, 2), w3, 1)
    pooled = ops.reduce_mean(h, ops.constant(np.array([2, 3], dtype=np.int64)), False)
    y = ops.matmul(pooled, fc, False, False)
    y.output(0).get_tensor().set_names({"y"})
    path = model_dir / "1" / "model.xml"
    ov.save_model(ov.Model([y], [x], "cnn"), str(path))
    core = ov.Core()
    properties = {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": THREADS}
    request = core.compile_model(core.read_model(str(path)), "CPU", properties)
    infer = request.create_infer_request()
    return "", lambda rows: infer.infer({"x": rows})["y"]


def build_sklearn(model_dir: Path) -> tuple[str, Predict]:
    import joblib
    from sklearn.ensemble import RandomForestClassifier

    x, y = _tree_data()
    forest = RandomForestClassifier(n_estimators=100, max_depth=10, random_state=0).fit(x, y)
    joblib.dump(forest, model_dir / "1" / "model.joblib")

    def run(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        proba = forest.predict_proba(rows)  # forest.predict is this pass plus an argmax
        return forest.classes_.take(np.argmax(proba, axis=1)), proba

    return PICKLE_OK, run


def build_xgboost(model_dir: Path) -> tuple[str, Predict]:
    import xgboost

    x, y = _tree_data()
    params = {"n_estimators": 300, "max_depth": 8, "nthread": THREADS}
    xgboost.XGBClassifier(**params).fit(x, y).save_model(model_dir / "1" / "model.json")
    booster = xgboost.Booster(model_file=str(model_dir / "1" / "model.json"))
    booster.set_param({"nthread": THREADS})
    return "", lambda rows: booster.inplace_predict(rows, validate_features=False)


def build_lightgbm(model_dir: Path) -> tuple[str, Predict]:
    import lightgbm

    x, y = _tree_data()
    params = {"n_estimators": 300, "num_leaves": 63, "verbose": -1, "n_jobs": THREADS}
    fitted = lightgbm.LGBMClassifier(**params).fit(x, y)
    fitted.booster_.save_model(model_dir / "1" / "model.txt")
    booster = lightgbm.Booster(model_file=str(model_dir / "1" / "model.txt"))
    return "", lambda rows: booster.predict(rows, num_threads=THREADS)


BUILDERS: dict[str, tuple[Callable[[Path], tuple[str, Predict]], tuple[int, ...]]] = {
    "tensorflow": (build_tensorflow, IMAGE),
    "torch": (build_torch, IMAGE),
    "openvino": (build_openvino, IMAGE),
    "sklearn": (build_sklearn, (TREE_FEATURES,)),
    "xgboost": (build_xgboost, (TREE_FEATURES,)),
    "lightgbm": (build_lightgbm, (TREE_FEATURES,)),
}


def calls_per_s(predict: Predict, rows: np.ndarray, seconds: float) -> tuple[float, float]:
    """Calls per second, and this process's CPU seconds per call."""
    warm_until = time.perf_counter() + max(1.5, seconds / 2)  # oneDNN and JIT warm up slowly
    while time.perf_counter() < warm_until:
        predict(rows)
    calls = 0
    cpu = time.process_time()
    started = time.perf_counter()
    while time.perf_counter() - started < seconds:
        predict(rows)
        calls += 1
    rate = calls / (time.perf_counter() - started)
    return rate, (time.process_time() - cpu) / max(1, calls)


def bench(server: ServerProcess, model: str, interval_ms: int) -> dict[str, Any]:
    report = Path(tempfile.mkstemp(suffix=".json")[1])
    args = [
        sys.executable,
        "-m",
        "inferd",
        "bench",
        "-m",
        model,
        "-u",
        server.http_address,
        "--concurrency-range",
        "8:8:1",
        "-p",
        str(interval_ms),
        "--max-windows",
        "5",
        "--no-progress",
        "--json-report",
        str(report),
    ]
    subprocess.run(args, check=True, stdout=subprocess.DEVNULL)
    data = json.loads(report.read_text())
    report.unlink()
    rows = data["rows"] if isinstance(data, dict) else data
    return dict(rows[-1])


def mean_batch(server: ServerProcess, model: str) -> float:
    stats = httpx.get(f"{server.http_url}/v2/models/{model}/stats").json()["model_stats"][0]
    executions = stats["execution_count"] or 1
    return float(stats["inference_count"]) / executions


def measure_in_process(name: str, root: Path, seconds: float) -> dict[str, float]:
    """Build the model and time the framework on it (run in a fresh process per backend)."""
    build, features = BUILDERS[name]
    model_dir = root / name / name
    (model_dir / "1").mkdir(parents=True, exist_ok=True)
    config, predict = build(model_dir)
    (model_dir / "config.pbtxt").write_text(f'name: "{name}"\n{config}{BATCHING}')
    rng = np.random.default_rng(1)
    one = rng.standard_normal((1, *features)).astype(np.float32)
    eight = rng.standard_normal((8, *features)).astype(np.float32)
    batch1, _ = calls_per_s(predict, one, seconds)
    calls8, cpu8 = calls_per_s(predict, eight, seconds)
    return {"batch1": batch1, "batch8": 8 * calls8, "cpu_us_per_row8": cpu8 / 8 * 1e6}


def run_backend(name: str, root: Path, interval_ms: int, seconds: float) -> str:
    # Each framework alone in its process, as in the server: no other framework's threads.
    args = [sys.executable, __file__, "--in-process", name, "--root", str(root)]
    args += ["--seconds", str(seconds)]
    env = {**os.environ, "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE")}
    done = subprocess.run(args, check=True, capture_output=True, text=True, env=env)
    local = json.loads(done.stdout.strip().splitlines()[-1])
    one, eight = local["batch1"], local["batch8"]
    budget = THREADS / (0.8 * eight) * 1e6 - local["cpu_us_per_row8"]
    server = ServerProcess(root / name, extra_args=["--allow-grpc=false"]).start(timeout_s=180)
    try:
        row = bench(server, name, interval_ms)
        batch = mean_batch(server, name)
    finally:
        server.stop()
    served = float(row["throughput_infer_per_s"])
    return (
        f"| {name} | {one:.0f} | {eight:.0f} | {served:.0f} | {served / eight:.2f} | "
        f"{batch:.1f} | {row['latency_p50_ms']:.2f} | "
        f"{'yes' if row.get('client_cpu_saturated') else 'no'} | "
        f"{local['cpu_us_per_row8']:.0f} | {budget:.0f} |"
    )


def run_echo(root: Path, interval_ms: int) -> str:
    """inferd alone: the echo backend (output = input, no compute), tree-sized rows."""
    model_dir = root / "echo" / "echo"
    (model_dir / "1").mkdir(parents=True, exist_ok=True)
    (model_dir / "config.pbtxt").write_text(
        'name: "echo"\nbackend: "echo"\n'
        f'input [{{ name: "INPUT0" data_type: TYPE_FP32 dims: [{TREE_FEATURES}] }}]\n{BATCHING}'
    )
    server = ServerProcess(root / "echo", extra_args=["--allow-grpc=false"]).start(timeout_s=60)
    try:
        row = bench(server, "echo", interval_ms)
        batch = mean_batch(server, "echo")
    finally:
        server.stop()
    return (
        f"| inferd alone (echo, no compute) | | | {float(row['throughput_infer_per_s']):.0f} | | "
        f"{batch:.1f} | {row['latency_p50_ms']:.2f} | "
        f"{'yes' if row.get('client_cpu_saturated') else 'no'} | | |"
    )


def run_empty(seconds: float) -> str:
    """The empty RSGI handler's CPU per request under wrk (c=16): no server costs less."""
    from core_bench import empty_handler

    empty = empty_handler(seconds)
    return (
        f"| empty RSGI handler (empty_rsgi.py, wrk c=16) | | | {empty['rps']:.0f} | | | | | "
        f"| {empty['cpu_us']:.0f} (its own CPU per request) |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--interval-ms", type=int, default=2000)
    parser.add_argument("--seconds", type=float, default=3.0, help="per in-process measurement")
    parser.add_argument("--only", default=",".join(BUILDERS), help="comma-separated backends")
    parser.add_argument("--in-process", help=argparse.SUPPRESS)  # one backend, in a child
    parser.add_argument("--root", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.in_process:
        print(json.dumps(measure_in_process(args.in_process, Path(args.root), args.seconds)))
        return
    root = Path(tempfile.mkdtemp(prefix="inferd-backends-bench-"))
    load_before = os.getloadavg()[0]
    print(
        "| backend | in-process rows/s, batch 1 | in-process rows/s, batch 8 | "
        "inferd infer/s, concurrency 8 | ratio to batch 8 | mean executed batch | "
        "p50 ms | client saturated | in-process CPU-µs per row, batch 8 | "
        "server + client CPU-µs per request that 0.8 leaves |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name in args.only.split(","):
        print(run_backend(name.strip(), root, args.interval_ms, args.seconds), flush=True)
    print(run_echo(root, args.interval_ms), flush=True)
    if shutil.which("wrk"):
        print(run_empty(8.0), flush=True)
    print(
        f"load average (1 min) {load_before:.2f} before, {os.getloadavg()[0]:.2f} after; "
        f"{available_cpus()} cores"
    )


if __name__ == "__main__":
    main()
