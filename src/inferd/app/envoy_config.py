"""``inferd envoy-config``: an Envoy v3 bootstrap that balances HTTP and gRPC over inferd nodes.

Envoy, not inferd, is the balancer: this only writes its configuration. Two listeners (HTTP/1.1
and HTTP/2 for KServe v2 / TF Serving REST; HTTP/2 for gRPC), one cluster per protocol with
active health checks (``/v2/health/ready``, gRPC health), outlier detection, and retries only
where a request cannot have run twice: a connection that failed or a stream refused before
the request went out, or a 503 / UNAVAILABLE, which inferd answers only for requests it did
not execute. Reads are also retried after a reset. The access log names the upstream node.
``--route-by-model`` sends each model to the same node by consistent hashing
(``inferd.app.envoy_routing``).
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import re
import sys
from dataclasses import dataclass
from typing import Any

from inferd.app import envoy_routing

HCM = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3"
ROUTER = "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
FILE_LOG = "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog"
PREVIOUS = (
    "type.googleapis.com/envoy.extensions.retry.host.previous_hosts.v3.PreviousHostsPredicate"
)
HTTP_OPTIONS = "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions"

# One line per request: who asked, what, the answer, and which node served it.
ACCESS_FORMAT = (
    '[%START_TIME%] "%REQ(:METHOD)% %REQ(:PATH)% %PROTOCOL%" %RESPONSE_CODE% '
    "grpc=%GRPC_STATUS_NUMBER% flags=%RESPONSE_FLAGS% in=%BYTES_RECEIVED% out=%BYTES_SENT% "
    "ms=%DURATION% upstream=%UPSTREAM_HOST% cluster=%UPSTREAM_CLUSTER% "
    "attempts=%UPSTREAM_REQUEST_ATTEMPT_COUNT% request_id=%REQ(X-REQUEST-ID)%\n"
)

# Retry policies, safest last: what each kind of request may be retried on.
SAFE_ANY = "connect-failure,refused-stream,reset-before-request"
RETRY_INFER = SAFE_ANY + ",retriable-status-codes"  # 503: inferd did not run the request
RETRY_READ = RETRY_INFER + ",reset"  # a read may run twice
RETRY_GRPC = SAFE_ANY + ",unavailable"  # UNAVAILABLE: not run (gRPC's 503)

INFER_PATHS = r"/v2/models/[^?]+/infer|/v1/models/[^?]+:(predict|classify|regress)"
READ_POSTS = r"/v2/repository/index"
GRPC_STREAM = "/inference.GRPCInferenceService/ModelStreamInfer"
GRPC_WRITES = r"/inference\.GRPCInferenceService/Repository(ModelLoad|ModelUnload)"


class UpstreamError(ValueError):
    """An ``--upstream`` (or listen address) that is not HOST:PORT:PORT (HOST:PORT)."""


@dataclass(frozen=True, slots=True)
class Upstream:
    host: str
    http_port: int
    grpc_port: int


@dataclass(frozen=True, slots=True)
class Options:
    upstreams: tuple[Upstream, ...]
    listen: tuple[str, int] = ("0.0.0.0", 8080)
    grpc_listen: tuple[str, int] = ("0.0.0.0", 8081)
    admin: tuple[str, int] = ("127.0.0.1", 9901)
    stats_listen: tuple[str, int] | None = None  # /stats/prometheus and /ready, from the admin
    lb: str = "round_robin"
    strict_dns: bool = False
    health_interval_s: float = 5.0
    timeout_s: float = 120.0  # one inference, including its time in the queue
    access_log: str = "/dev/stdout"
    route_by_model: bool = False  # hash each model to the same node (envoy_routing)
    hash_lb: str = "ring_hash"  # with route_by_model: ring_hash or maglev


def _port(text: str, what: str, raw: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise UpstreamError(f"{what} '{raw}': '{text}' is not a port (1-65535)")
    return int(text)


def _split_host(raw: str, what: str, ports: int) -> tuple[str, list[str]]:
    """``host:p1[:p2]`` or ``[v6]:p1[:p2]`` -> (host, [p1, p2])."""
    shape = "HOST:HTTP_PORT:GRPC_PORT" if ports == 2 else "ADDRESS:PORT"
    found = re.fullmatch(r"\[([0-9A-Fa-f:.]+)\]((?::[^:]*)+)|([^:\[\]]+)((?::[^:]*)+)", raw)
    if found is None:
        raise UpstreamError(f"{what} '{raw}' is not {shape}")
    host = found.group(1) or found.group(3)
    parts = (found.group(2) or found.group(4))[1:].split(":")
    if len(parts) != ports or not host:
        raise UpstreamError(f"{what} '{raw}' is not {shape}")
    return host, parts


def parse_upstream(raw: str) -> Upstream:
    """``HOST:HTTP_PORT:GRPC_PORT`` (an IP address, a DNS name, or ``[IPv6]``)."""
    host, (http, grpc) = _split_host(raw, "--upstream", 2)
    return Upstream(host, _port(http, "--upstream", raw), _port(grpc, "--upstream", raw))


def parse_address(raw: str, flag: str) -> tuple[str, int]:
    host, (port,) = _split_host(raw, flag, 1)
    return host, _port(port, flag, raw)


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _socket(address: tuple[str, int]) -> dict[str, Any]:
    return {"socket_address": {"address": address[0], "port_value": address[1]}}


def _duration(seconds: float) -> str:
    return f"{seconds:g}s"


def _route(match: dict[str, Any], cluster: str, timeout_s: float, retry_on: str) -> dict[str, Any]:
    route: dict[str, Any] = {
        "cluster": cluster,
        "timeout": _duration(timeout_s),
        "retry_policy": {
            "retry_on": retry_on,
            "num_retries": 2,
            "retry_host_predicate": [
                {
                    "name": "envoy.retry_host_predicates.previous_hosts",
                    "typed_config": {"@type": PREVIOUS},
                }
            ],
            "host_selection_retry_max_attempts": 3,
        },
    }
    if "retriable-status-codes" in retry_on:
        route["retry_policy"]["retriable_status_codes"] = [503]
    return {"match": match, "route": route}


def _method(*methods: str) -> dict[str, Any]:
    pattern = "|".join(methods)
    return {"name": ":method", "string_match": {"safe_regex": {"regex": pattern}}}


def _http_routes(options: Options) -> list[dict[str, Any]]:
    cluster = "inferd_http"
    infer = _route(
        {"safe_regex": {"regex": INFER_PATHS}, "headers": [_method("POST")]},
        cluster,
        options.timeout_s,
        RETRY_INFER,
    )
    reads = _route({"prefix": "/", "headers": [_method("GET", "HEAD")]}, cluster, 30, RETRY_READ)
    # Repository writes and uploads: a model load may take minutes; never run twice.
    writes = _route({"prefix": "/"}, cluster, 600, SAFE_ANY)
    routes = [infer, reads, _route({"path": READ_POSTS}, cluster, 30, RETRY_READ), writes]
    if options.route_by_model:
        return envoy_routing.http_routes(infer, reads, writes) + routes
    return routes


def _grpc_routes(options: Options) -> list[dict[str, Any]]:
    cluster = "inferd_grpc"
    routes = [
        _route({"path": GRPC_STREAM}, cluster, 0, SAFE_ANY),
        _route({"safe_regex": {"regex": GRPC_WRITES}}, cluster, 600, SAFE_ANY),
        _route({"prefix": "/"}, cluster, options.timeout_s, RETRY_GRPC),
    ]
    for route in routes:  # a client's grpc-timeout (its deadline) wins over the route's
        route["route"]["max_stream_duration"] = {"grpc_timeout_header_max": "0s"}
    if options.route_by_model:
        return envoy_routing.grpc_routes(routes) + routes
    return routes


def _listener(
    name: str, address: tuple[str, int], routes: list[dict[str, Any]], options: Options
) -> dict[str, Any]:
    manager: dict[str, Any] = {
        "@type": f"{HCM}.HttpConnectionManager",
        "stat_prefix": name,
        "codec_type": "AUTO",
        "use_remote_address": True,
        "access_log": [
            {
                "name": "envoy.access_loggers.file",
                "typed_config": {
                    "@type": FILE_LOG,
                    "path": options.access_log,
                    "log_format": {"text_format_source": {"inline_string": ACCESS_FORMAT}},
                },
            }
        ],
        "route_config": {
            "name": name,
            "virtual_hosts": [{"name": name, "domains": ["*"], "routes": routes}],
        },
        "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {"@type": ROUTER}}],
    }
    return {
        "name": name,
        "address": _socket(address),
        "filter_chains": [
            {
                "filters": [
                    {
                        "name": "envoy.filters.network.http_connection_manager",
                        "typed_config": manager,
                    }
                ]
            }
        ],
    }


def _cluster(name: str, grpc: bool, options: Options) -> dict[str, Any]:
    interval = _duration(options.health_interval_s)
    check: dict[str, Any] = {
        "timeout": _duration(max(options.health_interval_s, 1.0)),
        "interval": interval,
        "no_traffic_interval": interval,
        "unhealthy_threshold": 2,
        "healthy_threshold": 1,
    }
    if grpc:
        check["grpc_health_check"] = {"service_name": ""}
    else:
        check["http_health_check"] = {"path": "/v2/health/ready"}
    dns = options.strict_dns or not all(_is_ip(u.host) for u in options.upstreams)
    # Health checks name the node itself (Host / :authority), not the cluster: a node bound to
    # loopback serves only its own names (inferd's DNS-rebinding guard, --allowed-hosts).
    endpoints = [
        {
            "endpoint": {
                "address": _socket((u.host, u.grpc_port if grpc else u.http_port)),
                "hostname": u.host,
                "health_check_config": {"hostname": u.host},
            }
        }
        for u in options.upstreams
    ]
    cluster: dict[str, Any] = {
        "name": name,
        "type": "STRICT_DNS" if dns else "STATIC",
        "connect_timeout": "1s",
        "lb_policy": options.lb.upper(),
        "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": endpoints}]},
        "health_checks": [check],
        "close_connections_on_host_health_failure": True,
        "outlier_detection": {
            "consecutive_5xx": 5,
            "consecutive_gateway_failure": 2,
            "interval": interval,
            "base_ejection_time": "10s",
            "max_ejection_percent": 50,
        },
        "circuit_breakers": {
            "thresholds": [
                {
                    "max_connections": 10000,
                    "max_pending_requests": 10000,
                    "max_requests": 10000,
                    "max_retries": 100,
                }
            ]
        },
    }
    if dns:
        cluster["dns_lookup_family"] = "V4_PREFERRED"
        cluster["dns_refresh_rate"] = "5s"
        cluster["respect_dns_ttl"] = False
    if grpc:
        cluster["typed_extension_protocol_options"] = {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": HTTP_OPTIONS,
                "explicit_http_config": {"http2_protocol_options": {}},
            }
        }
    return cluster


def _stats(options: Options) -> tuple[dict[str, Any], dict[str, Any]]:
    """A listener that shows only the admin's ``/stats/prometheus`` and ``/ready`` (for
    Prometheus and probes), and the cluster that reaches the admin on loopback."""
    routes = [
        {"match": {"path": path}, "route": {"cluster": "envoy_admin", "timeout": "5s"}}
        for path in ("/stats/prometheus", "/ready")
    ]
    manager = {
        "@type": f"{HCM}.HttpConnectionManager",
        "stat_prefix": "envoy_stats",
        "route_config": {
            "name": "envoy_stats",
            "virtual_hosts": [{"name": "envoy_stats", "domains": ["*"], "routes": routes}],
        },
        "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {"@type": ROUTER}}],
    }
    assert options.stats_listen is not None
    listener = {
        "name": "envoy_stats",
        "address": _socket(options.stats_listen),
        "filter_chains": [
            {
                "filters": [
                    {
                        "name": "envoy.filters.network.http_connection_manager",
                        "typed_config": manager,
                    }
                ]
            }
        ],
    }
    host = options.admin[0] if options.admin[0] not in ("0.0.0.0", "::") else "127.0.0.1"
    endpoint = {"endpoint": {"address": _socket((host, options.admin[1]))}}
    cluster = {
        "name": "envoy_admin",
        "type": "STATIC",
        "connect_timeout": "1s",
        "load_assignment": {
            "cluster_name": "envoy_admin",
            "endpoints": [{"lb_endpoints": [endpoint]}],
        },
    }
    return listener, cluster


def bootstrap(options: Options) -> dict[str, Any]:
    """The whole Envoy v3 bootstrap as a dict (JSON- and YAML-ready)."""
    if not options.upstreams:
        raise UpstreamError("at least one --upstream HOST:HTTP_PORT:GRPC_PORT is needed")
    listeners = [
        _listener("inferd_http", options.listen, _http_routes(options), options),
        _listener("inferd_grpc", options.grpc_listen, _grpc_routes(options), options),
    ]
    clusters = [_cluster("inferd_http", False, options), _cluster("inferd_grpc", True, options)]
    if options.route_by_model:
        clusters += [envoy_routing.hashed_cluster(c, options.hash_lb) for c in clusters]
    if options.stats_listen is not None:
        listener, cluster = _stats(options)
        listeners.append(listener)
        clusters.append(cluster)
    return {
        "admin": {"address": _socket(options.admin)},
        "static_resources": {"listeners": listeners, "clusters": clusters},
    }


def to_yaml(value: Any, indent: int = 0) -> str:
    """Block-style YAML; every string is JSON-quoted (valid YAML), so nothing is misread."""
    pad = "  " * indent
    if isinstance(value, dict):
        if not value:
            return "{}"
        lines = []
        for key, item in value.items():
            name = key if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.]*", key) else json.dumps(key)
            if isinstance(item, dict | list) and item:
                lines.append(f"{pad}{name}:\n{to_yaml(item, indent + 1)}")
            else:
                lines.append(f"{pad}{name}: {to_yaml(item, indent + 1)}")
        return "\n".join(lines)
    if isinstance(value, list):
        if not value:
            return "[]"
        lines = []
        for item in value:
            text = to_yaml(item, indent + 1)
            if isinstance(item, dict | list) and item:
                lines.append(f"{pad}- {text.lstrip()}")
            else:
                lines.append(f"{pad}- {text}")
        return "\n".join(lines)
    return json.dumps(value)


def render(options: Options, output_format: str) -> str:
    config = bootstrap(options)
    if output_format == "json":
        return json.dumps(config, indent=2) + "\n"
    header = "# Envoy v3 bootstrap written by `inferd envoy-config`; run: envoy -c THIS_FILE\n"
    return header + to_yaml(config) + "\n"


def _run(args: argparse.Namespace) -> int:
    try:
        options = Options(
            upstreams=tuple(parse_upstream(u) for u in args.upstream or ()),
            listen=parse_address(args.listen, "--listen"),
            grpc_listen=parse_address(args.grpc_listen, "--grpc-listen"),
            admin=parse_address(args.admin, "--admin"),
            stats_listen=(
                parse_address(args.stats_listen, "--stats-listen") if args.stats_listen else None
            ),
            lb=args.lb,
            strict_dns=args.strict_dns,
            health_interval_s=args.health_interval_s,
            timeout_s=args.timeout_s,
            access_log=args.access_log,
            route_by_model=args.route_by_model,
            hash_lb=args.hash_lb,
        )
        text = render(options, args.format)
    except UpstreamError as exc:
        print(f"inferd envoy-config: {exc}", file=sys.stderr)
        return 2
    sys.stdout.write(text)
    return 0


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a number of seconds") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"'{text}' must be more than 0")
    return value


def add_parser(commands: Any) -> None:
    """Add ``envoy-config`` to the ``inferd`` command line."""
    parser = commands.add_parser(
        "envoy-config", help="print an Envoy v3 bootstrap balancing over inferd nodes"
    )
    parser.add_argument(
        "--upstream",
        action="append",
        metavar="HOST:HTTP_PORT:GRPC_PORT",
        help="an inferd node (repeat); a DNS name resolving to several nodes works too",
    )
    parser.add_argument("--listen", default="0.0.0.0:8080", help="HTTP listener (0.0.0.0:8080)")
    parser.add_argument(
        "--grpc-listen", default="0.0.0.0:8081", help="gRPC listener (0.0.0.0:8081)"
    )
    parser.add_argument("--admin", default="127.0.0.1:9901", help="admin (127.0.0.1:9901)")
    parser.add_argument(
        "--stats-listen",
        default="",
        metavar="ADDR:PORT",
        help="also serve the admin's /stats/prometheus and /ready here, and nothing else of it",
    )
    parser.add_argument(
        "--lb", choices=("round_robin", "least_request"), default="round_robin", help="balancing"
    )
    parser.add_argument(
        "--route-by-model",
        action="store_true",
        help="send each model's requests to the same node by consistent hashing (for lazy "
        "serving: a model loads on few nodes, not all): on the path for HTTP, on the "
        f"'{envoy_routing.MODEL_HEADER}' metadata header for gRPC; requests naming no model, "
        "and gRPC calls without the header, are balanced by --lb",
    )
    parser.add_argument(
        "--hash-lb",
        choices=envoy_routing.HASH_LBS,
        default="ring_hash",
        help="the consistent-hash balancer of --route-by-model (ring_hash)",
    )
    parser.add_argument(
        "--strict-dns",
        action="store_true",
        help="resolve upstream names to every address (a Kubernetes headless Service); "
        "implied by any upstream that is a name",
    )
    parser.add_argument(
        "--health-interval-s",
        type=_positive,
        default=5.0,
        help="seconds between health checks of each node (5)",
    )
    parser.add_argument(
        "--timeout-s",
        type=_positive,
        default=120.0,
        help="longest inference request, queue included (120)",
    )
    parser.add_argument(
        "--access-log", default="/dev/stdout", help="Envoy's access log file (/dev/stdout)"
    )
    parser.add_argument("--format", choices=("yaml", "json"), default="yaml", help="yaml")
    parser.set_defaults(func=_run)
