"""One Settings object: every setting of a server, its default and its help text (its first
fields, where the server listens, are ``inferd.app.listen_settings``'s). Where the values come
from (flags, ``INFERD_*`` variables, Python keywords) is ``inferd.app.flags``."""

from __future__ import annotations

import socket
from dataclasses import dataclass, field

from inferd.app.listen_settings import ListenSettings
from inferd.app.listen_settings import opt as _opt


@dataclass(slots=True)
class Settings(ListenSettings):
    load_model: list[str] = field(
        default_factory=list,
        metadata=_opt("load only this model at start (repeat; '*' loads all)", repeat=True),
    )
    rate_limit: str = field(
        default="off",
        metadata=_opt(
            "Triton's rate limiter: execution_count runs a model instance only when the "
            "resources its instance group's rate_limiter asks for are free, the instance of "
            "lowest executions x priority first, across models; off ignores rate_limiter"
        ),
    )
    rate_limit_resource: list[str] = field(
        default_factory=list,
        metadata=_opt(
            "NAME:COUNT[:DEVICE]: copies of a rate limiter resource, on DEVICE or else on every "
            "device (a CPU instance is on device 0; a global resource takes the largest count); "
            "repeat; a resource not given has the largest count one instance asks for",
            repeat=True,
        ),
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
    exit_on_error: bool = field(
        default=True,
        metadata=_opt(
            "Triton's name: exit at start (code 2) when a model repository folder does not "
            "exist or cannot be read (false: log it and start without it). An s3:// "
            "repository that does not answer at start is not an error: its local cache serves"
        ),
    )
    model_cache_dir: str = field(
        default="",
        metadata=_opt("local copies of models from S3 (default: a folder under the temp dir)"),
    )
    model_cache_max_bytes: str = field(
        default="",
        metadata=_opt(
            "SIZE: with lazy serving, keep the local copies of S3 models within this size, "
            "removing those of the least recently loaded models that are not loaded (default: "
            "no bound)"
        ),
    )
    model_memory_budget: str = field(
        default="",
        metadata=_opt(
            "SIZE (bytes, or with a unit: 512Mi, 8Gi, 10G): lazy serving. Every model of the "
            "repository is available, none loads at start (but pinned ones); the first request "
            "for a model loads it, and the least recently used idle models are unloaded so "
            "that the memory the loaded models were measured to take stays within SIZE"
        ),
    )
    max_loaded_models: int = field(
        default=0,
        metadata=_opt(
            "lazy serving (as --model-memory-budget) with at most this many models loaded at "
            "once (0: no bound on the number)"
        ),
    )
    pin_model: list[str] = field(
        default_factory=list,
        metadata=_opt(
            "with lazy serving, load this model at start and never unload it to make room "
            "(repeat; the config parameter 'pinned' does the same once the model loads)",
            repeat=True,
        ),
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
    http_min_body_rate_bytes: int = field(
        default=1024,
        metadata=_opt(
            "bytes per second a request body must average after --http-header-timeout-s "
            "(chunked too), else 408 (0: no minimum)"
        ),
    )
    max_inflight_requests: int = field(
        default=1024,
        metadata=_opt(
            "requests in progress on the whole server, per port, counted once their body is "
            "in (uploads: from their head): inference calls, and admin calls (uploads "
            "included) apart; more answer 503 / RESOURCE_EXHAUSTED at once (0: no limit). "
            "With --http-workers N each worker takes 1/N of it"
        ),
    )
    max_inflight_bytes: int = field(
        default=1 << 30,
        metadata=_opt(
            "request bodies in progress, in bytes, per worker: HTTP bodies (more answer 503) "
            "and gRPC messages being received (past it no window opens until calls take "
            "theirs); 0: no limit"
        ),
    )
    max_concurrent_uploads: int = field(
        default=2, metadata=_opt("model uploads in progress at once; more answer 503")
    )

    # ---- TorchServe's APIs (docs/torchserve.md)
    model_store: str = field(
        default="",
        metadata=_opt(
            "TorchServe's model store: the folder of .mar archives that --models and the "
            "TorchServe management API register (turns the TorchServe APIs on; without "
            "--model-repository, registered models live in a temporary repository)"
        ),
    )
    models: list[str] = field(
        default_factory=list,
        metadata=_opt(
            "TorchServe archives to register at start, as TorchServe takes them: NAME=FILE.mar, "
            "FILE.mar, a no-archive folder, or all (several after one flag)",
            repeat=True,
            many=True,
        ),
    )
    allow_torchserve: bool = field(
        default=False,
        metadata=_opt(
            "serve TorchServe's inference, management and gRPC APIs on the --torchserve-* "
            "ports (on with --model-store)"
        ),
    )
    torchserve_inference_port: int = field(
        default=8085,
        metadata=_opt("TorchServe's inference API (its 8080, which inferd's HTTP has)"),
    )
    torchserve_management_port: int = field(
        default=8086, metadata=_opt("TorchServe's management API (its 8081; 0: off)")
    )
    torchserve_management_address: str = field(
        default="127.0.0.1",
        metadata=_opt(
            "address TorchServe's management APIs (HTTP and gRPC) bind: loopback, as TorchServe"
        ),
    )
    torchserve_grpc_inference_port: int = field(
        default=7070, metadata=_opt("TorchServe's gRPC inference API, as TorchServe (0: off)")
    )
    torchserve_grpc_management_port: int = field(
        default=7071, metadata=_opt("TorchServe's gRPC management API, as TorchServe (0: off)")
    )
    enable_model_api: bool = field(
        default=False,
        metadata=_opt(
            "TorchServe's flag: register and unregister archives through the management API "
            "(it sets --model-control-mode explicit)"
        ),
    )
    default_workers_per_model: int = field(
        default=1,
        metadata=_opt(
            "worker processes of a registered archive that asks for none (TorchServe's key)"
        ),
    )
    ts_config: str = field(
        default="",
        metadata=_opt(
            "TorchServe's config.properties: its addresses, ports, model_store, load_models, "
            "default_workers_per_model, allowed_urls, enable_model_api... where a flag leaves "
            "the setting at its default (turns the TorchServe APIs on)"
        ),
    )
    allowed_urls: list[str] = field(
        default_factory=list,
        metadata=_opt(
            "regular expression of http(s) archive URLs the TorchServe management API may "
            "download (repeat; default: none, only the model store and s3://)",
            repeat=True,
        ),
    )

    def lazy_serving(self) -> bool:
        """Models load on first use under a budget (--model-memory-budget, --max-loaded-models)."""
        return bool(self.model_memory_budget.strip()) or self.max_loaded_models > 0

    def models_to_load(self) -> list[str] | None:
        """None loads every model in the repository."""
        if not self.load_model or "*" in self.load_model:
            return None
        return list(self.load_model)
