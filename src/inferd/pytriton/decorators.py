"""PyTriton's decorators for inference functions (``pytriton.decorators``): ``@batch``,
``@sample``, ``@group_by_keys``, ``@group_by_values``, ``@pad_batch``, ``@first_value``,
``@fill_optionals``, ``@triton_context``.

An undecorated inference function takes a list of requests (mappings of input name to array)
and returns one dict of outputs per request. The decorators change that shape; those that need
the model's configuration read the one of the model whose instance is calling
(``context.current``). A decorator works on functions and on methods alike.
"""

from __future__ import annotations

import functools
import itertools
import operator
from bisect import bisect_left
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from inferd.pytriton.context import TritonContext, current, current_context
from inferd.pytriton.exceptions import (
    PyTritonBadParameterError,
    PyTritonRuntimeError,
    PyTritonValidationError,
)
from inferd.pytriton.model_config import TritonModelConfig

TRITON_CONTEXT_FIELD_NAME = "triton_context"
_SPECIAL_KEYS = ("__triton_context__", TRITON_CONTEXT_FIELD_NAME)

Logic = Callable[[Callable[..., Any], tuple[Any, ...], dict[str, Any]], Any]


class _Decorated:
    """``wrapped`` under ``logic(wrapped, args, kwargs)``; bound to an instance as a method."""

    def __init__(self, wrapped: Callable[..., Any], logic: Logic, kind: str) -> None:
        functools.update_wrapper(self, wrapped)
        self.__wrapped__ = wrapped
        self._logic = logic
        self._kind = kind

    def __get__(self, instance: object, owner: type | None = None) -> Any:
        if instance is None:
            return self
        getter = getattr(self.__wrapped__, "__get__", None)
        bound = getter(instance, owner) if getter is not None else self.__wrapped__
        return _Decorated(bound, self._logic, self._kind)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._logic(self.__wrapped__, args, kwargs)

    def kinds(self) -> Iterator[str]:
        """This decorator's kind and those of the decorators under it."""
        inner: Any = self
        while isinstance(inner, _Decorated):
            yield inner._kind
            inner = inner.__wrapped__


def _decorator(kind: str) -> Callable[[Logic], Callable[[Callable[..., Any]], Any]]:
    def make(logic: Logic) -> Callable[[Callable[..., Any]], Any]:
        def decorate(wrapped: Callable[..., Any]) -> Any:
            return _Decorated(wrapped, logic, kind)

        functools.update_wrapper(decorate, logic)
        return decorate

    return make


def get_model_config() -> TritonModelConfig:
    """The configuration of the model whose instance runs this call."""
    return current()


def get_inference_request_batch_size(request: Mapping[str, np.ndarray]) -> int:
    first = next(iter(request.values()))
    return int(first.shape[0])


def convert_output(
    outputs: Any, model_config: TritonModelConfig | None = None
) -> dict[str, np.ndarray]:
    """Outputs as a dict: a list or tuple is matched to the config's outputs in order."""
    if isinstance(outputs, dict):
        return outputs
    if isinstance(outputs, (list, tuple)):
        config = model_config or current()
        specs = list(config.outputs or ())
        if len(outputs) != len(specs):
            raise PyTritonValidationError("Outputs length different than config outputs length")
        return {spec.name: value for spec, value in zip(specs, outputs, strict=True)}
    raise PyTritonValidationError(f"Unsupported output type {type(outputs)}.")


def _split(
    result: Any, requests: Sequence[Mapping[str, np.ndarray]]
) -> list[dict[str, np.ndarray]]:
    outputs = convert_output(result)
    total = sum(get_inference_request_batch_size(r) for r in requests)
    wrong = {n: a.shape for n, a in outputs.items() if a.shape[0] != total}
    if wrong:
        shapes = ", ".join(f"{n}: {s}" for n, s in wrong.items())
        raise ValueError(
            f"Received output tensors with different batch sizes: {shapes}. "
            f"Expected batch size: {total}. "
        )
    parts = []
    start = 0
    for request in requests:
        rows = get_inference_request_batch_size(request)
        parts.append({n: a[start : start + rows, ...] for n, a in outputs.items()})
        start += rows
    return parts


@_decorator("batch")
def batch(wrapped: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Requests in, as keyword arguments: each input the requests' rows concatenated; the
    outputs (a dict, or a list in the config's order) split back per request."""
    requests = args[0]
    names = requests[0].keys()
    for request in requests[1:]:
        if request.keys() != names:
            raise PyTritonValidationError("Cannot batch requests with different set of inputs keys")
    inputs = {n: np.concatenate([r[n] for r in requests]) for n in names}
    result = wrapped(*args[1:], **{**kwargs, **inputs})
    if _is_generator(result):
        return (_split(part, requests) for part in result)
    return _split(result, requests)


@_decorator("sample")
def sample(wrapped: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The first request's inputs as keyword arguments (non-batching models)."""
    kwargs.update(args[0][0])
    result = wrapped(*args[1:], **kwargs)
    if _is_generator(result):
        return ([convert_output(part)] for part in result)
    return [convert_output(result)]


@_decorator("group_by_keys")
def group_by_keys(
    wrapped: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """Calls the function once per group of requests with the same set of inputs."""
    requests = args[0]
    keyed = sorted(
        ((i, tuple(sorted(r.keys())), r) for i, r in enumerate(requests)),
        key=operator.itemgetter(1),
    )
    answers: list[tuple[int, Any]] = []
    for _, group in itertools.groupby(keyed, key=operator.itemgetter(1)):
        indices, _keys, members = zip(*group, strict=True)
        answers.extend(zip(indices, wrapped(list(members), *args[1:], **kwargs), strict=True))
    return [answer for _, answer in sorted(answers, key=operator.itemgetter(0))]


def _value_key(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        if value.dtype == np.object_ or value.dtype.type == np.bytes_:
            return b"\0".join(bytes(v) for v in value.reshape(-1)) + repr(value.shape).encode()
        return value.tobytes() + repr(value.shape).encode()
    return value


def group_by_values(
    *keys: str,
    pad_fn: Callable[[Sequence[dict[str, np.ndarray]]], Sequence[dict[str, np.ndarray]]]
    | None = None,
) -> Callable[[Callable[..., Any]], Any]:
    """Under ``@batch``: calls the function once per group of rows whose ``keys`` inputs hold
    equal values, and puts the outputs back in row order (``pad_fn`` first pads the groups'
    results to one shape)."""

    @_decorator("group_by_values")
    def wrapper(wrapped: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if isinstance(wrapped, _Decorated) and "batch" in wrapped.kinds():
            raise PyTritonRuntimeError(
                "The @group_by_values decorator must be used after the @batch decorator."
            )
        inputs = {k: v for k, v in kwargs.items() if k not in _SPECIAL_KEYS}
        other = {k: v for k, v in kwargs.items() if k in _SPECIAL_KEYS}
        rows = get_inference_request_batch_size(inputs)
        order = sorted(
            ((i, tuple(_value_key(inputs[k][i]) for k in keys)) for i in range(rows)),
            key=operator.itemgetter(1),
        )
        groups: list[tuple[tuple[int, ...], Any]] = []
        for _, group in itertools.groupby(order, key=operator.itemgetter(1)):
            indices = tuple(i for i, _ in group)
            part = {n: v[list(indices), ...] for n, v in inputs.items()}
            groups.append((indices, wrapped(*args, **part, **other)))
        results = [convert_output(r) for _, r in groups]
        if pad_fn is not None:
            results = list(pad_fn(results))
        first = results[0]
        merged = {n: np.zeros((rows, *a.shape[1:]), dtype=a.dtype) for n, a in first.items()}
        for (indices, _), result in zip(groups, results, strict=True):
            for name, data in result.items():
                merged[name][list(indices), ...] = data
        return merged

    return wrapper


class ConstantPadder:
    """Pads every group's arrays to the largest shape with ``pad_value`` (b"" for bytes)."""

    def __init__(self, pad_value: Any = 0) -> None:
        self.pad_value = pad_value

    def __call__(self, batches: Sequence[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
        names = list(dict.fromkeys(n for b in batches for n in b))
        padded: list[dict[str, np.ndarray]] = [dict(b) for b in batches]
        for name in names:
            arrays = [b[name] for b in batches if name in b]
            shape = tuple(np.max([a.shape[1:] for a in arrays], axis=0))
            kinds = {a.dtype.kind for a in arrays}
            if len(kinds) > 1:
                raise PyTritonRuntimeError(
                    "All input arrays for given input name must have the same dtype."
                )
            dtype = arrays[0].dtype
            if dtype.kind in "SU":
                dtype = np.dtype(f"{dtype.str[:2]}{max(int(a.dtype.str[2:]) for a in arrays)}")
            elif any(a.dtype != dtype for a in arrays):
                raise PyTritonRuntimeError(
                    "All input arrays for given input name must have the same dtype."
                )
            fill = b"" if dtype.kind in "SUO" else self.pad_value
            for entry in padded:
                if name in entry:
                    array = entry[name]
                    widths = [(0, 0)] + [
                        (0, b - a) for a, b in zip(array.shape[1:], shape, strict=True)
                    ]
                    entry[name] = np.pad(
                        array, widths, mode="constant", constant_values=fill
                    ).astype(dtype)
        return padded


def fill_optionals(**defaults: np.ndarray) -> Callable[[Callable[..., Any]], Any]:
    """Fills each request's missing inputs with these defaults (arrays without the batch
    dimension, repeated per row when the model batches)."""

    def check(config: TritonModelConfig) -> None:
        specs = {spec.name: spec for spec in config.inputs or ()}
        unknown = sorted(set(defaults) - set(specs))
        if unknown:
            raise PyTritonBadParameterError(f"Could not found {', '.join(unknown)} inputs")
        for name, value in defaults.items():
            if not isinstance(value, np.ndarray):
                raise PyTritonBadParameterError(
                    f"Could not use {name}={value} defaults as they are not NumPy arrays"
                )
            spec = specs[name]
            if value.dtype != np.dtype(spec.dtype):
                raise PyTritonBadParameterError(
                    f"Could not use {name}: dtype={value.dtype} expected_dtype={spec.dtype} "
                    "defaults as they have different than input signature dtypes"
                )
            expected = tuple(spec.shape)
            if len(value.shape) != len(expected) or any(
                e != -1 and h != e for h, e in zip(value.shape, expected, strict=True)
            ):
                raise PyTritonBadParameterError(
                    f"Could not use {name}: shape={value.shape} expected_shape={expected} "
                    "defaults as they have different than input signature shapes"
                )

    @_decorator("fill_optionals")
    def wrapper(wrapped: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        config = current()
        check(config)
        for request in args[0]:
            rows = get_inference_request_batch_size(request) if config.batching else None
            for name, value in defaults.items():
                if name in request:
                    continue
                if rows is not None:
                    value = np.tile(value, (rows,) + (1,) * value.ndim)
                request[name] = value
        return wrapped(*args, **kwargs)

    return wrapper


@_decorator("triton_context")
def triton_context(
    wrapped: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """Adds ``triton_context`` (the model configs of the running model) to the arguments."""
    kwargs[TRITON_CONTEXT_FIELD_NAME] = current_context()
    return wrapped(*args, **kwargs)


@_decorator("pad_batch")
def pad_batch(wrapped: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Under ``@batch``: repeats the last row until the batch is the nearest preferred batch
    size (or max_batch_size) at or above its size."""
    inputs = {k: v for k, v in kwargs.items() if k not in _SPECIAL_KEYS}
    rows = get_inference_request_batch_size(inputs)
    config = current()
    sizes = sorted(config.batcher.preferred_batch_size or []) if config.batcher else []
    sizes.append(config.max_batch_size)
    size = sizes[min(bisect_left(sizes, rows), len(sizes) - 1)]
    for name, array in inputs.items():
        repeats = np.ones(array.shape[0], np.int64)
        repeats[-1] = size - array.shape[0] + 1
        kwargs[name] = np.repeat(array, repeats, axis=0)
    return wrapped(*args, **kwargs)


def first_value(
    *keys: str, squeeze_single_values: bool = True, strict: bool = True
) -> Callable[[Callable[..., Any]], Any]:
    """Replaces each of these inputs by its first row (a scalar when that row holds one value);
    ``strict``: every row must hold the same value."""
    not_allowed = [k for k in keys if k in _SPECIAL_KEYS]
    if not_allowed:
        raise PyTritonBadParameterError(
            f"The keys {', '.join(not_allowed)} are not allowed as keys for @first_value wrapper. "
            f"The set of not allowed keys are {', '.join(_SPECIAL_KEYS)}"
        )

    def replace(request: Any) -> Any:
        for name in keys:
            if name not in request:
                continue
            values = request[name]
            if strict:
                unique = np.unique(values, axis=None if values.dtype == object else 0)
                if len(unique) > 1:
                    raise PyTritonRuntimeError(
                        f"The values on the {name!r} input are not equal. To proceed, either "
                        "disable strict mode in @first_value wrapper or ensure that the values "
                        f"always are consistent. The current values of {name!r} are {values!r}."
                    )
            first = values[0]
            if (
                squeeze_single_values
                and not np.isscalar(first)
                and all(d == 1 for d in first.shape)
            ):
                first = np.squeeze(first)[()]
            request[name] = first
        return request

    @_decorator("first_value")
    def wrapper(wrapped: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if not current().batching:
            raise PyTritonRuntimeError(
                "The @first_value decorator can only be used with models that support batching."
            )
        if set(kwargs) - set(_SPECIAL_KEYS):
            return wrapped(*args, **replace(kwargs))
        requests, *rest = args
        return wrapped([replace(r) for r in requests], *rest, **kwargs)

    return wrapper


def _is_generator(value: Any) -> bool:
    return isinstance(value, Iterator) and not isinstance(value, (dict, list, tuple))


__all__ = [
    "ConstantPadder",
    "TritonContext",
    "batch",
    "convert_output",
    "fill_optionals",
    "first_value",
    "get_inference_request_batch_size",
    "get_model_config",
    "group_by_keys",
    "group_by_values",
    "pad_batch",
    "sample",
    "triton_context",
]
