"""TensorFlow backend: SavedModels, in Triton's layout (``<version>/model.savedmodel/``) or TF
Serving's (``<version>/saved_model.pb`` + ``variables/``).

The model's own inputs and outputs are one signature's: config parameter ``signature_name``
(default ``serving_default``); its keys are the tensor names, and the config is completed from
its dtypes and shapes. Every other signature is listed too (``signatures``) and runs on
request (TF Serving's ``signature_name``). A SavedModel that ``tf.saved_model.load`` cannot
load (TF1 graphs: ``ParseExample`` signatures, assets, legacy init ops, as TF Serving's own
test models) loads with the TF1 loader into a session, which feeds tensors as TF Serving does.
Threads: TensorFlow's pools are process-wide and set once, at the first load, to the machine's
cores (parameters ``intra_op_thread_count``, ``inter_op_thread_count`` override them);
TensorFlow releases the GIL inside its ops, so instances run on worker threads.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from inferd.backends.base import Backend, InstancePlacement, available_cpus
from inferd.backends.completion import (
    TensorIO,
    check_parameters,
    complete,
    int_parameter,
    missing_extra,
    string_parameters,
)
from inferd.backends.graphdef import (
    GRAPHDEF_PLATFORM,
    GraphDefRuntime,
    complete_graphdef,
    graphdef_path,
    is_graphdef,
    read_graph_def,
)
from inferd.backends.tf_graph import graph_def_unsafe_ops, unsafe_ops
from inferd.backends.work import Runtime
from inferd.config.model_config_pb2 import ModelConfig
from inferd.config.spec import CLASSIFY_METHOD, REGRESS_METHOD, SignatureSpec, signature_spec
from inferd.core import datatypes
from inferd.core.errors import ConfigError, InferdError, InternalError, InvalidInput, ModelLoadError
from inferd.core.types import Tensors
from inferd.security.trust import Capability, allowed, require

log = logging.getLogger("inferd.backends.tensorflow")

PLATFORM = "tensorflow_savedmodel"
DEFAULT_SIGNATURE = "serving_default"
SAVED_MODEL_DIR = "model.savedmodel"  # Triton's layout
SAVED_MODEL_FILE = "saved_model.pb"  # TF Serving's layout: directly in the version folder
_SERVE_TAG = "serve"
_KNOWN_PARAMETERS = {"signature_name", "intra_op_thread_count", "inter_op_thread_count"}
_threads_lock = threading.Lock()
_threads_set = False


def _tensorflow() -> Any:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # no C++ info lines in the server log
    try:
        import tensorflow
    except ImportError as exc:
        raise missing_extra("TensorFlow", "tensorflow", exc) from None
    return tensorflow


def saved_model_dir(version_dir: Path, config: ModelConfig) -> Path:
    """The SavedModel folder: ``model.savedmodel`` (or the configured name), else the version."""
    named = version_dir / (config.default_model_filename or SAVED_MODEL_DIR)
    if named.is_dir() or config.default_model_filename:
        return named
    if (version_dir / SAVED_MODEL_FILE).is_file():
        return version_dir
    return named


def signature_name(config: ModelConfig) -> str:
    params = string_parameters(config)
    return params.get("signature_name") or DEFAULT_SIGNATURE


def _parse(path: Path) -> Any:
    """The ``SavedModel`` message of ``saved_model.pb`` (every MetaGraph), read without loading
    the model."""
    _tensorflow()
    from tensorflow.core.protobuf import saved_model_pb2

    pb = path / SAVED_MODEL_FILE
    saved = saved_model_pb2.SavedModel()
    try:
        saved.ParseFromString(pb.read_bytes())
    except FileNotFoundError:
        raise ModelLoadError(
            f"no SavedModel at {path.name}: {SAVED_MODEL_FILE} is missing"
        ) from None
    except Exception as exc:
        raise ModelLoadError(f"cannot read {pb.name}: {exc}") from None
    return saved


def check_ops(path: Path) -> None:
    """Refuse a graph with file-system or Python ops unless --allow-unsafe-ops grants them."""
    if allowed(Capability.UNSAFE_OPS):
        return
    ops = unsafe_ops(_parse(path))
    if ops:
        require(
            Capability.UNSAFE_OPS,
            f"the SavedModel holds file-system or process operations ({', '.join(ops)})",
        )


def check_graph_def_ops(graph_def: Any) -> None:
    """The same refusal for a frozen GraphDef's operations."""
    if allowed(Capability.UNSAFE_OPS):
        return
    ops = graph_def_unsafe_ops(graph_def)
    if ops:
        require(
            Capability.UNSAFE_OPS,
            f"the GraphDef holds file-system or process operations ({', '.join(ops)})",
        )


def read_meta_graph(path: Path) -> Any:
    """The serving MetaGraphDef of ``saved_model.pb``, read without loading the model."""
    saved = _parse(path)
    graphs = [g for g in saved.meta_graphs if _SERVE_TAG in g.meta_info_def.tags]
    graphs = graphs or list(saved.meta_graphs)
    if not graphs:
        raise ModelLoadError(f"{SAVED_MODEL_FILE} holds no MetaGraph")
    return graphs[0]


def read_signature(path: Path, name: str) -> tuple[list[TensorIO], list[TensorIO]]:
    """The inputs and outputs of one signature, read from saved_model.pb without loading it."""
    graph = read_meta_graph(path)
    signatures = graph.signature_def
    if name not in signatures:
        raise ConfigError(
            f"the SavedModel has no signature '{name}' (it has: {_names(signatures)}); set the "
            'config parameter signature_name, e.g. parameters { key: "signature_name" '
            'value: { string_value: "..." } }'
        )
    return _signature_io(signatures[name], _GraphShapes(graph))


def _names(signatures: Any) -> str:
    return ", ".join(sorted(k for k in signatures if not k.startswith("__"))) or "none"


def _signature_io(signature: Any, shapes: _GraphShapes) -> tuple[list[TensorIO], list[TensorIO]]:
    # Signature maps have no order: sort by name so that metadata is the same on every load.
    return (
        [_tensor_io(key, signature.inputs[key], shapes) for key in sorted(signature.inputs)],
        [_tensor_io(key, signature.outputs[key], shapes) for key in sorted(signature.outputs)],
    )


class _GraphShapes:
    """Tensor shapes a TF1 graph records on its nodes (``_output_shapes``): TF1 exporters wrote
    signatures without shapes, so the graph is where they are."""

    def __init__(self, graph: Any) -> None:
        self._graph = graph
        self._nodes: dict[str, Any] | None = None

    def of(self, tensor_name: str) -> Any:
        if self._nodes is None:
            self._nodes = {node.name: node for node in self._graph.graph_def.node}
        node_name, _, index = tensor_name.partition(":")
        node = self._nodes.get(node_name)
        if node is None or "_output_shapes" not in node.attr:
            return None
        shapes = node.attr["_output_shapes"].list.shape
        position = int(index or 0)
        return shapes[position] if position < len(shapes) else None


def _tensor_io(key: str, info: Any, shapes: _GraphShapes) -> TensorIO:
    from tensorflow.core.framework import types_pb2

    dtype_name = types_pb2.DataType.Name(info.dtype)
    datatype = datatypes.BY_TF_NAME.get(dtype_name)
    if datatype is None:
        raise ConfigError(
            f"signature tensor '{key}' has dtype {dtype_name}, which inferd cannot serve"
        )
    shape = info.tensor_shape if info.HasField("tensor_shape") else shapes.of(info.name)
    if shape is None or shape.unknown_rank:
        raise ConfigError(
            f"signature tensor '{key}' has an unknown rank; list its dims in config.pbtxt"
        )
    return TensorIO(key, datatype, tuple(int(d.size) if d.size >= 0 else -1 for d in shape.dim))


def read_signatures(path: Path, config: ModelConfig) -> dict[str, SignatureSpec]:
    """Every signature of the SavedModel that inferd can serve (one whose tensors have no
    known rank is left out, with a log line; a ParseExample signature's input of unknown rank
    takes a batch of serialized examples)."""
    graph = read_meta_graph(path)
    shapes = _GraphShapes(graph)
    found: dict[str, SignatureSpec] = {}
    for name, signature in sorted(graph.signature_def.items()):
        if name.startswith("__"):
            continue
        parses = signature.method_name in (CLASSIFY_METHOD, REGRESS_METHOD)
        try:
            inputs = [_example_io(k, signature.inputs[k], shapes, parses) for k in signature.inputs]
            outputs = [_tensor_io(k, signature.outputs[k], shapes) for k in signature.outputs]
        except ConfigError as exc:
            log.info("model '%s': signature '%s' is not served: %s", config.name, name, exc)
            continue
        found[name] = signature_spec(
            config,
            name,
            signature.method_name,
            [(t.name, t.datatype, t.shape) for t in sorted(inputs, key=lambda t: t.name)],
            [(t.name, t.datatype, t.shape) for t in sorted(outputs, key=lambda t: t.name)],
        )
    return found


def _example_io(key: str, info: Any, shapes: _GraphShapes, parses: bool) -> TensorIO:
    try:
        return _tensor_io(key, info, shapes)
    except ConfigError:
        if not parses:
            raise
        return TensorIO(key, datatypes.BYTES, (-1,))  # serialized tf.Examples, one per row


def _set_threads(tf: Any, intra: int, inter: int) -> None:
    global _threads_set
    with _threads_lock:
        if _threads_set:
            return
        _threads_set = True
        try:
            tf.config.threading.set_intra_op_parallelism_threads(intra)
            tf.config.threading.set_inter_op_parallelism_threads(inter)
        except RuntimeError:  # the runtime started before the first model loaded
            log.debug("TensorFlow thread pools were already set up")


class TensorFlowBackend(Backend):
    name = "tensorflow"
    platforms: tuple[str, ...] = (PLATFORM, GRAPHDEF_PLATFORM)
    default_filename = SAVED_MODEL_DIR

    def gpu_available(self) -> bool:
        try:
            tf = _tensorflow()
        except ModelLoadError:
            return False
        return bool(tf.config.list_physical_devices("GPU"))

    def complete_config(
        self, version_dir: Path, config: ModelConfig, default_max_batch_size: int
    ) -> None:
        check_parameters(string_parameters(config), _KNOWN_PARAMETERS, "tensorflow", config.name)
        if is_graphdef(version_dir, config):
            complete_graphdef(_tensorflow(), version_dir, config, self.name)
            return
        path = saved_model_dir(version_dir, config)
        check_ops(path)
        inputs, outputs = read_signature(path, signature_name(config))
        complete(
            config, inputs, outputs, default_max_batch_size, platform=PLATFORM, backend=self.name
        )

    def signatures(self, version_dir: Path, config: ModelConfig) -> dict[str, SignatureSpec]:
        if is_graphdef(version_dir, config):
            return {}  # a GraphDef has only the config's inputs and outputs
        return read_signatures(saved_model_dir(version_dir, config), config)

    def load(
        self, version_dir: Path, config: ModelConfig, placement: InstancePlacement
    ) -> TensorFlowRuntime | SessionRuntime | GraphDefRuntime:
        tf = _tensorflow()
        params = string_parameters(config)
        check_parameters(params, _KNOWN_PARAMETERS, "tensorflow", config.name)
        _set_threads(
            tf,
            int_parameter(params, "intra_op_thread_count", available_cpus()),
            int_parameter(params, "inter_op_thread_count", 1),
        )
        device = f"/GPU:{placement.device_id}" if placement.kind == "GPU" else "/CPU:0"
        if is_graphdef(version_dir, config):
            graph_def = read_graph_def(tf, graphdef_path(version_dir, config))
            check_graph_def_ops(graph_def)
            return GraphDefRuntime(tf, graph_def, device)
        path = saved_model_dir(version_dir, config)
        check_ops(path)
        name = signature_name(config)
        try:
            with tf.device(device):
                loaded = tf.saved_model.load(str(path), tags=[_SERVE_TAG])
        except Exception as exc:
            why = _first_line(exc)
            log.info("model '%s': tf.saved_model.load failed (%s); as TF1 now", config.name, why)
            return _load_session(tf, path, name, device, why)
        if name not in loaded.signatures:
            raise ConfigError(
                f"the SavedModel has no signature '{name}' "
                f"(it has: {', '.join(loaded.signatures) or 'none'})"
            )
        return TensorFlowRuntime(tf, loaded, name, device)


def _outputs(results: Any, output_names: Sequence[str]) -> Tensors:
    outputs: Tensors = {}
    for name in output_names:
        if name not in results:
            raise InternalError(f"the signature returned no output '{name}'")
        array = results[name]
        array = array.numpy() if hasattr(array, "numpy") else np.asarray(array)
        outputs[name] = array if array.dtype != object else np.asarray(array, dtype=object)
    return outputs


def _failure(tf: Any, exc: Exception) -> InferdError:
    """A TensorFlow error as the request's: bad input (say, a tf.Example that does not parse)
    is the client's, anything else the model's."""
    if isinstance(exc, InferdError):
        return exc
    if isinstance(exc, tf.errors.InvalidArgumentError):
        return InvalidInput(f"TensorFlow: {_first_line(exc)}")
    return InternalError(f"TensorFlow execution failed: {_first_line(exc)}")


class TensorFlowRuntime(Runtime):
    """One SavedModel loaded by ``tf.saved_model.load``; signature functions run whole batches."""

    inline = True

    def __init__(self, tf: Any, loaded: Any, signature: str, device: str) -> None:
        self._tf = tf
        self._loaded = loaded  # keeps the variables the functions capture alive
        self._signature = signature
        self._device = device
        self._functions = dict(loaded.signatures)  # the signature map's lookup is not free

    def execute(self, inputs: Tensors, output_names: Sequence[str]) -> Tensors:
        return self.execute_signature(self._signature, inputs, output_names)

    def execute_signature(
        self, signature: str, inputs: Tensors, output_names: Sequence[str]
    ) -> Tensors:
        tf = self._tf
        try:
            function = self._functions[signature]
            with tf.device(self._device):
                feeds = {name: tf.constant(array) for name, array in inputs.items()}
                results = function(**feeds)
        except Exception as exc:
            raise _failure(tf, exc) from None
        return _outputs(results, output_names)

    def close(self) -> None:
        self._functions.clear()
        self._loaded = None


def _load_session(tf: Any, path: Path, name: str, device: str, why: str) -> SessionRuntime:
    v1 = tf.compat.v1
    graph = tf.Graph()
    session = v1.Session(graph=graph)
    try:
        with graph.as_default(), graph.device(device):
            meta = v1.saved_model.loader.load(session, [_SERVE_TAG], str(path))
    except Exception as exc:
        session.close()
        raise ModelLoadError(
            f"TensorFlow cannot load the SavedModel {path.name}: {why}; "
            f"nor as a TF1 SavedModel: {_first_line(exc)}"
        ) from None
    if name not in meta.signature_def:
        session.close()
        raise ConfigError(
            f"the SavedModel has no signature '{name}' (it has: {_names(meta.signature_def)})"
        )
    return SessionRuntime(tf, session, meta.signature_def, name)


class SessionRuntime(Runtime):
    """A TF1 SavedModel in a session: each signature runs as a callable on its tensor names,
    which feeds tensors without Python's shape checks (as TF Serving's C++ session does)."""

    inline = True

    def __init__(self, tf: Any, session: Any, signatures: Any, signature: str) -> None:
        self._tf = tf
        self._session = session
        self._signatures = signatures
        self._signature = signature
        self._callables: dict[tuple[str, tuple[str, ...], tuple[str, ...]], Any] = {}
        self._lock = threading.Lock()

    def execute(self, inputs: Tensors, output_names: Sequence[str]) -> Tensors:
        return self.execute_signature(self._signature, inputs, output_names)

    def _callable(self, signature: str, feeds: tuple[str, ...], fetches: tuple[str, ...]) -> Any:
        key = (signature, feeds, fetches)
        found = self._callables.get(key)
        if found is None:
            from tensorflow.core.protobuf import config_pb2

            definition = self._signatures[signature]
            options = config_pb2.CallableOptions(
                feed=[definition.inputs[n].name for n in feeds],
                fetch=[definition.outputs[n].name for n in fetches],
            )
            with self._lock:
                # The public make_callable checks fed shapes in Python; TF Serving does not.
                found = self._callables[key] = self._session._make_callable_from_options(options)
        return found

    def execute_signature(
        self, signature: str, inputs: Tensors, output_names: Sequence[str]
    ) -> Tensors:
        feeds, fetches = tuple(inputs), tuple(output_names)
        try:
            results = self._callable(signature, feeds, fetches)(*(inputs[n] for n in feeds))
        except Exception as exc:
            raise _failure(self._tf, exc) from None
        return _outputs(dict(zip(fetches, results, strict=True)), output_names)

    def close(self) -> None:
        self._callables.clear()
        self._session.close()


def _first_line(exc: Exception) -> str:
    """The line of a TensorFlow error that says what went wrong (a graph execution error puts
    it last, after where the node was defined)."""
    text = str(getattr(exc, "message", "") or exc).strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    lines = [line for line in lines if not line.startswith("[[")] or lines
    if not lines:
        return type(exc).__name__
    return lines[-1] if lines[0].startswith("Graph execution error") else lines[0]
