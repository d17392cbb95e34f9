"""TensorFlow frozen GraphDefs (Triton's ``platform: "tensorflow_graphdef"``, ``model.graphdef``).

A GraphDef has no signatures: the config's input and output names are the graph's node names
(``InceptionV3/Predictions/Softmax``; ``name:0`` names a node's first output). Inputs left out
of the config are the graph's placeholders; outputs are listed. The graph runs in a TF1
session, fed and fetched by tensor name, on worker threads (TensorFlow releases the GIL).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from inferd.backends.work import Runtime
from inferd.config.model_config_pb2 import ModelConfig
from inferd.config.spec import config_enum_of, datatype_of
from inferd.core import datatypes
from inferd.core.errors import ConfigError, InternalError, InvalidInput, ModelLoadError
from inferd.core.types import Tensors

GRAPHDEF_PLATFORM = "tensorflow_graphdef"
GRAPHDEF_FILE = "model.graphdef"


def graphdef_path(version_dir: Path, config: ModelConfig) -> Path:
    return version_dir / (config.default_model_filename or GRAPHDEF_FILE)


def is_graphdef(version_dir: Path, config: ModelConfig) -> bool:
    """Whether the model is a frozen GraphDef (by platform, else by its file)."""
    if config.platform == GRAPHDEF_PLATFORM:
        return True
    return not config.platform and graphdef_path(version_dir, config).is_file()


def read_graph_def(tf: Any, path: Path) -> Any:
    graph_def = tf.compat.v1.GraphDef()
    try:
        graph_def.ParseFromString(path.read_bytes())
    except FileNotFoundError:
        raise ModelLoadError(f"no GraphDef: {path.name} is missing") from None
    except Exception as exc:
        raise ModelLoadError(f"{path.name} is not a GraphDef: {exc}") from None
    return graph_def


def node_name(tensor: str) -> str:
    """The node a tensor name belongs to (``scope/op:0`` -> ``scope/op``)."""
    name, _, index = tensor.rpartition(":")
    return name if name and index.isdigit() else tensor


def tensor_name(tensor: str) -> str:
    """A tensor name as a session feeds and fetches it (``scope/op`` -> ``scope/op:0``)."""
    return tensor if node_name(tensor) != tensor else f"{tensor}:0"


def complete_graphdef(tf: Any, version_dir: Path, config: ModelConfig, backend: str) -> None:
    """Check the config's tensors against the graph and fill in their datatypes and dims
    (TensorFlow's shape inference); inputs left out are the graph's placeholders."""
    graph_def = read_graph_def(tf, graphdef_path(version_dir, config))
    graph = _import(tf, graph_def, "/CPU:0")
    if not config.input:
        for node in graph_def.node:
            if node.op == "Placeholder":
                config.input.add(name=node.name)
    if not config.output:
        raise ConfigError(
            "a GraphDef has no signature: list its outputs (graph node names) in config.pbtxt"
        )
    batching = config.max_batch_size > 0
    for model_input in config.input:
        _complete(model_input, graph, batching, "input")
    for model_output in config.output:
        _complete(model_output, graph, batching, "output")
    config.platform = GRAPHDEF_PLATFORM
    if not config.backend:
        config.backend = backend


def _import(tf: Any, graph_def: Any, device: str) -> Any:
    graph = tf.Graph()
    with graph.as_default(), graph.device(device):
        try:
            tf.compat.v1.import_graph_def(graph_def, name="")
        except Exception as exc:
            raise ModelLoadError(f"TensorFlow cannot import the GraphDef: {exc}") from None
    return graph


def _complete(tensor: Any, graph: Any, batching: bool, kind: str) -> None:
    """Fill or check one config tensor (a ModelInput or ModelOutput) from the graph."""
    from tensorflow.core.framework import types_pb2

    try:
        found = graph.get_tensor_by_name(tensor_name(tensor.name))
    except (KeyError, ValueError):
        raise ConfigError(f"config {kind} '{tensor.name}' is not a node of the graph") from None
    dtype_name = types_pb2.DataType.Name(found.dtype.base_dtype.as_datatype_enum)
    datatype = datatypes.BY_TF_NAME.get(dtype_name)
    if datatype is None:
        raise ConfigError(
            f"graph {kind} '{tensor.name}' has dtype {dtype_name}, which inferd cannot serve"
        )
    if tensor.data_type == 0:
        tensor.data_type = config_enum_of(datatype)
    elif datatype_of(tensor.data_type, f"{kind} '{tensor.name}'") != datatype:
        raise ConfigError(
            f"config {kind} '{tensor.name}' declares "
            f"{datatype_of(tensor.data_type, kind).config_name} but the graph has "
            f"{datatype.config_name}"
        )
    if tensor.dims:
        return
    if found.shape.rank is None:
        raise ConfigError(f"config {kind} '{tensor.name}': the graph does not know its rank")
    dims = [-1 if d is None else int(d) for d in found.shape.as_list()]
    tensor.dims.extend(dims[1:] if batching else dims)
    if not tensor.dims:
        raise ConfigError(f"config {kind} '{tensor.name}': dims are missing")


class GraphDefRuntime(Runtime):
    """A frozen graph in a TF1 session; each (inputs, outputs) pair runs as a callable."""

    inline = True

    def __init__(self, tf: Any, graph_def: Any, device: str) -> None:
        self._tf = tf
        self._session = tf.compat.v1.Session(graph=_import(tf, graph_def, device))
        self._callables: dict[tuple[tuple[str, ...], tuple[str, ...]], Any] = {}
        self._lock = threading.Lock()

    def _callable(self, feeds: tuple[str, ...], fetches: tuple[str, ...]) -> Any:
        found = self._callables.get((feeds, fetches))
        if found is None:
            from tensorflow.core.protobuf import config_pb2

            options = config_pb2.CallableOptions(
                feed=[tensor_name(n) for n in feeds], fetch=[tensor_name(n) for n in fetches]
            )
            with self._lock:
                found = self._session._make_callable_from_options(options)
                self._callables[(feeds, fetches)] = found
        return found

    def execute(self, inputs: Tensors, output_names: Sequence[str]) -> Tensors:
        feeds, fetches = tuple(inputs), tuple(output_names)
        try:
            results = self._callable(feeds, fetches)(*(inputs[n] for n in feeds))
        except self._tf.errors.InvalidArgumentError as exc:
            raise InvalidInput(f"TensorFlow: {_first_line(exc)}") from None
        except Exception as exc:
            raise InternalError(f"TensorFlow execution failed: {_first_line(exc)}") from None
        return dict(zip(fetches, results, strict=True))

    def close(self) -> None:
        self._callables.clear()
        self._session.close()


def _first_line(exc: Exception) -> str:
    text = str(getattr(exc, "message", "") or exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
