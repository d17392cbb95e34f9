"""Write a demo model repository in Triton's layout, building every ONNX model locally from code.

Nothing is downloaded: weights are trained on scikit-learn's bundled digits data or drawn from a
seeded RNG, and re-running skips models whose files still match the hashes in their stamp file.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import onnx
from onnx import TensorProto, helper, numpy_helper

from inferd.demo import pipeline
from inferd.install import install_hint

DEMO_MODELS: tuple[str, ...] = ("half_plus_two", "digits", "resnet50")
# The resnet pipeline: its two Python steps, then the ensemble over them and resnet50.
PIPELINE_MODELS: tuple[str, ...] = (pipeline.PREPROCESS, pipeline.POSTPROCESS, pipeline.PIPELINE)
# TF Serving's own demo model name, written when TensorFlow is installed (inferd[tensorflow]).
SAVED_MODEL_DEMO = "saved_model_half_plus_two"

Files = dict[str, bytes]  # path relative to the model directory -> file content
FloatArray = npt.NDArray[np.float32]

_RECIPE_VERSION = 1  # bump when any builder changes so stamped models get rebuilt
_STAMP = ".inferd-demo"
_MODEL_FILE = "1/model.onnx"
_OPSET = 17
_IR_VERSION = 8
_BN_EPS = 1e-5
_DIGITS_MIN_ACCURACY = 0.95
_DIGITS_SAMPLE_ROWS = 8
_DIGITS_CONFIG = 'name: "digits"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 64\n'
_RESNET_STAGES = ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2))  # width, blocks, stride
_RESNET_PARAMS = 25_500_000
_RESNET_PARAMS_TOLERANCE = 200_000


def write_demo_repository(
    root: Path, *, models: Sequence[str] = ("half_plus_two", "digits", "resnet50")
) -> list[str]:
    """Create ``root/<name>/1/model.onnx`` (plus extras) for each model; return the names."""
    names = _validate_names(models)
    root = Path(root)
    for name in names:
        model_dir = root / name
        if not _is_current(model_dir):
            _write_model(model_dir, _BUILDERS[name]())
    return names


def missing_extra(name: str) -> str:
    """What a plain install lacks to build (or serve) demo model ``name``: the package and the
    extra that brings it, as a user types it; "" when nothing is missing."""
    need = _NEEDS.get(name)
    if need is None or importlib.util.find_spec(need[0]) is not None:
        return ""
    return f"{need[1]}: {install_hint(need[2])}"


def write_available(root: Path, models: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    """Write the models this install can build and serve (or that ``root`` already holds, as
    built); return them, and the others each with what it needs (``missing_extra``)."""
    skipped = {
        name: missing_extra(name)
        for name in _validate_names(models)
        if missing_extra(name) and not _is_current(Path(root) / name)
    }
    kept = [name for name in _validate_names(models) if name not in skipped]
    return write_demo_repository(root, models=kept), skipped


# --------------------------------------------------------------------------- repository files


def _validate_names(models: Sequence[str]) -> list[str]:
    requested = [models] if isinstance(models, str) else list(models)
    for name in requested:
        if name not in _BUILDERS:
            raise ValueError(f"unknown demo model {name!r}; expected one of {list(_BUILDERS)}")
    return list(dict.fromkeys(requested))


def _sha256_file(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _is_current(model_dir: Path) -> bool:
    """True when the stamp matches this recipe and every stamped file still has its hash."""
    try:
        stamp = json.loads((model_dir / "1" / _STAMP).read_text(encoding="utf-8"))
        files: dict[str, str] = stamp["files"]
        if stamp["recipe"] != _RECIPE_VERSION or not files:
            return False
        return all(_sha256_file(model_dir / rel) == digest for rel, digest in files.items())
    except (OSError, ValueError, KeyError, TypeError):
        return False


def _atomic_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _write_model(model_dir: Path, files: Files) -> None:
    stamp_path = model_dir / "1" / _STAMP
    stamp_path.unlink(missing_ok=True)
    for rel, data in files.items():
        _atomic_write(model_dir / rel, data)
    digests = {rel: hashlib.sha256(data).hexdigest() for rel, data in files.items()}
    stamp = json.dumps({"recipe": _RECIPE_VERSION, "files": digests}, indent=2, sort_keys=True)
    _atomic_write(stamp_path, (stamp + "\n").encode())


# --------------------------------------------------------------------------- ONNX helpers


def _initializer(name: str, array: npt.NDArray[Any]) -> TensorProto:
    return numpy_helper.from_array(np.ascontiguousarray(array), name=name)


def _serialize(graph: onnx.GraphProto) -> bytes:
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", _OPSET)], producer_name="inferd-demo"
    )
    model.ir_version = _IR_VERSION
    onnx.checker.check_model(model)
    data: bytes = model.SerializeToString()
    return data


def _run(model: bytes, feeds: dict[str, npt.NDArray[Any]]) -> list[npt.NDArray[Any]]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    outputs: list[npt.NDArray[Any]] = session.run(None, feeds)
    return outputs


# --------------------------------------------------------------------------- half_plus_two


def _build_half_plus_two() -> Files:
    graph = helper.make_graph(
        [
            helper.make_node("Mul", ["x", "half"], ["half_x"]),
            helper.make_node("Add", ["half_x", "two"], ["y"]),
        ],
        "half_plus_two",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch"])],
        initializer=[
            _initializer("half", np.array(0.5, dtype=np.float32)),
            _initializer("two", np.array(2.0, dtype=np.float32)),
        ],
    )
    model = _serialize(graph)
    x = np.array([1.0, 2.0, 5.0], dtype=np.float32)
    if not np.allclose(_run(model, {"x": x})[0], 0.5 * x + 2.0):
        raise RuntimeError("half_plus_two: ONNX output differs from 0.5 * x + 2")
    return {_MODEL_FILE: model}


# --------------------------------------------------------------------------- digits


@dataclass(frozen=True)
class _DigitsFit:
    scaler: Any
    clf: Any
    x_test: FloatArray
    y_test: npt.NDArray[np.int64]


def _train_digits() -> _DigitsFit:
    try:
        from sklearn.datasets import load_digits
        from sklearn.model_selection import train_test_split
        from sklearn.neural_network import MLPClassifier
        from sklearn.preprocessing import StandardScaler
        from threadpoolctl import threadpool_limits  # a scikit-learn dependency
    except ImportError as exc:
        raise ImportError(f"to build the digits demo model: {install_hint('demo')}") from exc
    x, y = load_digits(return_X_y=True)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.25, random_state=0)
    scaler = StandardScaler().fit(x_train)
    clf = MLPClassifier(hidden_layer_sizes=(64,), random_state=0, max_iter=500)
    # One BLAS thread: on matrices this small, a pool of spinning threads costs 10x the CPU.
    with threadpool_limits(limits=1):
        clf.fit(scaler.transform(x_train), y_train)
    accuracy = float(clf.score(scaler.transform(x_test), y_test))
    if accuracy < _DIGITS_MIN_ACCURACY:
        raise RuntimeError(f"digits: held-out accuracy {accuracy:.3f} < {_DIGITS_MIN_ACCURACY}")
    if not np.array_equal(clf.classes_, np.arange(10)):
        raise RuntimeError(f"digits: unexpected classes {clf.classes_}")
    return _DigitsFit(scaler, clf, x_test.astype(np.float32), y_test.astype(np.int64))


def _digits_initializers(fit: _DigitsFit) -> list[TensorProto]:
    """Fold the StandardScaler into the first layer: W1 / scale, b1 - (mean / scale) @ W1."""
    mean, scale = fit.scaler.mean_, fit.scaler.scale_
    w1, w2 = fit.clf.coefs_
    b1, b2 = fit.clf.intercepts_
    arrays = {
        "w1": w1 / scale[:, None],
        "b1": b1 - (mean / scale) @ w1,
        "w2": w2,
        "b2": b2,
    }
    return [_initializer(name, a.astype(np.float32)) for name, a in arrays.items()]


def _digits_graph(fit: _DigitsFit) -> onnx.GraphProto:
    nodes = [
        helper.make_node("MatMul", ["input", "w1"], ["h_mm"]),
        helper.make_node("Add", ["h_mm", "b1"], ["h_pre"]),
        helper.make_node("Relu", ["h_pre"], ["h"]),
        helper.make_node("MatMul", ["h", "w2"], ["z_mm"]),
        helper.make_node("Add", ["z_mm", "b2"], ["logits"]),
        helper.make_node("Softmax", ["logits"], ["probabilities"], axis=1),
        helper.make_node("ArgMax", ["probabilities"], ["label"], axis=1, keepdims=0),
    ]
    return helper.make_graph(
        nodes,
        "digits",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 64])],
        [
            helper.make_tensor_value_info("label", TensorProto.INT64, ["batch"]),
            helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["batch", 10]),
        ],
        initializer=_digits_initializers(fit),
    )


def _verify_digits(model: bytes, fit: _DigitsFit) -> None:
    label, proba = _run(model, {"input": fit.x_test})
    scaled = fit.scaler.transform(fit.x_test.astype(np.float64))
    if not np.array_equal(label, fit.clf.predict(scaled)):
        raise RuntimeError("digits: ONNX labels differ from scikit-learn predict()")
    if not np.allclose(proba, fit.clf.predict_proba(scaled), rtol=0.0, atol=1e-4):
        raise RuntimeError("digits: ONNX probabilities differ from scikit-learn predict_proba()")


def _build_digits() -> Files:
    fit = _train_digits()
    model = _serialize(_digits_graph(fit))
    _verify_digits(model, fit)
    sample = {
        "inputs": fit.x_test[:_DIGITS_SAMPLE_ROWS].tolist(),
        "labels": fit.y_test[:_DIGITS_SAMPLE_ROWS].tolist(),
    }
    return {
        _MODEL_FILE: model,
        "sample.json": (json.dumps(sample) + "\n").encode(),
        "config.pbtxt": _DIGITS_CONFIG.encode(),
    }


# --------------------------------------------------------------------------- resnet50


def _fold_batch_norm(weight: FloatArray, channels: int) -> tuple[FloatArray, FloatArray]:
    """Fold a freshly initialised BatchNorm (gamma 1, beta 0, mean 0, var 1) into a conv."""
    gamma = np.ones(channels, dtype=np.float32)
    beta = np.zeros(channels, dtype=np.float32)
    mean = np.zeros(channels, dtype=np.float32)
    var = np.ones(channels, dtype=np.float32)
    factor = gamma / np.sqrt(var + np.float32(_BN_EPS))
    return weight * factor[:, None, None, None], beta - mean * factor


@dataclass
class _ResNetBuilder:
    """Accumulates the nodes and folded weights of a torchvision-layout ResNet-50 v1.5."""

    rng: np.random.Generator
    nodes: list[onnx.NodeProto] = field(default_factory=list)
    weights: list[TensorProto] = field(default_factory=list)
    n_params: int = 0

    def add_weight(self, name: str, array: FloatArray) -> str:
        self.weights.append(_initializer(name, array))
        self.n_params += array.size
        return name

    def op(self, op_type: str, inputs: list[str], name: str, **attrs: Any) -> str:
        self.nodes.append(helper.make_node(op_type, inputs, [name], name=name, **attrs))
        return name

    def relu(self, x: str) -> str:
        return self.op("Relu", [x], f"{x}.relu")

    def conv_bn(self, x: str, name: str, c_in: int, c_out: int, k: int, stride: int) -> str:
        """Conv (He-normal, fan_out) with its BatchNorm folded into weight and bias."""
        std = np.float32(np.sqrt(2.0 / (c_out * k * k)))
        w = self.rng.standard_normal((c_out, c_in, k, k), dtype=np.float32) * std
        w, b = _fold_batch_norm(w, c_out)
        inputs = [x, self.add_weight(f"{name}.weight", w), self.add_weight(f"{name}.bias", b)]
        pads = [k // 2] * 4
        return self.op("Conv", inputs, name, kernel_shape=[k, k], strides=[stride] * 2, pads=pads)

    def bottleneck(self, x: str, name: str, c_in: int, width: int, stride: int) -> str:
        c_out = width * 4
        h = self.relu(self.conv_bn(x, f"{name}.conv1", c_in, width, 1, 1))
        h = self.relu(self.conv_bn(h, f"{name}.conv2", width, width, 3, stride))
        h = self.conv_bn(h, f"{name}.conv3", width, c_out, 1, 1)
        shortcut = x
        if stride != 1 or c_in != c_out:
            shortcut = self.conv_bn(x, f"{name}.downsample", c_in, c_out, 1, stride)
        return self.relu(self.op("Add", [h, shortcut], f"{name}.add"))

    def stem(self, x: str) -> str:
        h = self.relu(self.conv_bn(x, "conv1", 3, 64, 7, 2))
        return self.op("MaxPool", [h], "maxpool", kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4)

    def head(self, x: str, c_in: int, classes: int) -> str:
        h = self.op("Flatten", [self.op("GlobalAveragePool", [x], "avgpool")], "flatten", axis=1)
        bound = np.float32(1.0 / np.sqrt(c_in))
        w = self.rng.uniform(-bound, bound, (classes, c_in)).astype(np.float32)
        b = self.rng.uniform(-bound, bound, classes).astype(np.float32)
        inputs = [h, self.add_weight("fc.weight", w), self.add_weight("fc.bias", b)]
        return self.op("Gemm", inputs, "output", transB=1)


def _resnet50_graph(rng: np.random.Generator) -> tuple[onnx.GraphProto, int]:
    builder = _ResNetBuilder(rng)
    x, c_in = builder.stem("input"), 64
    for stage, (width, blocks, stride) in enumerate(_RESNET_STAGES, start=1):
        for block in range(blocks):
            name = f"layer{stage}.{block}"
            x = builder.bottleneck(x, name, c_in, width, stride if block == 0 else 1)
            c_in = width * 4
    builder.head(x, c_in, 1000)
    graph = helper.make_graph(
        builder.nodes,
        "resnet50",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 3, 224, 224])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", 1000])],
        initializer=builder.weights,
    )
    return graph, builder.n_params


def _verify_resnet50(model: bytes, n_params: int, rng: np.random.Generator) -> None:
    if abs(n_params - _RESNET_PARAMS) > _RESNET_PARAMS_TOLERANCE:
        raise RuntimeError(f"resnet50: {n_params} parameters, expected about 25.5M")
    x = rng.standard_normal((1, 3, 224, 224), dtype=np.float32)
    (out,) = _run(model, {"input": x})
    if out.shape != (1, 1000) or not np.isfinite(out).all() or np.ptp(out) == 0.0:
        raise RuntimeError(f"resnet50: bad output, shape {out.shape}, range {np.ptp(out)}")


def _build_resnet50() -> Files:
    rng = np.random.default_rng(0)
    graph, n_params = _resnet50_graph(rng)
    model = _serialize(graph)
    _verify_resnet50(model, n_params, rng)
    return {_MODEL_FILE: model}


# --------------------------------------------------------------------------- SavedModel


def tensorflow_available() -> bool:
    return importlib.util.find_spec("tensorflow") is not None


def default_models() -> list[str]:
    """What ``inferd demo-models`` writes: the ONNX models, the ``resnet`` pipeline (an ensemble
    of two Python steps around resnet50), plus the SavedModel with TensorFlow."""
    return (
        list(DEMO_MODELS)
        + list(PIPELINE_MODELS)
        + ([SAVED_MODEL_DEMO] if tensorflow_available() else [])
    )


def _build_saved_model_half_plus_two() -> Files:
    """TF Serving's demo model, as a real SavedModel in TF Serving's layout (1/saved_model.pb)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        import tensorflow as tf
    except ImportError as exc:
        hint = install_hint("tensorflow")
        raise ImportError(f"to build {SAVED_MODEL_DEMO}: {hint}") from exc

    signature = [tf.TensorSpec([None], tf.float32, name="x")]

    class HalfPlusTwo(tf.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.a = tf.Variable(0.5, name="a")
            self.b = tf.Variable(2.0, name="b")

        @tf.function(input_signature=signature)  # type: ignore[untyped-decorator]
        def serve(self, x: Any) -> dict[str, Any]:
            return {"y": self.a * x + self.b}

    module = HalfPlusTwo()
    with tempfile.TemporaryDirectory() as tmp:
        tf.saved_model.save(module, tmp, signatures={"serving_default": module.serve})
        serve = tf.saved_model.load(tmp).signatures["serving_default"]
        y = serve(x=tf.constant([1.0, 2.0, 5.0]))["y"].numpy()
        if not np.allclose(y, [2.5, 3.0, 4.5]):
            raise RuntimeError(
                f"{SAVED_MODEL_DEMO}: SavedModel output {y} differs from 0.5 * x + 2"
            )
        root = Path(tmp)
        return {
            f"1/{p.relative_to(root).as_posix()}": p.read_bytes()
            for p in sorted(root.rglob("*"))
            if p.is_file()
        }


# What each demo model needs beyond a plain install: (module, package, extra). The resnet
# pipeline's image step decodes with Pillow when it runs, so the whole pipeline needs it.
_NEEDS: dict[str, tuple[str, str, str]] = {
    "digits": ("sklearn", "scikit-learn", "demo"),
    pipeline.PREPROCESS: ("PIL", "Pillow", "demo"),
    pipeline.POSTPROCESS: ("PIL", "Pillow", "demo"),
    pipeline.PIPELINE: ("PIL", "Pillow", "demo"),
    SAVED_MODEL_DEMO: ("tensorflow", "TensorFlow", "tensorflow"),
}

_BUILDERS: dict[str, Callable[[], Files]] = {
    "half_plus_two": _build_half_plus_two,
    "digits": _build_digits,
    "resnet50": _build_resnet50,
    SAVED_MODEL_DEMO: _build_saved_model_half_plus_two,
    pipeline.PREPROCESS: pipeline.preprocess_files,
    pipeline.POSTPROCESS: pipeline.postprocess_files,
    pipeline.PIPELINE: pipeline.pipeline_files,
}
