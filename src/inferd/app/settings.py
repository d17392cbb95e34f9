"""One Settings object: command-line flags (Triton's names), ``INFERD_*`` environment variables.

Precedence: a flag given on the command line, then the environment, then the default.
Every field's flag is ``--field-name`` and its variable ``INFERD_FIELD_NAME``.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import os
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from inferd.core.errors import ConfigError


def _opt(help_text: str, **extra: Any) -> Any:
    return {"help": help_text, **extra}


@dataclass(slots=True)
class Settings:
    model_repository: list[str] = field(
        default_factory=list,
        metadata=_opt(
            "model repository: a folder or s3://bucket/prefix; repeat for several", repeat=True
        ),
    )
    http_address: str = field(default="0.0.0.0", metadata=_opt("address the HTTP server binds"))
    http_port: int = field(default=8080, metadata=_opt("HTTP port (KServe v2 and TF Serving REST)"))
    http_workers: str = field(
        default="auto",
        metadata=_opt(
            "serving processes sharing the HTTP and gRPC ports (SO_REUSEPORT): worker 0 loads "
            "and runs every model (one copy, one batcher per model); the others decode and "
            "encode requests and forward each to it. A number, or auto: the usable CPU cores, "
            "fewer if the other workers (256 MiB each) would not fit in half the available "
            "memory"
        ),
    )
    http_workers_copy_bytes: int = field(
        default=1 << 20,
        metadata=_opt(
            "with several --http-workers: an ONNX Runtime or OpenVINO model of at most this "
            "many bytes on disk that runs on threads without batching (no dynamic or sequence "
            "batcher, no response cache) is also loaded by every other worker, since running "
            "it costs less than forwarding it; 0: every model is loaded once"
        ),
    )
    allow_grpc: bool = field(default=True, metadata=_opt("serve gRPC (KServe v2 / Triton)"))
    grpc_address: str = field(default="0.0.0.0", metadata=_opt("address the gRPC server binds"))
    grpc_port: int = field(default=8081, metadata=_opt("gRPC port (KServe v2 / Triton)"))
    grpc_server: str = field(
        default="auto",
        metadata=_opt(
            "gRPC server: native (HTTP/2 in libnghttp2, about the CPU cost of an HTTP request), "
            "grpcio, or auto (native when libnghttp2 loads, else grpcio)"
        ),
    )
    grpc_max_message_bytes: int = field(
        default=128 * 1024 * 1024,
        metadata=_opt("largest gRPC message accepted or sent"),
    )
    tfserving_tensor_content: bool = field(
        default=False,
        metadata=_opt(
            "TF Serving gRPC Predict answers in tensor_content instead of typed value fields "
            "(TF Serving's --enable_serialization_as_tensor_content)"
        ),
    )
    load_model: list[str] = field(
        default_factory=list,
        metadata=_opt("load only this model at start (repeat; '*' loads all)", repeat=True),
    )
    model_control_mode: str = field(
        default="none",
        metadata=_opt(
            "none: load the repository at start; poll: follow its changes; explicit: "
            "--load-model at start, then the repository API"
        ),
    )
    repository_poll_secs: int = field(
        default=15, metadata=_opt("seconds between repository polls (--model-control-mode poll)")
    )
    repository_unload_max_fraction: float = field(
        default=0.5,
        metadata=_opt(
            "a listing that loses more than this share of a store's models (or all of them) "
            "is a store fault: they keep serving for --repository-unload-grace-s"
        ),
    )
    repository_unload_grace_s: int = field(
        default=60,
        metadata=_opt("seconds models missing after a store fault keep serving (0: unload now)"),
    )
    strict_readiness: bool = field(
        default=True,
        metadata=_opt(
            "/v2/health/ready only when every model that should load is READY (false: as "
            "soon as startup loading is done)"
        ),
    )
    model_cache_dir: str = field(
        default="",
        metadata=_opt("local copies of models from S3 (default: a folder under the temp dir)"),
    )
    max_upload_bytes: int = field(
        default=1 << 30,
        metadata=_opt("largest model upload (PUT /v2/repository/models/NAME), packed or not"),
    )
    s3_endpoint_url: str = field(
        default="",
        metadata=_opt("S3-compatible endpoint (MinIO, QingStor...) for s3:// repositories"),
    )
    s3_access_key_id: str = field(
        default="", metadata=_opt("S3 access key (default: AWS_ACCESS_KEY_ID, profiles...)")
    )
    s3_secret_access_key: str = field(
        default="", metadata=_opt("S3 secret key (default: AWS_SECRET_ACCESS_KEY, profiles...)")
    )
    s3_region: str = field(default="", metadata=_opt("S3 region (optional)"))
    s3_addressing_style: str = field(
        default="auto",
        metadata=_opt("S3 URLs: path, virtual, or auto (path with --s3-endpoint-url)"),
    )
    log_verbose: int = field(default=0, metadata=_opt("verbose logging level (0: info, 1+: debug)"))
    http_max_body_bytes: int = field(
        default=128 * 1024 * 1024,
        metadata=_opt("largest HTTP request body accepted, after decompression"),
    )
    default_max_batch_size: int = field(
        default=64,
        metadata=_opt("max_batch_size given to a batchable model whose config does not set one"),
    )
    gil_switch_interval_us: int = field(
        default=500,
        metadata=_opt(
            "how long a Python thread may hold the GIL while another waits for it "
            "(sys.setswitchinterval; Python's default is 5000): short, so an instance thread "
            "that finished a batch does not wait behind the busy event loop"
        ),
    )
    gc_threshold: int = field(
        default=10_000,
        metadata=_opt(
            "container allocations (less deallocations) between two young-generation garbage "
            "collections (gc.set_threshold's first value; Python's default is 700): above what "
            "the requests in flight hold, so their short-lived objects are freed by reference "
            "counting instead of being traversed and promoted by the collector; 0 keeps Python's"
        ),
    )
    disable_auto_complete_config: bool = field(
        default=False,
        metadata=_opt("do not complete configs from model files; config.pbtxt must be complete"),
    )
    cache_size: int = field(
        default=0,
        metadata=_opt("response cache size in bytes, for models with response_cache (0: off)"),
    )
    allow_metrics: bool = field(
        default=True, metadata=_opt("serve Prometheus metrics at GET /metrics on the HTTP port")
    )
    metrics_port: int = field(
        default=0, metadata=_opt("also serve /metrics on this port, like Triton's 8002 (0: off)")
    )
    log_format: str = field(default="text", metadata=_opt("engine and access logs: text or json"))
    log_file: str = field(default="", metadata=_opt("also write the engine log to this file"))
    log_max_bytes: int = field(
        default=50 * 1024 * 1024, metadata=_opt("rotate a log file when it reaches this size")
    )
    log_backup_count: int = field(default=5, metadata=_opt("rotated log files kept"))
    access_log: bool = field(
        default=False, metadata=_opt("write one access-log line per request (to stderr)")
    )
    access_log_file: str = field(
        default="", metadata=_opt("write the access log to this file instead (turns it on)")
    )
    node_name: str = field(
        default_factory=socket.gethostname,
        metadata=_opt("node name in access-log lines (default: the host name)"),
    )
    trace_exporter: str = field(
        default="", metadata=_opt("OpenTelemetry span exporter: console or otlp (default: off)")
    )
    trace_endpoint: str = field(
        default="", metadata=_opt("OTLP/HTTP traces endpoint (default: the exporter's own)")
    )
    drain_timeout_s: int = field(
        default=30,
        metadata=_opt("on SIGTERM, seconds to let requests in flight finish before stopping"),
    )
    server_name: str = field(default="inferd", metadata=_opt("name reported by GET /v2"))
    allow_dashboard: bool = field(
        default=True, metadata=_opt("serve the web dashboard at /dashboard/ on the HTTP port")
    )
    dashboard_port: int = field(
        default=0,
        metadata=_opt("serve the dashboard on this port of its own instead (0: the HTTP port)"),
    )
    envoy_admin: str = field(
        default="",
        metadata=_opt("Envoy admin URL for the dashboard's cluster panel (http://host:9901)"),
    )
    dashboard_trace_url: str = field(
        default="",
        metadata=_opt("trace link for a request id in the dashboard's logs; {request_id} in it"),
    )
    # ---- security and limits at the edge (README "Security")
    auth_token: list[str] = field(
        default_factory=list,
        metadata=_opt(
            "token of the inference scope (repeat); inference then needs one", repeat=True
        ),
    )
    admin_token: list[str] = field(
        default_factory=list,
        metadata=_opt("token of the admin scope, which includes inference (repeat)", repeat=True),
    )
    auth_token_file: str = field(
        default="", metadata=_opt("file of inference tokens, one a line (reloaded on change)")
    )
    admin_token_file: str = field(
        default="", metadata=_opt("file of admin tokens, one a line (reloaded on change)")
    )
    auth_health: bool = field(
        default=False, metadata=_opt("health routes and RPCs need an inference token too")
    )
    auth_metrics: bool = field(default=False, metadata=_opt("GET /metrics needs a token too"))
    allow_unauthenticated_admin: bool = field(
        default=False,
        metadata=_opt("serve the admin API with no admin token configured, on any address"),
    )
    allow_pickle: str = field(
        default="startup",
        metadata=_opt(
            "load pickles/joblib files: never, startup (models present at start) or always",
            const="always",
        ),
    )
    allow_python_models: str = field(
        default="startup",
        metadata=_opt("run Python models: never, startup or always", const="always"),
    )
    allow_unsafe_ops: str = field(
        default="startup",
        metadata=_opt(
            "TensorFlow graphs with file-system ops: never, startup or always", const="always"
        ),
    )
    cors_allow_origin: list[str] = field(
        default_factory=list,
        metadata=_opt("browser origin allowed to call the API (repeat; '*' for any)", repeat=True),
    )
    allowed_hosts: list[str] = field(
        default_factory=list,
        metadata=_opt(
            "Host header values accepted (repeat; default: any, or loopback names "
            "when bound to loopback)",
            repeat=True,
        ),
    )
    tls_cert: str = field(default="", metadata=_opt("PEM certificate: HTTPS and gRPC over TLS"))
    tls_key: str = field(default="", metadata=_opt("PEM private key of --tls-cert"))
    tls_client_ca: str = field(
        default="", metadata=_opt("PEM CA: clients must present a certificate it signed (mTLS)")
    )
    grpc_use_ssl: bool = field(default=False, metadata=_opt("Triton's name: TLS on gRPC"))
    grpc_server_cert: str = field(default="", metadata=_opt("Triton's name: gRPC certificate"))
    grpc_server_key: str = field(default="", metadata=_opt("Triton's name: gRPC private key"))
    grpc_root_cert: str = field(default="", metadata=_opt("Triton's name: gRPC client CA"))
    grpc_use_ssl_mutual: bool = field(
        default=False, metadata=_opt("Triton's name: gRPC clients must present a certificate")
    )
    http_header_timeout_s: float = field(
        default=10.0,
        metadata=_opt("seconds to receive a request's headers, and idle keep-alive time"),
    )
    http_body_timeout_s: float = field(
        default=60.0, metadata=_opt("seconds a request body may pause between chunks")
    )
    http_max_connections: int = field(
        default=16384, metadata=_opt("open HTTP connections served at once; more wait")
    )
    http_max_header_bytes: int = field(
        default=64 * 1024, metadata=_opt("largest request head (request line and headers)")
    )
    max_inflight_requests: int = field(
        default=1024,
        metadata=_opt("requests in progress per port; more answer 503 at once (0: no limit)"),
    )
    max_inflight_bytes: int = field(
        default=1 << 30,
        metadata=_opt("HTTP request bodies in progress, in bytes; more answer 503 (0: no limit)"),
    )
    max_concurrent_uploads: int = field(
        default=2, metadata=_opt("model uploads in progress at once; more answer 503")
    )

    def models_to_load(self) -> list[str] | None:
        """None loads every model in the repository."""
        if not self.load_model or "*" in self.load_model:
            return None
        return list(self.load_model)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _env(name: str) -> str:
    return "INFERD_" + name.upper()


def _parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"not a boolean: '{text}'")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    for f in dataclasses.fields(Settings):
        meta = f.metadata
        env = _env(f.name)
        help_text = f"{meta['help']} (env {env})"
        if f.type == "bool":
            parser.add_argument(
                _flag(f.name),
                dest=f.name,
                nargs="?",
                const="true",
                default=None,
                metavar="BOOL",
                help=help_text,
            )
        elif "const" in meta:  # a value, or the bare flag meaning ``const``
            parser.add_argument(
                _flag(f.name),
                dest=f.name,
                nargs="?",
                const=meta["const"],
                default=None,
                help=help_text,
            )
        elif meta.get("repeat"):
            parser.add_argument(
                _flag(f.name), dest=f.name, action="append", default=None, help=help_text
            )
        else:
            parser.add_argument(_flag(f.name), dest=f.name, default=None, help=help_text)


def from_sources(args: argparse.Namespace | None, environ: Mapping[str, str]) -> Settings:
    """Build Settings from parsed flags and an environment mapping."""
    values: dict[str, Any] = {}
    for f in dataclasses.fields(Settings):
        raw: Any = getattr(args, f.name, None) if args is not None else None
        if raw is None and _env(f.name) in environ:
            text = environ[_env(f.name)]
            raw = [p for p in text.split(",") if p] if f.metadata.get("repeat") else text
        if raw is None:
            continue
        values[f.name] = _convert(f, raw)
    return Settings(**values)


def _convert(f: dataclasses.Field[Any], raw: Any) -> Any:
    try:
        if f.type == "bool":
            return _parse_bool(str(raw))
        if f.type == "int":
            return int(raw)
        if f.type == "float":
            return float(raw)
    except ValueError as exc:
        raise ConfigError(f"invalid value for {_flag(f.name)}: {exc}") from None
    if f.metadata.get("repeat"):
        return list(raw)
    return str(raw)


def parse(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> Settings:
    parser = argparse.ArgumentParser(prog="inferd serve")
    add_arguments(parser)
    return from_sources(parser.parse_args(list(argv)), os.environ if environ is None else environ)


def from_keywords(options: Mapping[str, Any], base: Settings | None = None) -> Settings:
    """Settings from Python keyword arguments (``inferd.Server(model_repository=..., ...)``):
    each name a field (a flag's name with underscores), each value of the field's type or its
    text as the flag takes it; a folder may be a ``Path``, a repeated setting one value or a
    list. Fields not named keep ``base``'s values (else the defaults); the environment is not
    read."""
    names = {f.name: f for f in dataclasses.fields(Settings)}
    values: dict[str, Any] = {}
    for name, value in options.items():
        f = names.get(name)
        if f is None:
            close = difflib.get_close_matches(name, list(names), n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            raise ConfigError(f"unknown setting '{name}'{hint}")
        values[name] = _keyword_value(f, value)
    return dataclasses.replace(base if base is not None else Settings(), **values)


def _keyword_value(f: dataclasses.Field[Any], value: Any) -> Any:
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if f.metadata.get("repeat"):
        items = [value] if isinstance(value, str | os.PathLike) else value
        if not isinstance(items, list | tuple) or not all(
            isinstance(i, str | os.PathLike) for i in items
        ):
            raise ConfigError(f"setting '{f.name}' takes a string or a list of strings")
        return [os.fspath(i) for i in items]
    if isinstance(value, str):
        return _convert(f, value)
    wanted = {"bool": (bool,), "int": (int,), "float": (int, float), "str": (str,)}[str(f.type)]
    if not isinstance(value, wanted) or (f.type != "bool" and isinstance(value, bool)):
        raise ConfigError(
            f"setting '{f.name}' must be {f.type}, got {type(value).__name__} {value!r}"
        )
    return float(value) if f.type == "float" and isinstance(value, int | float) else value
