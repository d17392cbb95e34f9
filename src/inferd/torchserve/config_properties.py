"""TorchServe's ``config.properties`` (``--ts-config``): the keys inferd honours, as settings.

A key applies where the command line (or environment) left the setting at its default; keys
inferd does not honour are logged once, by name. The file is Java's properties format:
``key=value`` (or ``key: value``) lines, ``#`` and ``!`` comments.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from inferd.core.errors import ConfigError

log = logging.getLogger("inferd.torchserve")

# Keys with no effect in inferd that a TorchServe config commonly holds, quietly accepted.
IGNORED = frozenset(
    {
        "disable_token_authorization",  # inferd has no tokens unless --auth-token/--admin-token
        "install_py_dep_per_model",  # requirements are reported, never installed
        "number_of_netty_threads",
        "netty_client_threads",
        "async_logging",
        "vmargs",
        "metrics_mode",
        "enable_envvars_config",
    }
)


def parse(text: str) -> dict[str, str]:
    """``key=value`` pairs of a properties file (the last of a key wins)."""
    found: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#!":
            continue
        positions = [p for p in (line.find("="), line.find(":")) if p > 0]
        if not positions:
            found[line] = ""
            continue
        cut = min(positions)
        found[line[:cut].strip()] = line[cut + 1 :].strip()
    return found


def _address(value: str, key: str) -> tuple[str, int]:
    parts = urlsplit(value if "://" in value else f"http://{value}")
    if parts.port is None or parts.hostname is None:
        raise ConfigError(f"--ts-config: {key}={value} needs a host and a port")
    if parts.scheme == "https":
        log.warning(
            "--ts-config: %s is https: inferd serves TLS with --tls-cert and --tls-key", key
        )
    return parts.hostname, parts.port


def _true(value: str) -> bool:
    return value.strip().lower() == "true"


def settings_from(properties: dict[str, str]) -> dict[str, Any]:
    """The settings a properties file asks for, by Settings field name."""
    changes: dict[str, Any] = {}
    unknown: list[str] = []
    for key, value in properties.items():
        if key == "inference_address":
            changes["http_address"], changes["torchserve_inference_port"] = _address(value, key)
        elif key == "management_address":
            address, changes["torchserve_management_port"] = _address(value, key)
            changes["torchserve_management_address"] = address
        elif key == "grpc_inference_port":
            changes["torchserve_grpc_inference_port"] = int(value)
        elif key == "grpc_management_port":
            changes["torchserve_grpc_management_port"] = int(value)
        elif key == "grpc_inference_address":
            changes["grpc_address"] = value
        elif key == "grpc_management_address":
            changes["torchserve_management_address"] = value
        elif key == "model_store":
            changes["model_store"] = value
        elif key == "load_models":
            changes["models"] = [m.strip() for m in value.split(",") if m.strip()]
        elif key == "default_workers_per_model":
            changes["default_workers_per_model"] = int(value)
        elif key == "allowed_urls":
            changes["allowed_urls"] = [u.strip() for u in value.split(",") if u.strip()]
        elif key == "enable_model_api":
            changes["enable_model_api"] = _true(value)
        elif key == "max_request_size":
            changes["http_max_body_bytes"] = int(value)
        elif key == "cors_allowed_origin":
            changes["cors_allow_origin"] = [value]
        elif key == "metrics_address" or key in IGNORED:
            continue
        else:
            unknown.append(key)
    if unknown:
        log.warning(
            "--ts-config: inferd does not honour %s (docs/torchserve.md lists the keys it does)",
            ", ".join(sorted(unknown)),
        )
    return changes


def apply(settings: Any, path: str) -> Any:
    """``settings`` with the file's keys applied where the setting is still its default."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"--ts-config {path}: {exc}") from None
    try:
        changes = settings_from(parse(text))
    except ValueError as exc:
        raise ConfigError(f"--ts-config {path}: {exc}") from None
    defaults = {f.name: f for f in dataclasses.fields(settings)}
    kept: dict[str, Any] = {}
    for name, value in changes.items():
        field = defaults[name]
        default = (
            field.default_factory()
            if field.default_factory is not dataclasses.MISSING
            else field.default
        )
        if getattr(settings, name) == default:
            kept[name] = value
    return dataclasses.replace(settings, **kept)
