"""PyTriton's clients (``pytriton.client``) over ``tritonclient``: ``ModelClient`` (blocking)
and ``AsyncioModelClient`` call one model over HTTP or gRPC, chosen by the URL (``localhost``,
``host:port``, ``http://host:port``, ``grpc://host:port``; the port defaults to 8000 for HTTP
and 8001 for gRPC); ``DecoupledModelClient`` streams a decoupled model's responses (gRPC).
``infer_sample`` sends one sample (the batch dimension added and removed
for a batching model), ``infer_batch`` a batch; inputs by position (the model's order) or by
name. The model's configuration is read from the server before the first inference."""

from __future__ import annotations

import asyncio
import itertools
import queue
import time
import types
import urllib.parse
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import tritonclient.grpc
import tritonclient.grpc.aio
import tritonclient.http
import tritonclient.http.aio
import tritonclient.utils

from inferd.pytriton.model_config import DynamicBatcher, TensorSpec, TritonModelConfig

DEFAULT_INIT_TIMEOUT_S = 300.0
DEFAULT_INFERENCE_TIMEOUT_S = 60.0
_POLL_S = 0.1


class PyTritonClientError(Exception):
    """The base of the clients' errors."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self._message = message

    @property
    def message(self) -> str:
        return self._message


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


def _model_config(doc: Mapping[str, Any]) -> TritonModelConfig:
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


def _inputs(
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


def _wrap(lib: Any, inputs: Mapping[str, np.ndarray]) -> list[Any]:
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


def _outputs(response: Any) -> dict[str, np.ndarray]:
    if isinstance(response, tritonclient.http.InferResult):
        names = [o["name"] for o in response.get_response()["outputs"]]
    else:
        names = [o.name for o in response.get_response().outputs]
    return {name: response.as_numpy(name) for name in names}


def _config_json(got: Any) -> Mapping[str, Any]:
    if isinstance(got, Mapping) and "config" in got and isinstance(got["config"], Mapping):
        return got["config"]
    return got if isinstance(got, Mapping) else {}


class _Base:
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


class ModelClient(_Base):
    """A blocking client of one model (``with ModelClient("localhost", "Model") as c``)."""

    def __init__(
        self,
        url: str,
        model_name: str,
        model_version: str | None = None,
        *,
        lazy_init: bool = True,
        init_timeout_s: float | None = None,
        inference_timeout_s: float | None = None,
        model_config: TritonModelConfig | None = None,
        ensure_model_is_ready: bool = True,
        access_token: str | None = None,
    ) -> None:
        super().__init__(
            url, model_name, model_version, init_timeout_s, inference_timeout_s, model_config
        )
        self._grpc = self._url.scheme == "grpc"
        self._headers = {"authorization": f"Bearer {access_token}"} if access_token else None
        if self._grpc:
            self._client: Any = tritonclient.grpc.InferenceServerClient(self._url.without_scheme)
        else:
            timeout = max(self._inference_timeout_s, 1.0)
            self._client = tritonclient.http.InferenceServerClient(
                self._url.without_scheme, connection_timeout=timeout, network_timeout=timeout
            )
        if not lazy_init:
            self.wait_for_model(self._init_timeout_s)

    def get_lib(self) -> Any:
        return tritonclient.grpc if self._grpc else tritonclient.http

    def __enter__(self) -> ModelClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: types.TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._client.close()

    def wait_for_model(self, timeout_s: float) -> None:
        """Wait until the server and the model are ready (and read its configuration)."""
        self._check_open()
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if self._client.is_server_ready(
                    headers=self._headers
                ) and self._client.is_model_ready(
                    self._model_name, self._model_version, headers=self._headers
                ):
                    break
            except (tritonclient.utils.InferenceServerException, OSError):
                pass
            if time.monotonic() >= deadline:
                raise PyTritonClientTimeoutError(
                    f"Waiting for model {self._model_name} to be ready timed out after "
                    f"{timeout_s} s"
                )
            time.sleep(_POLL_S)
        got = self._client.get_model_config(
            self._model_name, self._model_version, headers=self._headers, **self._as_json()
        )
        self._config = _model_config(_config_json(got))

    def _as_json(self) -> dict[str, Any]:
        return {"as_json": True} if self._grpc else {}

    def wait_for_server(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if self._client.is_server_ready(headers=self._headers):
                    return
            except (tritonclient.utils.InferenceServerException, OSError):
                pass
            if time.monotonic() >= deadline:
                raise PyTritonClientTimeoutError(f"Server not ready after {timeout_s} s")
            time.sleep(_POLL_S)

    @property
    def model_config(self) -> TritonModelConfig:
        if self._config is None:
            self.wait_for_model(self._init_timeout_s)
        assert self._config is not None
        return self._config

    @property
    def is_batching_supported(self) -> bool:
        return self.model_config.max_batch_size > 0

    def infer_sample(
        self,
        *inputs: Any,
        parameters: dict[str, str | int | bool] | None = None,
        headers: dict[str, str | int | bool] | None = None,
        **named_inputs: Any,
    ) -> dict[str, np.ndarray]:
        """One sample (no batch dimension) in, its outputs out."""
        config = self.model_config
        arrays = _inputs(config, inputs, named_inputs)
        if config.batching:
            arrays = {n: a[np.newaxis, ...] for n, a in arrays.items()}
        result = self._infer(arrays, parameters, headers)
        return {n: a[0] for n, a in result.items()} if config.batching else result

    def infer_batch(
        self,
        *inputs: Any,
        parameters: dict[str, str | int | bool] | None = None,
        headers: dict[str, str | int | bool] | None = None,
        **named_inputs: Any,
    ) -> dict[str, np.ndarray]:
        """A batch (batch dimension first) in, its outputs out."""
        config = self.model_config
        self._batched(config, True)
        return self._infer(_inputs(config, inputs, named_inputs), parameters, headers)

    def _infer(
        self,
        inputs: dict[str, np.ndarray],
        parameters: dict[str, Any] | None,
        headers: dict[str, Any] | None,
    ) -> dict[str, np.ndarray]:
        self._check_open()
        config = self.model_config
        if config.decoupled:
            raise PyTritonClientInferenceServerError(
                "Model config is decoupled. Use DecoupledModelClient instead."
            )
        lib = self.get_lib()
        outputs = [lib.InferRequestedOutput(s.name) for s in config.outputs or ()]
        extra: dict[str, Any] = {}
        if self._grpc:
            extra["client_timeout"] = self._inference_timeout_s
        try:
            response = self._client.infer(
                model_name=self._model_name,
                model_version=self._model_version,
                inputs=_wrap(lib, inputs),
                outputs=outputs,
                request_id=self._request_id(),
                parameters=parameters,
                headers={**(self._headers or {}), **(headers or {})} or None,
                **extra,
            )
        except tritonclient.utils.InferenceServerException as exc:
            if "Deadline Exceeded" in str(exc.message()):
                raise PyTritonClientTimeoutError(
                    f"Timeout occurred during inference request. Timeout: "
                    f"{self._inference_timeout_s} s. Message: {exc.message()}"
                ) from exc
            raise PyTritonClientInferenceServerError(
                f"Error occurred during inference request. Message: {exc.message()}"
            ) from exc
        except OSError as exc:
            raise PyTritonClientTimeoutError(
                f"Timeout occurred during inference request. Timeout: "
                f"{self._inference_timeout_s} s Message: {exc}"
            ) from exc
        return _outputs(response)


class DecoupledModelClient(ModelClient):
    """A blocking client of a decoupled model over gRPC: ``infer_sample`` and ``infer_batch``
    return an iterator of the responses as the model sends them."""

    def __init__(self, url: str, model_name: str, *args: Any, **kwargs: Any) -> None:
        super().__init__(url, model_name, *args, **kwargs)
        if not self._grpc:
            self.close()
            raise PyTritonClientValueError(
                "DecoupledModelClient is only supported for grpc protocol"
            )

    def __enter__(self) -> DecoupledModelClient:
        return self

    def infer_sample(  # type: ignore[override]
        self,
        *inputs: Any,
        parameters: dict[str, str | int | bool] | None = None,
        headers: dict[str, str | int | bool] | None = None,
        **named_inputs: Any,
    ) -> Iterator[dict[str, np.ndarray]]:
        config = self.model_config
        arrays = _inputs(config, inputs, named_inputs)
        if config.batching:
            arrays = {n: a[np.newaxis, ...] for n, a in arrays.items()}
        for part in self._stream(arrays, parameters, headers):
            yield {n: a[0] for n, a in part.items()} if config.batching else part

    def infer_batch(  # type: ignore[override]
        self,
        *inputs: Any,
        parameters: dict[str, str | int | bool] | None = None,
        headers: dict[str, str | int | bool] | None = None,
        **named_inputs: Any,
    ) -> Iterator[dict[str, np.ndarray]]:
        config = self.model_config
        self._batched(config, True)
        yield from self._stream(_inputs(config, inputs, named_inputs), parameters, headers)

    def _stream(
        self,
        inputs: dict[str, np.ndarray],
        parameters: dict[str, Any] | None,
        headers: dict[str, Any] | None,
    ) -> Iterator[dict[str, np.ndarray]]:
        self._check_open()
        config = self.model_config
        if not config.decoupled:
            raise PyTritonClientInferenceServerError(
                "Model config is coupled. Use ModelClient instead."
            )
        answers: queue.SimpleQueue[tuple[Any, Any]] = queue.SimpleQueue()
        lib = tritonclient.grpc
        self._client.start_stream(
            callback=lambda result, error: answers.put((result, error)),
            stream_timeout=self._inference_timeout_s,
            headers={**(self._headers or {}), **(headers or {})} or None,
        )
        try:
            self._client.async_stream_infer(
                model_name=self._model_name,
                model_version=self._model_version,
                inputs=_wrap(lib, inputs),
                outputs=[lib.InferRequestedOutput(s.name) for s in config.outputs or ()],
                request_id=self._request_id(),
                parameters=parameters,
                enable_empty_final_response=True,
            )
            while True:
                try:
                    result, error = answers.get(timeout=self._inference_timeout_s)
                except queue.Empty:
                    raise PyTritonClientTimeoutError(
                        f"Timeout occurred during inference request. Timeout: "
                        f"{self._inference_timeout_s} s"
                    ) from None
                if error is not None:
                    raise PyTritonClientInferenceServerError(
                        f"Error occurred during inference request. Message: {error.message()}"
                    )
                response = result.get_response()
                if response.outputs:
                    yield _outputs(result)
                final = response.parameters.get("triton_final_response")
                if final is not None and final.bool_param:
                    return
        finally:
            self._client.stop_stream(cancel_requests=True)


class AsyncioModelClient(_Base):
    """An asyncio client of one model (``async with AsyncioModelClient(url, "Model") as c``)."""

    def __init__(
        self,
        url: str,
        model_name: str,
        model_version: str | None = None,
        *,
        lazy_init: bool = True,
        init_timeout_s: float | None = None,
        inference_timeout_s: float | None = None,
        model_config: TritonModelConfig | None = None,
        ensure_model_is_ready: bool = True,
    ) -> None:
        super().__init__(
            url, model_name, model_version, init_timeout_s, inference_timeout_s, model_config
        )
        self._grpc = self._url.scheme == "grpc"
        self._lazy = lazy_init
        if self._grpc:
            self._client: Any = tritonclient.grpc.aio.InferenceServerClient(
                self._url.without_scheme
            )
        else:
            self._client = tritonclient.http.aio.InferenceServerClient(
                self._url.without_scheme,
                conn_timeout=max(self._inference_timeout_s, 1.0),
            )

    def get_lib(self) -> Any:
        return tritonclient.grpc if self._grpc else tritonclient.http

    async def __aenter__(self) -> AsyncioModelClient:
        if not self._lazy:
            await self.wait_for_model(self._init_timeout_s)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: types.TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            await self._client.close()

    async def wait_for_model(self, timeout_s: float) -> None:
        self._check_open()
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if await self._client.is_server_ready() and await self._client.is_model_ready(
                    self._model_name, self._model_version
                ):
                    break
            except (tritonclient.utils.InferenceServerException, OSError):
                pass
            if time.monotonic() >= deadline:
                raise PyTritonClientTimeoutError(
                    f"Waiting for model {self._model_name} to be ready timed out after "
                    f"{timeout_s} s"
                )
            await asyncio.sleep(_POLL_S)
        extra = {"as_json": True} if self._grpc else {}
        got = await self._client.get_model_config(self._model_name, self._model_version, **extra)
        self._config = _model_config(_config_json(got))

    async def model_config(self) -> TritonModelConfig:
        if self._config is None:
            await self.wait_for_model(self._init_timeout_s)
        assert self._config is not None
        return self._config

    async def infer_sample(
        self,
        *inputs: Any,
        parameters: dict[str, str | int | bool] | None = None,
        headers: dict[str, str | int | bool] | None = None,
        **named_inputs: Any,
    ) -> dict[str, np.ndarray]:
        config = await self.model_config()
        arrays = _inputs(config, inputs, named_inputs)
        if config.batching:
            arrays = {n: a[np.newaxis, ...] for n, a in arrays.items()}
        result = await self._infer(config, arrays, parameters, headers)
        return {n: a[0] for n, a in result.items()} if config.batching else result

    async def infer_batch(
        self,
        *inputs: Any,
        parameters: dict[str, str | int | bool] | None = None,
        headers: dict[str, str | int | bool] | None = None,
        **named_inputs: Any,
    ) -> dict[str, np.ndarray]:
        config = await self.model_config()
        self._batched(config, True)
        return await self._infer(config, _inputs(config, inputs, named_inputs), parameters, headers)

    async def _infer(
        self,
        config: TritonModelConfig,
        inputs: dict[str, np.ndarray],
        parameters: dict[str, Any] | None,
        headers: dict[str, Any] | None,
    ) -> dict[str, np.ndarray]:
        self._check_open()
        lib = self.get_lib()
        outputs = [lib.InferRequestedOutput(s.name) for s in config.outputs or ()]
        extra: dict[str, Any] = {}
        if self._grpc:
            extra["client_timeout"] = self._inference_timeout_s
        else:
            extra["timeout"] = int(self._inference_timeout_s)
        try:
            response = await self._client.infer(
                model_name=self._model_name,
                model_version=self._model_version,
                inputs=_wrap(lib, inputs),
                outputs=outputs,
                request_id=self._request_id(),
                parameters=parameters,
                headers=headers,
                **extra,
            )
        except tritonclient.utils.InferenceServerException as exc:
            raise PyTritonClientInferenceServerError(
                f"Error occurred during inference request. Message: {exc.message()}"
            ) from exc
        except (TimeoutError, OSError) as exc:
            raise PyTritonClientTimeoutError(
                f"Timeout occurred during inference request. Timeout: "
                f"{self._inference_timeout_s} s Message: {exc}"
            ) from exc
        return _outputs(response)
