"""A TorchServe model version's front-end settings, as TorchServe resolves them.

From lowest to highest: TorchServe's defaults, the archive's ``model-config.yaml``
(``batchSize``, ``maxBatchDelay``, ``minWorkers``/``maxWorkers``, ``responseTimeout``,
``startupTimeout``, ``deviceType``), then the version folder's ``torchserve.json``: what a
registration asked for (``batch_size``, ``max_batch_delay``, ``initial_workers`` as
``min_workers``/``max_workers``, ``response_timeout``, ``handler``, the archive's ``url``),
written by the management API or by hand. The resolved settings travel in the completed
config's parameters (``torchserve_*``), which the TorchServe frontends read back.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from inferd.backends.torchserve.archive import Manifest
from inferd.core.errors import ConfigError

REGISTRATION_FILE = "torchserve.json"
TORCHSERVE_VERSION = "0.12.0"  # the TorchServe whose interfaces inferd answers
# Request parameters carrying what a TorchServe request has beside its values: each value's
# parameter name and content type, and the request's headers.
NAMES = "torchserve_names"
TYPES = "torchserve_types"
HEADERS = "torchserve_headers"
PARAMETER_PREFIX = "torchserve_"
DEFAULT_BATCH_SIZE = 1
DEFAULT_MAX_BATCH_DELAY_MS = 100
DEFAULT_RESPONSE_TIMEOUT_S = 120
DEFAULT_STARTUP_TIMEOUT_S = 120


@dataclass(frozen=True, slots=True)
class VersionSettings:
    """What TorchServe's describe reports of a version, and what serving it follows."""

    model_version: str = "1.0"
    url: str = ""
    runtime: str = "python"
    handler: str = ""
    batch_size: int = DEFAULT_BATCH_SIZE
    max_batch_delay: int = DEFAULT_MAX_BATCH_DELAY_MS  # ms
    min_workers: int = 1
    max_workers: int = 1
    response_timeout: int = DEFAULT_RESPONSE_TIMEOUT_S  # s
    startup_timeout: int = DEFAULT_STARTUP_TIMEOUT_S  # s
    device_type: str = "cpu"
    loaded_at_startup: bool = False
    streaming: bool = False  # the handler sends intermediate answers

    def parameters(self) -> dict[str, str]:
        """As config parameters (string values)."""
        return {f"{PARAMETER_PREFIX}{k}": _text(v) for k, v in asdict(self).items()}

    @classmethod
    def from_parameters(cls, parameters: dict[str, str]) -> VersionSettings:
        """Back from config parameters (absent keys keep their defaults)."""
        values: dict[str, Any] = {}
        for f in fields(cls):
            raw = parameters.get(f"{PARAMETER_PREFIX}{f.name}")
            if raw is None:
                continue
            if f.type == "int":
                values[f.name] = int(raw)
            elif f.type == "bool":
                values[f.name] = raw == "true"
            else:
                values[f.name] = raw
        return cls(**values)


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def read_registration(version_dir: Path) -> dict[str, Any]:
    """The version folder's ``torchserve.json`` ({} when there is none)."""
    path = version_dir / REGISTRATION_FILE
    if not path.is_file():
        return {}
    try:
        doc = json.loads(path.read_bytes())
    except ValueError as exc:
        raise ConfigError(f"{path} is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"{path} must be a JSON object")
    return doc


def _positive(doc: dict[str, Any], key: str, where: str) -> int | None:
    value = doc.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{where}: '{key}' must be an integer, not {value!r}")
    return value if value > 0 else None


def resolve(
    manifest: Manifest,
    model_yaml: dict[str, Any],
    registration: dict[str, Any],
    where: str,
) -> VersionSettings:
    """The version's settings: TorchServe's defaults < model-config.yaml < torchserve.json."""
    settings = VersionSettings(
        model_version=manifest.model_version,
        runtime=manifest.runtime,
        handler=manifest.handler,
    )
    yaml_where = f"{where} model-config.yaml"
    batch = _positive(model_yaml, "batchSize", yaml_where)
    delay = _positive(model_yaml, "maxBatchDelay", yaml_where)
    low = _positive(model_yaml, "minWorkers", yaml_where)
    high = _positive(model_yaml, "maxWorkers", yaml_where)
    response = _positive(model_yaml, "responseTimeout", yaml_where)
    startup = _positive(model_yaml, "startupTimeout", yaml_where)
    device = model_yaml.get("deviceType")
    changes: dict[str, Any] = {}
    if batch:
        changes["batch_size"] = batch
    if delay:
        changes["max_batch_delay"] = delay
    if low and (high or 0) >= low:  # TorchServe takes the pair only when it is consistent
        changes["min_workers"], changes["max_workers"] = low, high
    if response:
        changes["response_timeout"] = response
    if startup:
        changes["startup_timeout"] = startup
    if isinstance(device, str) and device:
        changes["device_type"] = device.lower()
    settings = replace(settings, **changes)
    reg_where = f"{where} {REGISTRATION_FILE}"
    changes = {}
    for key in ("batch_size", "max_batch_delay", "min_workers", "max_workers"):
        value = _positive(registration, key, reg_where)
        if value:
            changes[key] = value
    # A timeout in model-config.yaml wins over the registration's, as in TorchServe.
    for key, from_yaml in (("response_timeout", response), ("startup_timeout", startup)):
        value = _positive(registration, key, reg_where)
        if value and not from_yaml:
            changes[key] = value
    for key in ("url", "handler"):
        value = registration.get(key)
        if isinstance(value, str) and value:
            changes[key] = value
    # A hand-placed archive (no registration) is the repository's from the start.
    changes["loaded_at_startup"] = registration.get("loaded_at_startup", not registration) is True
    settings = replace(settings, **changes)
    if settings.max_workers < settings.min_workers:
        settings = replace(settings, max_workers=settings.min_workers)
    if not settings.handler:
        raise ConfigError(f"{where}: the manifest names no handler")
    return settings
