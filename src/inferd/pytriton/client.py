"""PyTriton's clients (``pytriton.client``) over ``tritonclient``: ``ModelClient`` (blocking)
and ``AsyncioModelClient`` call one model over HTTP or gRPC, chosen by the URL (``localhost``,
``host:port``, ``http://host:port``, ``grpc://host:port``; the port defaults to 8000 for HTTP
and 8001 for gRPC); ``DecoupledModelClient`` streams a decoupled model's responses (gRPC).
``infer_sample`` sends one sample (the batch dimension added and removed
for a batching model), ``infer_batch`` a batch; inputs by position (the model's order) or by
name. The model's configuration is read from the server before the first inference."""

from __future__ import annotations

import queue
import time
import types
from collections.abc import Iterator
from typing import Any

import numpy as np
import tritonclient.grpc
import tritonclient.http
import tritonclient.utils

from inferd.pytriton.asyncio_client import AsyncioModelClient
from inferd.pytriton.client_base import (
    POLL_S,
    BaseClient,
    PyTritonClientClosedError,
    PyTritonClientError,
    PyTritonClientInferenceServerError,
    PyTritonClientInvalidUrlError,
    PyTritonClientModelDoesntSupportBatchingError,
    PyTritonClientModelUnavailableError,
    PyTritonClientTimeoutError,
    PyTritonClientValueError,
    TritonUrl,
    config_json,
    inputs_of,
    model_config_of,
    outputs_of,
    wrap,
)
from inferd.pytriton.model_config import TritonModelConfig


class ModelClient(BaseClient):
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
            time.sleep(POLL_S)
        got = self._client.get_model_config(
            self._model_name, self._model_version, headers=self._headers, **self._as_json()
        )
        self._config = model_config_of(config_json(got))

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
            time.sleep(POLL_S)

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
        arrays = inputs_of(config, inputs, named_inputs)
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
        return self._infer(inputs_of(config, inputs, named_inputs), parameters, headers)

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
                inputs=wrap(lib, inputs),
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
        return outputs_of(response)


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
        arrays = inputs_of(config, inputs, named_inputs)
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
        yield from self._stream(inputs_of(config, inputs, named_inputs), parameters, headers)

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
                inputs=wrap(lib, inputs),
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
                    yield outputs_of(result)
                final = response.parameters.get("triton_final_response")
                if final is not None and final.bool_param:
                    return
        finally:
            self._client.stop_stream(cancel_requests=True)


__all__ = [
    "AsyncioModelClient",
    "DecoupledModelClient",
    "ModelClient",
    "PyTritonClientClosedError",
    "PyTritonClientError",
    "PyTritonClientInferenceServerError",
    "PyTritonClientInvalidUrlError",
    "PyTritonClientModelDoesntSupportBatchingError",
    "PyTritonClientModelUnavailableError",
    "PyTritonClientTimeoutError",
    "PyTritonClientValueError",
    "TritonUrl",
]
