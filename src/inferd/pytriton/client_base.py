"""What PyTriton's clients share (``inferd.pytriton.client``): their errors, URLs, the model's
configuration read from the server, and inputs and outputs to and from ``tritonclient``'s
types."""

from __future__ import annotations

import itertools
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import tritonclient.grpc
import tritonclient.http
import tritonclient.utils

from inferd.pytriton.exceptions import MessageError
from inferd.pytriton.model_config import DynamicBatcher, TensorSpec, TritonModelConfig

DEFAULT_INIT_TIMEOUT_S = 300.0
DEFAULT_INFERENCE_TIMEOUT_S = 60.0
POLL_S = 0.1


class PyTritonClientError(MessageError):
    """The base of the clients' errors."""


class PyTritonClientValueError(PyTritonClientError):
    pass


class PyTritonClientInvalidUrlError(PyTritonClientValueError):
    pass


class PyTritonClientTimeoutError(PyTritonClientError):
    pass


class PyTritonClientModelUnavailableError(PyTritonClientError):
    pass


class PyTritonClientClosedError(PyTritonClientError):
    pass


class PyTritonClientModelDoesntSupportBatchingError(PyTritonClientError):
    pass


class PyTritonClientInferenceServerError(PyTritonClientError):
    pass


@dataclass(frozen=True)
class TritonUrl:
    scheme: str
    hostname: str
    port: int

    @property
    def without_scheme(self) -> str:
        return f"{self.hostname}:{self.port}"

    @classmethod
    def from_url(cls, url: str) -> TritonUrl:
        if "://" not in url:
            url = f"http://{url}"
        parsed = urllib.parse.urlparse(url)
        scheme = parsed.scheme.lower()
        if scheme not in ("http", "grpc"):
            raise PyTritonClientInvalidUrlError(
                f"Invalid scheme '{scheme}' in {url!r}: use http:// or grpc://"
            )
        try:
            port = parsed.port
        except ValueError as exc:
            raise PyTritonClientInvalidUrlError(f"Invalid port in {url!r}: {exc}") from None
        if not parsed.hostname:
            raise PyTritonClientInvalidUrlError(f"No host in {url!r}")
        return cls(scheme, parsed.hostname, port or (8000 if scheme == "http" else 8001))


_NUMPY = {
    "TYPE_STRING": np.bytes_,
    "TYPE_BOOL": np.bool_,
}


def model_config_of(doc: Mapping[str, Any]) -> TritonModelConfig:
    """A TritonModelConfig from the server's model config (Triton's JSON)."""

    def spec(t: Mapping[str, Any]) -> TensorSpec:
        dtype_name = str(t.get("data_type", "TYPE_FP32"))
        dtype = _NUMPY.get(dtype_name) or tritonclient.utils.triton_to_np_dtype(
            dtype_name.removeprefix("TYPE_")
        )
        return TensorSpec(
            str(t["name"]),
            tuple(int(d) for d in t.get("dims", ())),
            dtype,
            bool(t.get("optional", False)),
        )

    batch = int(doc.get("max_batch_size", 0))
    batcher = doc.get("dynamic_batching")
    return TritonModelConfig(
        model_name=str(doc.get("name", "")),
        max_batch_size=batch,
        batching=batch > 0,
        batcher=DynamicBatcher(
            max_queue_delay_microseconds=int(batcher.get("max_queue_delay_microseconds", 0)),
            preferred_batch_size=[int(b) for b in batcher.get("preferred_batch_size", [])],
        )
        if isinstance(batcher, Mapping)
        else None,
        decoupled=bool(doc.get("model_transaction_policy", {}).get("decoupled", False)),
        inputs=[spec(t) for t in doc.get("input", [])],
        outputs=[spec(t) for t in doc.get("output", [])],
    )


def inputs_of(
    config: TritonModelConfig, inputs: tuple[Any, ...], named: dict[str, Any]
) -> dict[str, np.ndarray]:
    if inputs and named:
        raise PyTritonClientValueError("Use either positional either keyword method arguments")
    if named:
        return {n: np.asarray(v) for n, v in named.items()}
    specs = list(config.inputs or ())
    if len(inputs) > len(specs):
        raise PyTritonClientValueError(
            f"model '{config.model_name}' has {len(specs)} inputs, {len(inputs)} were given"
        )
    return {s.name: np.asarray(v) for s, v in zip(specs, inputs, strict=False)}


def wrap(lib: Any, inputs: Mapping[str, np.ndarray]) -> list[Any]:
    wrapped = []
    for name, data in inputs.items():
        if data.dtype.type == np.str_:
            raise PyTritonClientValueError(
                f"Unicode inputs are not supported. Encode numpy array for {name!r} input "
                "(ex. with np.char.encode(array, 'utf-8'))."
            )
        tensor = lib.InferInput(
            name, list(data.shape), tritonclient.utils.np_to_triton_dtype(data.dtype)
        )
        tensor.set_data_from_numpy(data)
        wrapped.append(tensor)
    return wrapped


def outputs_of(response: Any) -> dict[str, np.ndarray]:
    if isinstance(response, tritonclient.http.InferResult):
        names = [o["name"] for o in response.get_response()["outputs"]]
    else:
        names = [o.name for o in response.get_response().outputs]
    return {name: response.as_numpy(name) for name in names}


def config_json(got: Any) -> Mapping[str, Any]:
    if isinstance(got, Mapping) and "config" in got and isinstance(got["config"], Mapping):
        return got["config"]
    return got if isinstance(got, Mapping) else {}


class BaseClient:
    def __init__(
        self,
        url: str,
        model_name: str,
        model_version: str | None,
        init_timeout_s: float | None,
        inference_timeout_s: float | None,
        model_config: TritonModelConfig | None,
    ) -> None:
        self._url = TritonUrl.from_url(url)
        self._model_name = model_name
        self._model_version = str(model_version or "")
        self._init_timeout_s = init_timeout_s or DEFAULT_INIT_TIMEOUT_S
        self._inference_timeout_s = inference_timeout_s or DEFAULT_INFERENCE_TIMEOUT_S
        self._config = model_config
        self._ids = itertools.count(1)
        self._closed = False

    def _request_id(self) -> str:
        return str(next(self._ids))

    def _check_open(self) -> None:
        if self._closed:
            raise PyTritonClientClosedError("ModelClient is closed")

    def _batched(self, config: TritonModelConfig, batch: bool) -> None:
        if batch and not config.batching:
            raise PyTritonClientModelDoesntSupportBatchingError(
                f"Model {config.model_name} doesn't support batching - use infer_sample method "
                "instead"
            )
