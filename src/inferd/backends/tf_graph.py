"""Finds the operations of a SavedModel (or a frozen GraphDef) that reach outside the model:
files, processes, Python.

A SavedModel is code: ``ReadFile`` in a serving function returns a server file in the
prediction, ``WriteFile`` and ``SaveV2`` write anywhere. The scan reads ``saved_model.pb``
without loading it. The checkpoint ops of the model's own saver (``SaveV2``, ``RestoreV2``...
in the functions and nodes only the saver reaches) are expected; anywhere else they count.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

# Ops that read, write or list files, run Python, or load data from paths given as tensors.
SAVER_OPS = frozenset(
    {"SaveV2", "RestoreV2", "MergeV2Checkpoints", "Save", "SaveSlices", "Restore", "RestoreSlice"}
)
FILE_OPS = frozenset(
    {
        "ReadFile",
        "WriteFile",
        "MatchingFiles",
        "ImmutableConst",
        "WholeFileReader",
        "WholeFileReaderV2",
        "TextLineReader",
        "TextLineReaderV2",
        "TFRecordReader",
        "TFRecordReaderV2",
        "FixedLengthRecordReader",
        "FixedLengthRecordReaderV2",
        "IdentityReader",
        "IdentityReaderV2",
        "LMDBReader",
        "TFRecordDataset",
        "TFRecordDatasetV2",
        "TextLineDataset",
        "FixedLengthRecordDataset",
        "FixedLengthRecordDatasetV2",
        "LMDBDataset",
        "ExperimentalLMDBDataset",
        "SqlDataset",
        "ExperimentalSqlDataset",
        "CSVDataset",
        "CSVDatasetV2",
        "ExperimentalCSVDataset",
        "SnapshotDataset",
        "SnapshotDatasetV2",
        "SaveDataset",
        "SaveDatasetV2",
        "LoadDataset",
        "DatasetToTFRecord",
        "ExperimentalDatasetToTFRecord",
        "InitializeTableFromTextFile",
        "InitializeTableFromTextFileV2",
        "CreateSummaryFileWriter",
        "CreateSummaryDbWriter",
        "WriteSummary",
        "WriteScalarSummary",
        "WriteHistogramSummary",
        "WriteImageSummary",
        "WriteAudioSummary",
        "WriteGraphSummary",
        "WriteRawProtoSummary",
        "DebugIdentityV2",
        "DebugIdentityV3",
        "DecodeProtoV2",
        "EncodeProto",
        "Skipgram",
        "GenerateVocabRemapping",
        "LoadAndRemapMatrix",
        "PyFunc",
        "PyFuncStateless",
        "EagerPyFunc",
    }
)
UNSAFE_OPS = FILE_OPS | SAVER_OPS


def _node_name(tensor: str) -> str:
    return tensor.lstrip("^").split(":")[0]


def _called(node: Any, functions: dict[str, Any]) -> Iterator[str]:
    """The library functions a node calls: its op itself, or function-valued attributes."""
    if node.op in functions:
        yield node.op
    for value in node.attr.values():
        if value.HasField("func"):
            yield value.func.name
        elif value.HasField("list"):
            yield from (f.name for f in value.list.func)


def _closure(roots: Iterable[str], functions: dict[str, Any]) -> set[str]:
    seen: set[str] = set()
    todo = [r for r in roots if r in functions]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for node in functions[name].node_def:
            todo.extend(f for f in _called(node, functions) if f in functions and f not in seen)
    return seen


def _flagged(node: Any, saver_only: bool) -> str | None:
    op: str = node.op
    if op in FILE_OPS or (op in SAVER_OPS and not saver_only):
        return op
    if op == "PrintV2":
        stream = node.attr["output_stream"].s.decode(errors="replace")
        if stream.startswith("file://"):
            return "PrintV2 (to a file)"
    return None


def _meta_graph_ops(meta: Any) -> set[str]:
    graph = meta.graph_def
    nodes = {n.name: n for n in graph.node}
    functions = {f.signature.name: f for f in graph.library.function}
    # What serving and loading run: every signature's tensors and the init/main ops.
    roots = [
        t.name
        for s in meta.signature_def.values()
        for t in (*s.inputs.values(), *s.outputs.values())
    ]
    for key in ("saved_model_main_op", "legacy_init_op", "table_initializer", "init_op"):
        if key in meta.collection_def:
            roots.extend(meta.collection_def[key].node_list.value)
    live: set[str] = set()
    todo = [_node_name(r) for r in roots]
    while todo:
        name = todo.pop()
        if name in live or name not in nodes:
            continue
        live.add(name)
        todo.extend(_node_name(i) for i in nodes[name].input)
    saver_roots = [f for n in graph.node if n.name not in live for f in _called(n, functions)]
    saver_functions = _closure(saver_roots, functions)
    live_roots = [f for n in graph.node if n.name in live for f in _called(n, functions)]
    live_roots += list(meta.object_graph_def.concrete_functions)
    live_roots += [f for f in functions if f not in saver_functions]
    live_functions = _closure(live_roots, functions)
    found: set[str] = set()
    for node in graph.node:
        op = _flagged(node, saver_only=node.name not in live)
        if op is not None:
            found.add(op)
    for name, function in functions.items():
        saver_only = name not in live_functions
        for node in function.node_def:
            op = _flagged(node, saver_only)
            if op is not None:
                found.add(op)
    return found


def unsafe_ops(saved_model: Any) -> list[str]:
    """The unsafe operations a parsed ``SavedModel`` message may run, sorted."""
    found: set[str] = set()
    for meta in saved_model.meta_graphs:
        found |= _meta_graph_ops(meta)
    return sorted(found)


def graph_def_unsafe_ops(graph_def: Any) -> list[str]:
    """The unsafe operations of a frozen ``GraphDef`` (no saver of its own: every one counts)."""
    nodes = [*graph_def.node, *(n for f in graph_def.library.function for n in f.node_def)]
    return sorted({op for node in nodes if (op := _flagged(node, saver_only=False)) is not None})
