"""``routing.json`` beside a model's ``config.pbtxt``: the routing the API set, kept in the store.

The repository API writes the keys it changed (``labels``, ``traffic_split``, ``shadow``) here,
in the routing API's own JSON, and every server reading the store applies them on top of the
config's routing parameters, so replicas that share a store route alike. A key absent from
the file comes from the config; removing the file returns the model to its config's routing.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from inferd.core.errors import ConfigError, InvalidInput
from inferd.plane.routing import (
    RoutingPolicy,
    labels_from_mapping,
    policy_document,
    shadow_from_mapping,
    split_from_mapping,
)

ROUTING_FILE = "routing.json"
KEYS = ("labels", "traffic_split", "shadow")


def check_document(doc: Any, where: str) -> dict[str, Any]:
    """A routing document (InvalidInput naming what is wrong); values are kept as JSON."""
    if not isinstance(doc, dict):
        raise InvalidInput(f"{where} must be a JSON object")
    unknown = set(doc) - set(KEYS)
    if unknown:
        raise InvalidInput(f"{where}: unknown routing key(s) {sorted(unknown)}")
    overlay(RoutingPolicy(), doc, where)  # parses every value
    return dict(doc)


def overlay(policy: RoutingPolicy, doc: Mapping[str, Any], where: str) -> RoutingPolicy:
    """``policy`` with the keys of a routing document replacing its own."""
    for key in KEYS:
        if key not in doc:
            continue
        value = doc[key]
        if value is not None and not isinstance(value, dict):
            raise InvalidInput(f"{where}: '{key}' must be an object or null")
        part = f"{where}: {key}"
        if key == "labels":
            policy = replace(policy, labels=labels_from_mapping(value or {}, part))
        elif key == "traffic_split":
            policy = replace(policy, split=split_from_mapping(value or {}, part))
        else:
            shadow = None if value is None else shadow_from_mapping(value, part)
            policy = replace(policy, shadow=shadow)
    return policy


def document(policy: RoutingPolicy, keys: set[str]) -> dict[str, Any]:
    """The routing document holding ``keys`` of a policy."""
    full = policy_document(policy)
    return {key: full[key] for key in KEYS if key in keys}


def parse(data: bytes, where: str) -> dict[str, Any]:
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidInput(f"{where} is not valid JSON: {exc}") from None
    return check_document(doc, where)


def encode(doc: Mapping[str, Any]) -> bytes:
    return (json.dumps(dict(doc), indent=2, sort_keys=True) + "\n").encode()


def read_policy(folder: Path, policy: RoutingPolicy) -> RoutingPolicy:
    """The config's routing ``policy`` with the model folder's ``routing.json`` on top."""
    path = folder / ROUTING_FILE
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return policy
    except OSError as exc:
        raise ConfigError(f"cannot read {ROUTING_FILE}: {exc}") from None
    try:
        return overlay(policy, parse(data, ROUTING_FILE), ROUTING_FILE)
    except InvalidInput as exc:
        raise ConfigError(exc.message) from None
