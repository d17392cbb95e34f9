"""Where Settings come from: command-line flags (Triton's names), ``INFERD_*`` environment
variables, and keyword arguments in Python (``inferd.Server(model_repository=...)``).

Precedence: a flag given on the command line, then the environment, then the default. Every
field's flag is ``--field-name`` and its variable ``INFERD_FIELD_NAME``.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import os
import textwrap
from collections.abc import Mapping, Sequence
from typing import Any

from inferd.app.settings import Settings
from inferd.core.errors import ConfigError

_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}


def parse_size(text: str, flag: str) -> int:
    """A size in bytes: a number, or one with a unit as Kubernetes writes them (K, M, G, T:
    powers of 1000; Ki, Mi, Gi, Ti: powers of 1024; a trailing B is allowed): ``8Gi``."""
    raw = text.strip()
    body = raw[:-1] if raw[-1:] in ("B", "b") else raw
    binary = body[-1:] in ("i", "I")
    if binary:
        body = body[:-1]
    unit = body[-1:].lower() if body[-1:].isalpha() else ""
    number = body[: len(body) - len(unit)].strip()
    if unit not in _UNITS or (binary and not unit):
        raise ConfigError(f"{flag}: '{text}' is not a size (bytes, or 8Gi, 10G...)")
    try:
        value = float(number)
    except ValueError:
        raise ConfigError(f"{flag}: '{text}' is not a size (bytes, or 8Gi, 10G...)") from None
    scale = 1024 ** " kmgt".index(unit or " ") if binary else _UNITS[unit]
    if not 0 <= value < 2**63 / scale:  # also NaN and infinity
        raise ConfigError(f"{flag}: '{text}' is not a size of 0 bytes or more")
    return int(value * scale)


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


# ``inferd serve --help`` and the generated reference list the flags by topic, in this order.
TOPICS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "models and repository",
        (
            "model_repository",
            "model_name",
            "load_model",
            "model_control_mode",
            "repository_poll_secs",
            "repository_unload_max_fraction",
            "repository_unload_grace_s",
            "strict_readiness",
            "exit_on_error",
            "disable_auto_complete_config",
            "default_max_batch_size",
        ),
    ),
    (
        "lazy serving and model cache",
        (
            "model_memory_budget",
            "max_loaded_models",
            "pin_model",
            "model_cache_dir",
            "model_cache_max_bytes",
        ),
    ),
    (
        "S3 repositories",
        (
            "s3_endpoint_url",
            "s3_access_key_id",
            "s3_secret_access_key",
            "s3_region",
            "s3_addressing_style",
        ),
    ),
    ("HTTP", ("http_address", "http_port", "server_name")),
    (
        "gRPC",
        (
            "allow_grpc",
            "grpc_address",
            "grpc_port",
            "grpc_server",
            "grpc_max_message_bytes",
            "tfserving_tensor_content",
        ),
    ),
    (
        "serving processes",
        (
            "http_workers",
            "http_workers_copy_bytes",
            "gil_switch_interval_us",
            "gc_threshold",
            "drain_timeout_s",
        ),
    ),
    ("scheduling", ("rate_limit", "rate_limit_resource", "cache_size")),
    (
        "logging and tracing",
        (
            "log_verbose",
            "log_format",
            "log_file",
            "log_max_bytes",
            "log_backup_count",
            "access_log",
            "access_log_file",
            "node_name",
            "trace_exporter",
            "trace_endpoint",
        ),
    ),
    (
        "metrics and dashboard",
        (
            "allow_metrics",
            "metrics_port",
            "allow_dashboard",
            "dashboard_port",
            "envoy_admin",
            "dashboard_trace_url",
        ),
    ),
    (
        "authentication and access",
        (
            "auth_token",
            "admin_token",
            "auth_token_file",
            "admin_token_file",
            "auth_health",
            "auth_metrics",
            "allow_unauthenticated_admin",
            "cors_allow_origin",
            "allowed_hosts",
        ),
    ),
    ("code that models may run", ("allow_pickle", "allow_python_models", "allow_unsafe_ops")),
    (
        "TLS",
        (
            "tls_cert",
            "tls_key",
            "tls_client_ca",
            "grpc_use_ssl",
            "grpc_server_cert",
            "grpc_server_key",
            "grpc_root_cert",
            "grpc_use_ssl_mutual",
        ),
    ),
    (
        "HTTP connection limits",
        (
            "http_max_connections",
            "http_header_timeout_s",
            "http_body_timeout_s",
            "http_max_header_bytes",
            "http_max_body_bytes",
            "http_min_body_rate_bytes",
        ),
    ),
    (
        "gRPC connection limits",
        (
            "grpc_max_concurrent_streams",
            "grpc_max_header_list_bytes",
            "grpc_header_timeout_s",
            "grpc_body_timeout_s",
            "grpc_idle_timeout_s",
            "grpc_keepalive_time",
            "grpc_keepalive_timeout",
            "grpc_keepalive_permit_without_calls",
            "grpc_http2_min_recv_ping_interval_without_data",
            "grpc_http2_max_ping_strikes",
        ),
    ),
    (
        "load limits",
        (
            "max_inflight_requests",
            "max_inflight_bytes",
            "max_upload_bytes",
            "max_concurrent_uploads",
        ),
    ),
    (
        "TorchServe APIs",
        (
            "allow_torchserve",
            "model_store",
            "models",
            "torchserve_inference_port",
            "torchserve_management_port",
            "torchserve_management_address",
            "torchserve_grpc_inference_port",
            "torchserve_grpc_management_port",
            "enable_model_api",
            "default_workers_per_model",
            "ts_config",
            "allowed_urls",
        ),
    ),
)
_OTHER_TOPIC = "other settings"
_MIB = 1 << 20


def default_text(name: str) -> str:
    """A Settings field's default as its flag writes it (``8080``, ``true``, ``134217728``
    (128 MiB)); empty where there is none to show: an empty text or list, or one computed where
    the server runs (the host name), which the help text tells."""
    f = next((f for f in dataclasses.fields(Settings) if f.name == name), None)
    if f is None or f.default is dataclasses.MISSING or f.default in ("", None):
        return ""
    value = f.default
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int) and value >= _MIB and value % _MIB == 0:
        return f"{value} ({value // _MIB} MiB)"
    return str(value)


class HelpFormatter(argparse.HelpFormatter):
    """``inferd serve --help``: each flag's help ends with its default and its variable,
    ``(default: 8080; env INFERD_HTTP_PORT)``; a flag and its value fit the first column."""

    def __init__(self, prog: str, **kwargs: Any) -> None:
        kwargs.setdefault("max_help_position", 34)
        super().__init__(prog, **kwargs)

    def _split_lines(self, text: str, width: int) -> list[str]:
        """Wrapped between words only: a flag named in the text stays whole."""
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help
        default = default_text(action.dest)
        if not text or not default or not text.endswith(")") or " (env " not in text:
            return text
        head, env = text.rsplit(" (env ", 1)
        return f"{head} (default: {default.replace('%', '%%')}; env {env}"


def _topics() -> list[tuple[str, list[dataclasses.Field[Any]]]]:
    """The fields by topic, in ``TOPICS`` order; a field no topic names comes last."""
    by_name = {f.name: f for f in dataclasses.fields(Settings)}
    topics = [(title, [by_name[n] for n in names if n in by_name]) for title, names in TOPICS]
    named = {n for _, names in TOPICS for n in names}
    rest = [f for f in dataclasses.fields(Settings) if f.name not in named]
    return topics + ([(_OTHER_TOPIC, rest)] if rest else [])


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Every Settings field as a flag, in one argument group per topic."""
    for title, fields in _topics():
        group = parser.add_argument_group(title)
        for f in fields:
            _add_field(group, f)


def _add_field(group: argparse._ArgumentGroup, f: dataclasses.Field[Any]) -> None:
    meta = f.metadata
    env = _env(f.name)
    help_text = f"{meta['help']} (env {env})"
    value = "N" if f.type in ("int", "float") else "VALUE"
    if f.type == "bool":
        group.add_argument(
            _flag(f.name),
            dest=f.name,
            nargs="?",
            const="true",
            default=None,
            metavar="BOOL",
            help=help_text,
        )
    elif "const" in meta:  # a value, or the bare flag meaning ``const``
        group.add_argument(
            _flag(f.name),
            dest=f.name,
            nargs="?",
            const=meta["const"],
            default=None,
            metavar=value,
            help=help_text,
        )
    elif meta.get("many"):  # several values after one flag, as TorchServe's --models
        group.add_argument(
            _flag(f.name),
            dest=f.name,
            action="extend",
            nargs="+",
            default=None,
            metavar=value,
            help=help_text,
        )
    elif meta.get("repeat"):
        group.add_argument(
            _flag(f.name),
            dest=f.name,
            action="append",
            default=None,
            metavar=value,
            help=help_text,
        )
    else:
        group.add_argument(_flag(f.name), dest=f.name, default=None, metavar=value, help=help_text)


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
    parser = argparse.ArgumentParser(
        prog="inferd serve", allow_abbrev=False, formatter_class=HelpFormatter
    )
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
