"""PyTriton's server side (``pytriton.triton``) on an in-process ``inferd.Server``: ``Triton``
binds Python functions as models (``bind``) and serves them over HTTP and gRPC (``run``,
``serve``, ``with Triton() as triton``); ``TritonConfig`` holds Triton's server options.

Each binding is a function model of the server (``inferd.backends.function``): no model files,
no proxy process; the dynamic batcher batches its requests and each function of a list runs
one instance. Of ``TritonConfig``'s fields, inferd applies the endpoints' (``allow_http``,
``http_address``, ``http_port``, and the gRPC ones) and ``id``; the others are accepted and
have no effect here.
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import os
import pathlib
import re
import shutil
import tempfile
import threading
import types
import typing
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from inferd.app.embedded import Server
from inferd.backends.function import FunctionRequest
from inferd.pytriton.context import running
from inferd.pytriton.exceptions import (
    PyTritonInvalidOperationError,
    PyTritonValidationError,
)
from inferd.pytriton.model_config import (
    ModelConfig,
    Tensor,
    TritonModelConfig,
    inferd_config,
    triton_model_config,
)

LOGGER = logging.getLogger("inferd.pytriton")
MONITORING_PERIOD_S = 10.0
DEFAULT_HTTP_PORT = 8000
DEFAULT_GRPC_PORT = 8001


@dataclasses.dataclass(kw_only=True)
class TritonConfig:
    """Triton's server options, by its command line's names (``http_port`` ->
    ``--http-port``); unset fields keep the defaults."""

    model_repository: pathlib.Path | None = None
    id: str | None = None
    log_verbose: int | None = None
    log_file: pathlib.Path | None = None
    exit_timeout_secs: int | None = None
    exit_on_error: bool | None = None
    strict_readiness: bool | None = None
    allow_http: bool | None = None
    http_address: str | None = None
    http_port: int | None = None
    http_header_forward_pattern: str | None = None
    http_thread_count: int | None = None
    http_restricted_api: str | None = None
    allow_grpc: bool | None = None
    grpc_address: str | None = None
    grpc_port: int | None = None
    grpc_header_forward_pattern: str | None = None
    grpc_infer_allocation_pool_size: int | None = None
    grpc_use_ssl: bool | None = None
    grpc_use_ssl_mutual: bool | None = None
    grpc_server_cert: pathlib.Path | None = None
    grpc_server_key: pathlib.Path | None = None
    grpc_root_cert: pathlib.Path | None = None
    grpc_infer_response_compression_level: str | None = None
    grpc_keepalive_time: int | None = None
    grpc_keepalive_timeout: int | None = None
    grpc_keepalive_permit_without_calls: bool | None = None
    grpc_http2_max_pings_without_data: int | None = None
    grpc_http2_min_recv_ping_interval_without_data: int | None = None
    grpc_http2_max_ping_strikes: int | None = None
    grpc_restricted_protocol: str | None = None
    allow_metrics: bool | None = None
    allow_gpu_metrics: bool | None = None
    allow_cpu_metrics: bool | None = None
    metrics_interval_ms: int | None = None
    metrics_port: int | None = None
    metrics_address: str | None = None
    allow_sagemaker: bool | None = None
    sagemaker_port: int | None = None
    sagemaker_safe_port_range: str | None = None
    sagemaker_thread_count: int | None = None
    allow_vertex_ai: bool | None = None
    vertex_ai_port: int | None = None
    vertex_ai_thread_count: int | None = None
    vertex_ai_default_model: str | None = None
    metrics_config: list[str] | None = None
    trace_config: list[str] | None = None
    cache_config: list[str] | None = None
    cache_directory: str | None = None
    buffer_manager_thread_count: int | None = None

    def __post_init__(self) -> None:
        if self.allow_http is False and self.allow_grpc is False:
            raise PyTritonValidationError("The `http` or `grpc` endpoint has to be allowed.")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, config: dict[str, Any]) -> TritonConfig:
        """A config from a dict of (possibly string) values; unknown names are logged."""
        hints = typing.get_type_hints(cls)
        known: dict[str, Any] = {}
        for name, value in config.items():
            if name not in hints:
                LOGGER.warning("Ignoring %s=%s: TritonConfig has no such field", name, value)
                continue
            known[name] = _cast(hints[name], value)
        return cls(**known)

    @classmethod
    def from_env(cls) -> TritonConfig:
        """A config from ``PYTRITON_TRITON_CONFIG_<FIELD>`` variables (lists as ``<FIELD>_<n>``)."""
        prefix = "PYTRITON_TRITON_CONFIG_"
        config: dict[str, Any] = {}
        lists: dict[str, dict[int, str]] = {}
        for name, value in os.environ.items():
            if not name.startswith(prefix):
                continue
            key = name[len(prefix) :].lower()
            match = re.match(r"^(.+?)_(\d+)$", key)
            if match:
                lists.setdefault(match.group(1), {})[int(match.group(2))] = value
            else:
                config[key] = value
        for key, items in lists.items():
            config[key] = [items[i] for i in sorted(items)]
        return cls.from_dict(config)


def _cast(hint: Any, value: Any) -> Any:
    if value is None:
        return None
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    kind = args[0] if args else hint
    if typing.get_origin(kind) is list:
        return value.split(",") if isinstance(value, str) else list(value)
    if kind is bool and isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    return kind(value)


@dataclasses.dataclass
class _Binding:
    config: TritonModelConfig
    functions: list[Callable[..., Any]]
    strict: bool


class Triton:
    """An inferd server in this process serving bound Python functions, PyTriton's way.

    Settings come from ``config``, then ``PYTRITON_TRITON_CONFIG_*`` variables, then defaults
    (HTTP on 8000, gRPC on 8001)."""

    def __init__(
        self,
        *,
        config: TritonConfig | None = None,
        workspace: str | pathlib.Path | None = None,
        triton_lifecycle_policy: Any = None,
        security_config: Any = None,
    ) -> None:
        def given(c: TritonConfig) -> dict[str, Any]:
            return {k: v for k, v in c.to_dict().items() if v is not None}

        merged = {**given(TritonConfig.from_env()), **(given(config) if config else {})}
        self._config = TritonConfig(**merged)
        self._own_workspace = workspace is None
        self._workspace = pathlib.Path(
            workspace if workspace is not None else tempfile.mkdtemp(prefix="inferd-pytriton-")
        )
        self._bindings: dict[str, _Binding] = {}
        self._server: Server | None = None
        self._stopped = threading.Event()
        self._lock = threading.Lock()
        self.http_port: int | None = None
        self.grpc_port: int | None = None

    # ---------------------------------------------------------------- models

    def bind(
        self,
        model_name: str,
        infer_func: Callable[..., Any] | Sequence[Callable[..., Any]],
        inputs: Sequence[Tensor],
        outputs: Sequence[Tensor],
        model_version: int = 1,
        config: ModelConfig | None = None,
        strict: bool = False,
        trace_config: list[str] | None = None,
    ) -> None:
        """Serve ``infer_func`` (a list: one instance each) as ``model_name``; bound after
        ``run``, the model loads at once."""
        if not model_name:
            raise PyTritonValidationError("Model name cannot be empty")
        if not re.match(r"^[a-zA-Z0-9._-]+$", model_name):
            raise PyTritonValidationError(
                "Model name can only contain alphanumeric characters, dots, underscores and dashes"
            )
        functions = list(infer_func) if isinstance(infer_func, Sequence) else [infer_func]
        model = triton_model_config(
            model_name, model_version, inputs, outputs, config or ModelConfig(), len(functions)
        )
        binding = _Binding(model, functions, strict)
        with self._lock:
            self._bindings[model_name] = binding
            server = self._server
        if server is not None:
            self._load(server, binding)

    def _load(self, server: Server, binding: _Binding) -> None:
        model = binding.config
        doc = inferd_config(model)
        calls = [_adapt(f, model, binding.strict) for f in binding.functions]
        server.bind(
            model.model_name,
            calls,
            [(s.name, s.dtype, s.shape) for s in model.inputs or ()],
            [(s.name, s.dtype, s.shape) for s in model.outputs or ()],
            max_batch_size=model.max_batch_size,
            config=doc,
            version=model.model_version,
        )

    # ---------------------------------------------------------------- lifecycle

    def run(self) -> None:
        """Start serving (returns at once; ``stop`` ends it)."""
        with self._lock:
            if self._server is not None:
                return
            if self._stopped.is_set():
                raise PyTritonInvalidOperationError("this Triton has stopped: make a new one")
            c = self._config
            repository = self._workspace / "model-store"
            repository.mkdir(parents=True, exist_ok=True)
            options: dict[str, Any] = {
                "model_repository": str(repository),
                "model_control_mode": "explicit",
            }
            if c.id:
                options["server_name"] = c.id
            if c.http_address:
                options["http_address"] = c.http_address
            if c.grpc_address:
                options["grpc_address"] = c.grpc_address
            server = Server(**options).open()
            self._server = server
            bindings = list(self._bindings.values())
        atexit.register(self.stop)
        try:
            if c.allow_http is not False:
                self.http_port = server.serve_http(
                    c.http_port if c.http_port is not None else DEFAULT_HTTP_PORT
                )
            if c.allow_grpc is not False:
                self.grpc_port = server.serve_grpc(
                    c.grpc_port if c.grpc_port is not None else DEFAULT_GRPC_PORT
                )
            for binding in bindings:
                self._load(server, binding)
        except BaseException:
            self.stop()
            raise
        for name in self._bindings:
            LOGGER.info("Infer function available as model: `/v2/models/%s`", name)

    def connect(self) -> None:
        """Nothing to connect: the server runs in this process (``run`` starts it)."""

    def serve(self, monitoring_period_s: float = MONITORING_PERIOD_S) -> None:
        """Start serving and block until ``stop`` (or Ctrl+C)."""
        self.run()
        try:
            while not self._stopped.wait(monitoring_period_s):
                pass
        except KeyboardInterrupt:
            LOGGER.info("SIGINT received, exiting.")
        self.stop()

    def stop(self) -> bool:
        """Stop serving and remove the workspace it made; False when already stopped."""
        with self._lock:
            if self._stopped.is_set():
                return False
            self._stopped.set()
            server, self._server = self._server, None
        atexit.unregister(self.stop)
        if server is not None:
            server.close()
        if self._own_workspace:
            shutil.rmtree(self._workspace, ignore_errors=True)
        return True

    def is_alive(self) -> bool:
        server = self._server
        return server is not None and server.ready

    def is_connected(self) -> bool:
        return self._server is not None

    @property
    def server(self) -> Server:
        """The ``inferd.Server`` underneath (running)."""
        if self._server is None:
            raise PyTritonInvalidOperationError("the server is not running: call run()")
        return self._server

    def __enter__(self) -> Triton:
        self.run()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: types.TracebackType | None,
    ) -> None:
        self.stop()


def _adapt(
    function: Callable[..., Any], model: TritonModelConfig, strict: bool
) -> Callable[[list[FunctionRequest]], list[Any]]:
    """The bound function as the function backend calls it: in the model's context, its
    answers checked against the outputs declared when ``strict``."""
    declared = {spec.name: spec for spec in model.outputs or ()}

    def call(requests: list[FunctionRequest]) -> list[Any]:
        with running(model):
            answers = function(requests)
        if strict:
            for answer in answers:
                _check_strict(model.model_name, answer, declared)
        return list(answers)

    return call


def _check_strict(model: str, answer: Any, declared: dict[str, Any]) -> None:
    if not isinstance(answer, dict):
        raise PyTritonValidationError(f"model '{model}': a response must be a dict of arrays")
    for name, value in answer.items():
        spec = declared.get(name)
        if spec is None:
            raise PyTritonValidationError(f"model '{model}': output '{name}' is not declared")
        if not isinstance(value, np.ndarray):
            raise PyTritonValidationError(f"model '{model}': output '{name}' is not an array")
        wanted = np.dtype(spec.dtype)
        if wanted.kind in "OSU" and value.dtype.kind in "OSU":
            continue
        if value.dtype != wanted:
            raise PyTritonValidationError(
                f"model '{model}': output '{name}' is {value.dtype}, declared {wanted}"
            )
