"""Checks a decoded request against a model's spec, once, before it is queued.

Protocol codecs already made every tensor self-consistent (shape x datatype x bytes); this
module checks it against the model: names, datatypes, shapes, batch size, outputs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from inferd.config.spec import ModelSpec, TensorSpec
from inferd.core import datatypes
from inferd.core.errors import InvalidInput
from inferd.core.types import Tensors


def _matches(shape: Sequence[int], dims: Sequence[int]) -> bool:
    return len(shape) == len(dims) and all(
        d == -1 or d == s for s, d in zip(shape, dims, strict=True)
    )


def _fmt(dims: Sequence[int]) -> str:
    return "[" + ",".join(str(d) for d in dims) + "]"


ACCEPTED_LIMIT = 64  # input signatures remembered per model spec


def check_inputs(spec: ModelSpec, inputs: Tensors) -> tuple[Tensors, int]:
    """Return the inputs shaped as the model takes them, and the batch size (0 if none).

    Names, datatypes and shapes decide the answer, so a signature that passed is remembered
    (up to ``ACCEPTED_LIMIT`` per spec) and the next request with it is only reshaped."""
    if len(inputs) == 1:  # the usual request: no comprehension to run
        for name, array in inputs.items():
            key: tuple[Any, ...] = ((name, array.dtype, array.shape),)
    else:
        key = tuple([(name, array.dtype, array.shape) for name, array in inputs.items()])
    known = spec.accepted.get(key)
    if known is not None:
        batch, shapes = known
        if shapes is None:  # every input as it came
            return inputs, batch
        if len(shapes) == 1:  # one input, reshaped (no comprehension to run)
            name, shape = shapes[0]
            return {name: inputs[name] if shape is None else inputs[name].reshape(shape)}, batch
        return {
            name: inputs[name] if shape is None else inputs[name].reshape(shape)
            for name, shape in shapes
        }, batch
    out, batch = _check_inputs(spec, inputs)
    if len(spec.accepted) < ACCEPTED_LIMIT:
        reshapes = tuple(
            (name, None if array is inputs[name] else array.shape) for name, array in out.items()
        )
        as_came = list(out) == list(inputs) and all(shape is None for _, shape in reshapes)
        spec.accepted[key] = (batch, None if as_came else reshapes)
    return out, batch


def _check_inputs(spec: ModelSpec, inputs: Tensors) -> tuple[Tensors, int]:
    for name in inputs:
        if name not in spec.input_by_name:
            raise InvalidInput(
                f"unexpected input '{name}' for model '{spec.name}'; it takes "
                f"{', '.join(repr(s.name) for s in spec.inputs)}"
            )
    batched = spec.max_batch_size > 0
    batch = 0
    out: Tensors = {}
    for tspec in spec.inputs:
        array = inputs.get(tspec.name)
        if array is None:
            if tspec.optional:
                continue
            raise InvalidInput(f"missing input '{tspec.name}' for model '{spec.name}'")
        _check_dtype(tspec, array)
        shape = array.shape
        if batched:
            if len(shape) == 0:
                raise InvalidInput(
                    f"input '{tspec.name}': expected shape {_fmt(tspec.shape(1))}, got a scalar"
                )
            rows = shape[0]
            if batch == 0:
                batch = rows
            elif rows != batch:
                raise InvalidInput(
                    f"input '{tspec.name}' has batch size {rows} but another input has {batch}"
                )
            if rows < 1 or rows > spec.max_batch_size:
                raise InvalidInput(
                    f"input '{tspec.name}': batch size {rows} is outside 1..{spec.max_batch_size} "
                    f"(max_batch_size of model '{spec.name}')"
                )
            out[tspec.name] = _to_model_shape(tspec, array, shape[1:], (rows,))
        else:
            out[tspec.name] = _to_model_shape(tspec, array, shape, ())
    return out, batch


def _check_dtype(tspec: TensorSpec, array: np.ndarray) -> None:
    if array.dtype == tspec.datatype.numpy:
        return
    got = datatypes.of_array(array)
    if got is not tspec.datatype:
        raise InvalidInput(
            f"input '{tspec.name}': datatype {got.name} does not match the model's "
            f"{tspec.datatype.name}"
        )


def _to_model_shape(
    tspec: TensorSpec, array: np.ndarray, item_shape: tuple[int, ...], lead: tuple[int, ...]
) -> np.ndarray:
    if _matches(item_shape, tspec.dims):
        if not tspec.reshaped:
            return array
        return array.reshape(lead + tuple(tspec.model_dims))
    if tspec.reshaped and _matches(item_shape, tspec.model_dims):
        return array  # already shaped as the model takes it (TF Serving clients send this)
    raise InvalidInput(
        f"input '{tspec.name}': shape {_fmt(lead + item_shape)} does not match the model's "
        f"{_fmt(tspec.shape(1 if lead else 0))}"
    )


def check_outputs(spec: ModelSpec, requested: Sequence[str] | None) -> tuple[str, ...]:
    """The output names to compute: the requested ones, or all of them."""
    if requested is None:
        return spec.output_names
    seen: set[str] = set()
    for name in requested:
        if name not in spec.output_by_name:
            raise InvalidInput(
                f"unknown output '{name}' for model '{spec.name}'; it has "
                f"{', '.join(repr(o.name) for o in spec.outputs)}"
            )
        if name in seen:
            raise InvalidInput(f"output '{name}' is requested twice")
        seen.add(name)
    return tuple(requested)


def shape_outputs(spec: ModelSpec, outputs: Tensors, batch: int) -> Tensors:
    """Reshape model outputs to the config's dims (their batch size was checked where they
    were made: ``backends.work.check_rows``)."""
    for name, dims in spec.output_reshapes:
        array = outputs.get(name)
        if array is not None:
            outputs[name] = array.reshape((batch, *dims) if batch else dims)
    return outputs


def native_outputs(spec: ModelSpec, outputs: Tensors) -> Tensors:
    """Outputs in the model's own shape, a config reshape undone (the inverse of
    ``shape_outputs``), as TF Serving's APIs return them."""
    native: Tensors = {}
    for name, array in outputs.items():
        tensor = spec.output_by_name[name]
        if tensor.reshaped:
            lead = array.shape[:1] if spec.max_batch_size > 0 else ()
            array = array.reshape(lead + tuple(tensor.model_dims))
        native[name] = array
    return native
