"""inferd optimize and inferd tune, measured: resnet50 INT8 vs FP32 served side by side, digits
INT8 accuracy, and tune's best digits config against the default one.

resnet50: ``inferd optimize --int8 static`` calibrated on realistic images (crops of
scikit-learn's two bundled photos, ImageNet-normalized), top-1 agreement on 500 other crops,
then both versions served by one inferd with dynamic batching and measured with ``inferd bench``
at batch 32, alternating FP32 and INT8 rounds so machine drift hits both. The demo resnet50 has
random weights, so top-1 also shows how many classes it predicts at all, and the agreement of
argmax(logits - mean logits), a harder test of whether INT8 keeps the per-image differences.
Usage:

    .venv/bin/python benchmarks/optimize_bench.py [--rounds 2] [--skip-tune]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnxruntime as ort

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from inferd.demo.models import write_demo_repository
from tests.optimize_support import inferd, write_digits_held_out
from tests.support import ServerProcess

CHECK_ROWS = 500
CALIBRATION_ROWS = 64
SEED_IMG_PER_S = 88.95  # the seeds' ResNet-50 batch 32 on 16 CascadeLake cores
SEED_CORES = 16
RESNET_CONFIG = """name: "resnet50"
platform: "onnxruntime_onnx"
max_batch_size: 32
version_policy: { all {} }
dynamic_batching { }
"""


def realistic_images(count: int, seed: int) -> np.ndarray:
    """Random crops (scale, position, flip) of scikit-learn's bundled photos, 224x224, with
    ImageNet's mean and std: the statistics a real ImageNet model sees."""
    from sklearn.datasets import load_sample_images

    photos = load_sample_images().images
    rng = np.random.default_rng(seed)
    mean = np.array([0.485, 0.456, 0.406], np.float32)[:, None, None]
    std = np.array([0.229, 0.224, 0.225], np.float32)[:, None, None]
    out = np.empty((count, 3, 224, 224), np.float32)
    for i in range(count):
        photo = photos[rng.integers(len(photos))]
        side = int(rng.integers(224, min(photo.shape[:2]) + 1))
        y = int(rng.integers(0, photo.shape[0] - side + 1))
        x = int(rng.integers(0, photo.shape[1] - side + 1))
        index = (np.arange(224) * side / 224).astype(int)
        patch = photo[y : y + side, x : x + side][index][:, index]
        if rng.random() < 0.5:
            patch = patch[:, ::-1]
        out[i] = (patch.transpose(2, 0, 1) / 255.0 - mean) / std
    return out


def logits(path: Path, images: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return np.concatenate(
        [session.run(None, {"input": images[i : i + 32]})[0] for i in range(0, len(images), 32)]
    )


def bench_img_per_s(server: ServerProcess, version: int, out: Path) -> float:
    report = out / f"bench-v{version}.json"
    done = inferd(
        "bench", "-m", "resnet50", "-x", str(version), "-u", server.http_address,
        "-b", "32", "--concurrency-range", "2", "-p", "20000", "--max-windows", "4",
        "--json-report", str(report), "--no-progress", timeout_s=900,
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(done.stderr)
    row = json.loads(report.read_text())["rows"][0]
    return float(row["throughput_infer_per_s"])


def resnet50(work: Path, rounds: int) -> None:
    repo = work / "repo"
    write_demo_repository(work / "demo", models=["resnet50", "digits"])
    shutil.rmtree(repo, ignore_errors=True)
    shutil.copytree(work / "demo" / "resnet50", repo / "resnet50")
    (repo / "resnet50" / "config.pbtxt").write_text(RESNET_CONFIG)
    images = realistic_images(CALIBRATION_ROWS + CHECK_ROWS, seed=0)
    np.savez(work / "images.npz", input=images)
    report = work / "resnet50-optimize.json"
    done = inferd(
        "optimize", str(repo / "resnet50"), "--int8", "static",
        "--calibration", str(work / "images.npz"),
        "--calibration-samples", str(CALIBRATION_ROWS), "--check-samples", str(CHECK_ROWS),
        "--report", str(report), "--no-progress", timeout_s=1800,
    )  # fmt: skip
    print(done.stdout)
    if done.returncode != 0:
        raise SystemExit(done.stderr)
    doc = json.loads(report.read_text())

    held_out = images[CALIBRATION_ROWS:]
    fp32 = logits(repo / "resnet50" / "1" / "model.onnx", held_out)
    int8 = logits(repo / "resnet50" / "2" / "model.onnx", held_out)
    centered = fp32.mean(axis=0)
    centered_agreement = float(((fp32 - centered).argmax(1) == (int8 - centered).argmax(1)).mean())
    classes = len(set(fp32.argmax(1).tolist()))

    server = ServerProcess(repo, extra_args=["--allow-grpc=false"]).start()
    rates: dict[int, list[float]] = {1: [], 2: []}
    try:
        for _ in range(rounds):
            for version in (1, 2):
                rates[version].append(bench_img_per_s(server, version, work))
    finally:
        server.stop()
    fp32_rate, int8_rate = statistics.median(rates[1]), statistics.median(rates[2])
    print("| resnet50, inferd HTTP binary, batch 32, dynamic batching | img/s (median) | rounds |")
    print("|---|---|---|")
    print(f"| FP32 (version 1) | {fp32_rate:.2f} | {rates[1]} |")
    print(f"| INT8 static QDQ per-channel (version 2) | {int8_rate:.2f} | {rates[2]} |")
    print(f"\nINT8 / FP32 throughput: {int8_rate / fp32_rate:.2f}x")
    print(f"top-1 agreement on {doc['check_rows']} held-out images: {doc['agreement']:.2%}")
    print(f"  FP32 predicts {classes} distinct class(es) over those images (random weights)")
    print(f"  agreement of argmax(logits - mean logits): {centered_agreement:.2%}")
    cores = len(os.sched_getaffinity(0))
    seeds = SEED_IMG_PER_S / SEED_CORES
    print(
        f"per core: INT8 {int8_rate / cores:.2f} img/s/core on {cores} cores vs the seeds' "
        f"{seeds:.2f} img/s/core ({SEED_IMG_PER_S} img/s on {SEED_CORES} CascadeLake cores): "
        f"{int8_rate / cores / seeds:.2f}x; FP32 {fp32_rate / cores:.2f} img/s/core"
    )


def digits(work: Path) -> None:
    repo = work / "digits-repo"
    shutil.rmtree(repo, ignore_errors=True)
    shutil.copytree(work / "demo" / "digits", repo / "digits")
    write_digits_held_out(work / "digits.npz")
    report = work / "digits-optimize.json"
    done = inferd(
        "optimize", str(repo / "digits"), "--int8", "dynamic",
        "--calibration", str(work / "digits.npz"), "--check-samples", "450",
        "--report", str(report), "--no-progress",
    )  # fmt: skip
    print(done.stdout, done.stderr)
    if done.returncode != 0:
        raise SystemExit(done.stderr)
    acc = json.loads(report.read_text())["accuracy"]
    points = (acc["optimized"] - acc["original"]) * 100
    print(
        f"digits held-out accuracy ({acc['rows']} rows): FP32 {acc['original']:.2%}, "
        f"INT8 {acc['optimized']:.2%} ({points:+.2f} points)"
    )


def tune(work: Path, budget_ms: float) -> None:
    repo = work / "tune-repo"
    shutil.rmtree(repo, ignore_errors=True)
    shutil.copytree(work / "demo" / "digits", repo / "digits")
    args = ["--model-control-mode", "explicit", "--load-model", "digits", "--allow-grpc=false"]
    server = ServerProcess(repo, extra_args=args).start()
    try:
        done = inferd(
            "tune", "digits", "-u", server.http_address, "--model-repository", str(repo),
            "--latency-budget-ms", str(budget_ms), "--concurrency", "1:8",
            "--max-delay-us", "0,500", "--measurement-interval-ms", "2000",
            "--output-dir", str(work / "tune-digits"), "--no-progress", timeout_s=1800,
        )  # fmt: skip
    finally:
        server.stop()
    print(done.stdout)
    if done.returncode != 0:
        raise SystemExit(done.stderr)
    print((work / "tune-digits" / "config.pbtxt").read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--budget-ms", type=float, default=50.0)
    parser.add_argument("--skip-resnet", action="store_true")
    parser.add_argument("--skip-tune", action="store_true")
    args = parser.parse_args()
    flags = Path("/proc/cpuinfo").read_text().split("\nflags")[1].split("\n")[0].split()
    vnni = sorted(f for f in flags if "avx512" in f or "vnni" in f)
    print(f"CPU flags avx512*/vnni: {vnni or 'none (AVX2 only)'}; load {os.getloadavg()}")
    work = Path(tempfile.gettempdir()) / "inferd-optimize-bench"
    work.mkdir(exist_ok=True)
    if args.skip_resnet:
        write_demo_repository(work / "demo", models=["digits"])
    else:
        resnet50(work, args.rounds)
    digits(work)
    if not args.skip_tune:
        tune(work, args.budget_ms)
    print(f"load average at the end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
