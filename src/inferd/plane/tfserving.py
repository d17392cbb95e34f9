"""TensorFlow Serving's semantics, once, for its REST and gRPC adapters: signature choice,
predict (with TF Serving's shape leniency), classify and regress (classification and
regression signatures, or a fitting output of any model), and the signature metadata.

Each request is routed once (``TfServing.target``: version, label or traffic split, then the
signature); the adapter decodes its tensors or examples against that target, and the call runs
on exactly that version through the data plane's ``run``.
"""

from __future__ import annotations

from collections.abc import Coroutine, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from inferd.config.spec import (
    CLASSIFY_METHOD,
    DEFAULT_SIGNATURE,
    PREDICT_METHOD,
    REGRESS_METHOD,
    ModelSpec,
    SignatureSpec,
    TensorSpec,
)
from inferd.core.datatypes import DataType
from inferd.core.errors import InvalidInput
from inferd.core.types import InferRequest, InferResponse, RequestedOutput, Tensors
from inferd.plane import validate
from inferd.plane.model import ModelVersion
from inferd.plane.tfexample import Features, check_examples, serialize_all

if TYPE_CHECKING:
    from inferd.config.model_config_pb2 import ModelConfig
    from inferd.plane.registry import Registry

SIGNATURE_PARAMETER = "signature_name"  # config parameter: the model's own signature
_FLOAT_TYPES = ("FP16", "FP32", "FP64", "BF16")
# Output keys of TF Serving's classification and regression signatures.
CLASSES_OUTPUT = "classes"
SCORES_OUTPUT = "scores"
REGRESS_OUTPUT = "outputs"


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """A signature tensor as TF Serving describes it: -1 leads when the signature batches."""

    name: str
    datatype: DataType
    dims: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class SignatureInfo:
    name: str
    method: str
    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]


@dataclass(frozen=True, slots=True)
class ModelSignatures:
    """GetModelMetadata's ``signature_def``: every signature of one version."""

    name: str
    version: int
    signatures: tuple[SignatureInfo, ...]


@dataclass(frozen=True, slots=True)
class Target:
    """Where one request runs, routed once: a version and one of its signatures. Adapters
    decode against ``spec`` (the signature's tensors) and answer with ``signature``."""

    name: str
    version: int
    signature: str
    method: str
    spec: ModelSpec
    _model: ModelVersion = field(repr=False)
    _run_as: str = field(repr=False)  # "": the model's own inputs and outputs


@dataclass(frozen=True, slots=True)
class Classified:
    results: list[list[tuple[str, float]]]  # per example: (label, score) per class
    response: InferResponse


@dataclass(frozen=True, slots=True)
class Regressed:
    results: list[float]  # one value per example
    response: InferResponse


def _own_signature(model: ModelVersion) -> str:
    config = model.config
    kept = _OWN.get(id(config))
    if kept is not None and kept[0] is config:
        return kept[1]
    params = config.parameters
    configured = params[SIGNATURE_PARAMETER].string_value if SIGNATURE_PARAMETER in params else ""
    if len(_OWN) >= _KEPT_MAX:
        _OWN.clear()
    _OWN[id(config)] = (config, configured or DEFAULT_SIGNATURE)
    return configured or DEFAULT_SIGNATURE


# id(a version's config) -> (the config, its own signature's name): the parameter is read once,
# not looked up in the protobuf map per request. An entry counts only for the very config it
# was made for (it holds the config, never the version and its runtime), and the table is
# cleared when full.
_OWN: dict[int, tuple[ModelConfig, str]] = {}


class Start(Protocol):
    """How a request reaches the version routing chose (``DataPlane.start``: answered at once
    when it runs on the event loop, else a coroutine to await: retry, shadows)."""

    def __call__(
        self, model: ModelVersion, request: InferRequest, label: str = "", signature: str = ""
    ) -> InferResponse | Coroutine[Any, Any, InferResponse]: ...


class TfServing:
    def __init__(self, registry: Registry, start: Start) -> None:
        self.registry = registry
        self.start = start

    def _version(self, name: str, version: str, label: str) -> ModelVersion:
        if label:
            return self.registry.route(name, version, label)
        return self.registry.get(name, version)

    def target(
        self,
        name: str,
        version: str = "",
        label: str = "",
        signature: str = "",
        verb: str = "predict",
    ) -> Target:
        """Route a request (version, label, else the traffic split) and pick its signature:
        the one named, else for classify and regress the model's one signature of that kind
        when it has one, else the model's own (``serving_default``)."""
        model = self.registry.route(name, version, label)
        own = _own_signature(model)
        signatures = model.signatures
        # "serving_default" names the model's own signature unless the model has one so named.
        is_own = signature == own or (
            signature == DEFAULT_SIGNATURE and DEFAULT_SIGNATURE not in signatures
        )
        if signature and not is_own:
            found = signatures.get(signature)
            if found is None:
                served = sorted({own, *signatures})
                raise InvalidInput(
                    f"unknown signature_name '{signature}'; model '{model.name}' serves "
                    f"{', '.join(repr(s) for s in served)}"
                )
            return _signature_target(model, found)
        if not signature and verb != "predict":
            method = CLASSIFY_METHOD if verb == "classify" else REGRESS_METHOD
            kind = [s for s in signatures.values() if s.method == method]
            if len(kind) == 1 and kind[0].name != own:
                return _signature_target(model, kind[0])
        mine = signatures.get(own)
        method = mine.method if mine is not None else PREDICT_METHOD
        answered = signature or DEFAULT_SIGNATURE
        return Target(model.name, model.version, answered, method, model.spec, model, "")

    def metadata(self, name: str, version: str = "", label: str = "") -> ModelSignatures:
        """Every signature of a version: the model's own first (its config's tensors, under
        its signature's name, ``serving_default`` for a model without signatures)."""
        model = self._version(name, version, label)
        own = _own_signature(model)
        found = model.signatures.get(own)
        method = found.method if found is not None else PREDICT_METHOD
        key = own if found is not None else DEFAULT_SIGNATURE
        infos = [_signature_info(key, method, model.spec)]
        infos += [
            _signature_info(s.name, s.method, s.spec)
            for k, s in sorted(model.signatures.items())
            if k != key
        ]
        return ModelSignatures(model.name, model.version, tuple(infos))

    async def predict(
        self, target: Target, inputs: Tensors, output_filter: Sequence[str] = ()
    ) -> InferResponse:
        """Run a Predict; outputs come back in the model's own shapes, as TF Serving gives them.

        TF Serving feeds tensors without checking them against the signature's shapes, so a
        row of scalars reaches an input of shape [-1, 1] (its README's ``half_plus_two``):
        an input whose shape is the signature's without its size-1 dimensions is fed with
        them, and the outputs are answered without them.
        """
        spec = target.spec
        inputs, lenient = _lenient_inputs(spec, inputs)
        outputs = [RequestedOutput(n) for n in output_filter] or None
        request = InferRequest(target.name, inputs, str(target.version), outputs=outputs)
        started = self.start(target._model, request, signature=target._run_as)
        response = started if isinstance(started, InferResponse) else await started
        answer = validate.native_outputs(spec, response.outputs)
        if lenient:
            answer = _squeezed(spec, answer)
        response.outputs = answer
        return response

    async def _examples(
        self, target: Target, examples: Sequence[Features], context: Features
    ) -> InferResponse:
        check_examples(examples)
        spec = target.spec
        if target.method in (CLASSIFY_METHOD, REGRESS_METHOD) and _parses_examples(spec):
            inputs = {spec.inputs[0].name: serialize_all(examples, context)}
        else:
            inputs = _columns(spec, examples, context)
        request = InferRequest(target.name, inputs, str(target.version))
        started = self.start(target._model, request, signature=target._run_as)
        response = started if isinstance(started, InferResponse) else await started
        response.outputs = validate.native_outputs(spec, response.outputs)
        return response

    async def classify(
        self, target: Target, examples: Sequence[Features], context: Features
    ) -> Classified:
        response = await self._examples(target, examples, context)
        outputs, rows = response.outputs, len(examples)
        if target.method == CLASSIFY_METHOD:
            scores = outputs.get(SCORES_OUTPUT)
            classes = outputs.get(CLASSES_OUTPUT)
            if scores is None and classes is None:
                raise InvalidInput(
                    f"signature '{target.signature}' has neither a '{SCORES_OUTPUT}' nor a "
                    f"'{CLASSES_OUTPUT}' output"
                )
            for what, array in ((SCORES_OUTPUT, scores), (CLASSES_OUTPUT, classes)):
                if array is not None and (array.ndim != 2 or array.shape[0] != rows):
                    raise InvalidInput(
                        f"Expected Tensor shape: [batch_size num_classes] but got "
                        f"{list(array.shape)} for '{what}' of {rows} example(s)"
                    )
            width = (scores if scores is not None else classes).shape[1]  # type: ignore[union-attr]
            score_rows = (
                scores.astype(np.float64).tolist() if scores is not None else [[0.0] * width] * rows
            )
            labels = _labels(classes) if classes is not None else [[""] * width] * rows
        else:
            found = _score_output(target, outputs, "classify")
            score_rows = found.astype(np.float64).tolist()
            classes = outputs.get(CLASSES_OUTPUT)
            if classes is not None and classes.shape == found.shape and classes.dtype == object:
                labels = _labels(classes)
            else:
                labels = [[str(i) for i in range(found.shape[1])]] * rows
        results = [
            list(zip(label_row, score_row, strict=True))
            for label_row, score_row in zip(labels, score_rows, strict=True)
        ]
        return Classified(results, response)

    async def regress(
        self, target: Target, examples: Sequence[Features], context: Features
    ) -> Regressed:
        response = await self._examples(target, examples, context)
        rows = len(examples)
        if target.method == REGRESS_METHOD:
            found = response.outputs.get(REGRESS_OUTPUT)
            if found is None:
                raise InvalidInput(
                    f"signature '{target.signature}' has no '{REGRESS_OUTPUT}' output"
                )
            if found.shape not in ((rows,), (rows, 1)):
                raise InvalidInput(
                    "Expected output Tensor shape to be either [batch_size] or "
                    f"[batch_size, 1] but got {list(found.shape)}"
                )
        else:
            found = _score_output(target, response.outputs, "regress")
        values: list[float] = found.astype(np.float64).reshape(-1).tolist()
        return Regressed(values, response)


# --------------------------------------------------------------------------- helpers


def _signature_target(model: ModelVersion, signature: SignatureSpec) -> Target:
    return Target(
        model.name,
        model.version,
        signature.name,
        signature.method,
        signature.spec,
        model,
        signature.name,
    )


def _signature_info(name: str, method: str, spec: ModelSpec) -> SignatureInfo:
    def info(tensor: TensorSpec) -> TensorInfo:
        lead = (-1,) if spec.max_batch_size > 0 else ()
        return TensorInfo(tensor.name, tensor.datatype, lead + tuple(tensor.model_dims))

    return SignatureInfo(
        name, method, tuple(info(t) for t in spec.inputs), tuple(info(t) for t in spec.outputs)
    )


def _full_shape(spec: ModelSpec, tensor: TensorSpec) -> list[int]:
    return tensor.shape(spec.max_batch_size)


def _fits(shape: Sequence[int], dims: Sequence[int]) -> bool:
    return len(shape) == len(dims) and all(d in (-1, s) for s, d in zip(shape, dims, strict=True))


# What the two functions below work out for a spec, kept: (id(spec), input name, shape) ->
# (spec, the shape to feed: None for as it came); id(spec) -> (spec, each output's size-1 axes
# and rank). An entry counts only for the very spec it was made for; both are cleared when full.
_FED: dict[tuple[int, str, tuple[int, ...]], tuple[ModelSpec, tuple[int, ...] | None]] = {}
_SQUEEZE: dict[int, tuple[ModelSpec, dict[str, tuple[tuple[int, ...], int]]]] = {}
_KEPT_MAX = 4096


def _fed_shape(spec: ModelSpec, name: str, shape: tuple[int, ...]) -> tuple[int, ...] | None:
    """The shape input ``name`` of ``shape`` is fed with: its signature's, with the size-1
    dimensions a request left out put back; None: as it came."""
    key = (id(spec), name, shape)
    kept = _FED.get(key)
    if kept is not None and kept[0] is spec:
        return kept[1]
    tensor = spec.input_by_name.get(name)
    full = _full_shape(spec, tensor) if tensor is not None else []
    fed: tuple[int, ...] | None = None
    if not (tensor is None or _fits(shape, full) or 1 not in full) and _fits(
        shape, [d for d in full if d != 1]
    ):
        given = iter(shape)
        fed = tuple(1 if d == 1 else next(given) for d in full)
    if len(_FED) >= _KEPT_MAX:
        _FED.clear()
    _FED[key] = (spec, fed)
    return fed


def _lenient_inputs(spec: ModelSpec, inputs: Tensors) -> tuple[Tensors, bool]:
    """Inputs with the size-1 dimensions the signature has and a request left out put back."""
    fed: Tensors = {}
    lenient = False
    for name, array in inputs.items():
        shape = _fed_shape(spec, name, array.shape)
        if shape is None:
            fed[name] = array
        else:
            fed[name] = array.reshape(shape)
            lenient = True
    return fed, lenient


def _squeezed(spec: ModelSpec, outputs: Tensors) -> Tensors:
    kept = _SQUEEZE.get(id(spec))
    if kept is None or kept[0] is not spec:
        found = {}
        for tensor in spec.outputs:
            full = _full_shape(spec, tensor)
            found[tensor.name] = (tuple(i for i, d in enumerate(full) if d == 1), len(full))
        if len(_SQUEEZE) >= _KEPT_MAX:
            _SQUEEZE.clear()
        kept = _SQUEEZE[id(spec)] = (spec, found)
    every = kept[1]
    answer: Tensors = {}
    for name, array in outputs.items():
        axes, rank = every.get(name, ((), 0))
        if axes and array.ndim == rank:
            array = array.squeeze(axis=axes)
        answer[name] = array
    return answer


def _parses_examples(spec: ModelSpec) -> bool:
    """A signature fed serialized tf.Examples: one string input (TF Serving's rule)."""
    return len(spec.inputs) == 1 and spec.inputs[0].datatype.is_bytes


def _columns(spec: ModelSpec, examples: Sequence[Features], context: Features) -> Tensors:
    """Feature ``k`` of every example is one row of input ``k`` (a model that does not parse
    tf.Examples itself)."""
    for index, example in enumerate(examples):
        for key in example:
            if key not in spec.input_by_name:
                raise InvalidInput(f"example {index} has unknown feature '{key}'")
    columns: Tensors = {}
    for tensor in spec.inputs:
        values: list[np.ndarray] = []
        for index, example in enumerate(examples):
            feature = example.get(tensor.name)
            if feature is None:
                feature = context.get(tensor.name)
            if feature is None:
                if tensor.optional:
                    break
                raise InvalidInput(f"example {index} lacks feature '{tensor.name}'")
            values.append(feature)
        else:
            columns[tensor.name] = _column(tensor, values)
    return columns


def _column(tensor: TensorSpec, rows: list[np.ndarray]) -> np.ndarray:
    datatype = tensor.datatype
    if any((r.dtype == object) != datatype.is_bytes for r in rows):
        kind = "bytes" if datatype.is_bytes else "numbers"
        raise InvalidInput(f"feature '{tensor.name}': input '{tensor.name}' takes {kind}")
    flat = np.concatenate(rows) if rows else np.empty(0, dtype=datatype.numpy)
    if not datatype.is_bytes:
        flat = flat.astype(datatype.numpy)
    dims = tuple(tensor.model_dims)
    try:
        column: np.ndarray = flat.reshape((len(rows), *dims))
    except ValueError:
        raise InvalidInput(
            f"feature '{tensor.name}': {len(rows)} examples do not fill shape "
            f"[{len(rows)}, {', '.join(str(d) for d in dims)}]"
        ) from None
    return column


def _score_output(target: Target, outputs: Tensors, verb: str) -> np.ndarray:
    """A model's output that reads as scores: [batch, classes] floats to classify, one float
    per example to regress (inferd's reading of a model without such a signature)."""
    for tensor in target.spec.outputs:
        array = outputs.get(tensor.name)
        if array is None or tensor.datatype.name not in _FLOAT_TYPES:
            continue
        if (verb == "classify" and array.ndim == 2 and array.shape[1] > 1) or (
            verb == "regress" and array.ndim in (1, 2) and array.size == len(array)
        ):
            return array
    wanted = "[batch, classes] float scores" if verb == "classify" else "one float per example"
    raise InvalidInput(f"model '{target.name}' has no output of {wanted}; :{verb} does not fit it")


def _labels(classes: np.ndarray) -> list[list[str]]:
    return [
        [c.decode("utf-8", "replace") if isinstance(c, bytes) else str(c) for c in row]
        for row in classes.tolist()
    ]
