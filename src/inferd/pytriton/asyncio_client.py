"""PyTriton's ``AsyncioModelClient`` (re-exported by ``inferd.pytriton.client``): one model's
client on asyncio, over ``tritonclient``'s aio HTTP and gRPC clients."""

from __future__ import annotations

import asyncio
import time
import types
from typing import Any

import numpy as np
import tritonclient.grpc
import tritonclient.grpc.aio
import tritonclient.http
import tritonclient.http.aio
import tritonclient.utils

from inferd.pytriton.client_base import (
    POLL_S,
    BaseClient,
    PyTritonClientInferenceServerError,
    PyTritonClientTimeoutError,
    config_json,
    inputs_of,
    model_config_of,
    outputs_of,
    wrap,
)
from inferd.pytriton.model_config import TritonModelConfig


class AsyncioModelClient(BaseClient):
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
            await asyncio.sleep(POLL_S)
        extra = {"as_json": True} if self._grpc else {}
        got = await self._client.get_model_config(self._model_name, self._model_version, **extra)
        self._config = model_config_of(config_json(got))

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
        arrays = inputs_of(config, inputs, named_inputs)
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
        return await self._infer(
            config, inputs_of(config, inputs, named_inputs), parameters, headers
        )

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
                inputs=wrap(lib, inputs),
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
        return outputs_of(response)
