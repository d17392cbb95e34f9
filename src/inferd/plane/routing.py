"""Version routing for one model: labels, a weighted traffic split and shadow copies.

Routing decides and counts; it never infers. The registry asks here which version number
serves a request that names a label or no version; the data plane asks here whether to mirror
a served request (a ``ShadowDecision``), runs the copy itself and reports how it went. Policies
come from config ``parameters`` (``version_labels``, ``traffic_split``, ``shadow``) and from
the repository API; the last change wins, whichever it came from.
"""

from __future__ import annotations

import logging
import math
import random
import re
import time
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from inferd.config.model_config_pb2 import ModelConfig
from inferd.core.errors import ConfigError, InvalidInput, NotFound
from inferd.core.types import Tensors

log = logging.getLogger("inferd.routing")

LABELS_PARAMETER = "version_labels"
SPLIT_PARAMETER = "traffic_split"
SHADOW_PARAMETER = "shadow"
ROUTING_PARAMETERS = (LABELS_PARAMETER, SPLIT_PARAMETER, SHADOW_PARAMETER)
SHADOW_MAX_IN_FLIGHT = 64  # shadow copies of one model running at once; more are skipped
SHADOW_LOG_INTERVAL_S = 10.0
_LABEL = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*\Z")


@dataclass(frozen=True, slots=True)
class ShadowPolicy:
    """Mirror ``fraction`` of the requests to ``target`` (a version number or a label)."""

    target: str
    fraction: float
    tolerance: float = 0.0  # largest absolute difference that still agrees (0: exact)


@dataclass(frozen=True, slots=True)
class RoutingPolicy:
    labels: Mapping[str, int] = field(default_factory=dict)
    # (version number or label, weight) for requests that name no version.
    split: tuple[tuple[str, float], ...] = ()
    shadow: ShadowPolicy | None = None


def shadow_document(shadow: ShadowPolicy | None) -> dict[str, Any] | None:
    """A shadow policy as the repository API and ``routing.json`` write it: the target is a
    version number or a label."""
    if shadow is None:
        return None
    target = shadow.target
    key: dict[str, Any] = {"version": int(target)} if target.isdecimal() else {"label": target}
    return key | {"fraction": shadow.fraction, "tolerance": shadow.tolerance}


def policy_document(policy: RoutingPolicy) -> dict[str, Any]:
    """A routing policy as the repository API and ``routing.json`` write it."""
    return {
        "labels": dict(sorted(policy.labels.items())),
        "traffic_split": dict(policy.split),
        "shadow": shadow_document(policy.shadow),
    }


# --------------------------------------------------------------------------- parsing


def check_label(label: Any, where: str) -> str:
    if not isinstance(label, str) or not _LABEL.match(label):
        raise InvalidInput(
            f"{where}: label {label!r} must start with a letter or '_' and hold only letters, "
            "digits, '_', '.', '-'"
        )
    return label


def check_version(value: Any, where: str) -> int:
    if isinstance(value, str) and value.isdecimal():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidInput(f"{where}: version {value!r} must be a positive integer")
    return value


def _target(value: Any, where: str) -> str:
    if isinstance(value, int) or (isinstance(value, str) and value.isdecimal()):
        return str(check_version(value, where))
    return check_label(value, where)


def _pairs(text: str, where: str) -> list[tuple[str, str]]:
    pairs = []
    for item in (p.strip() for p in text.split(",")):
        if not item:
            continue
        key, sep, value = item.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise InvalidInput(f"{where}: '{item}' is not KEY=VALUE")
        pairs.append((key.strip(), value.strip()))
    return pairs


def labels_from_mapping(value: Mapping[str, Any], where: str) -> dict[str, int]:
    return {check_label(k, where): check_version(v, f"{where} '{k}'") for k, v in value.items()}


def split_from_mapping(value: Mapping[str, Any], where: str) -> tuple[tuple[str, float], ...]:
    split = []
    for key, weight in value.items():
        target = _target(key, where)
        if isinstance(weight, str):
            try:
                weight = float(weight)
            except ValueError:
                raise InvalidInput(f"{where}: weight of '{key}' is not a number") from None
        if isinstance(weight, bool) or not isinstance(weight, int | float):
            raise InvalidInput(f"{where}: weight of '{key}' is not a number")
        if not math.isfinite(weight) or weight < 0:
            raise InvalidInput(f"{where}: weight of '{key}' must be a number >= 0")
        split.append((target, float(weight)))
    if split and sum(w for _, w in split) <= 0:
        raise InvalidInput(f"{where}: the weights add up to 0")
    return tuple(split)


def shadow_from_mapping(value: Mapping[str, Any], where: str) -> ShadowPolicy:
    unknown = set(value) - {"version", "label", "fraction", "tolerance"}
    if unknown:
        raise InvalidInput(f"{where}: unknown key(s) {sorted(unknown)}")
    if ("version" in value) == ("label" in value):
        raise InvalidInput(f"{where}: give exactly one of 'version' or 'label'")
    target = (
        str(check_version(value["version"], where))
        if "version" in value
        else check_label(value["label"], where)
    )
    numbers = {}
    for key, default in (("fraction", 1.0), ("tolerance", 0.0)):
        raw = value.get(key, default)
        try:
            number = float(raw)
        except (TypeError, ValueError):
            raise InvalidInput(f"{where}: {key} {raw!r} is not a number") from None
        if isinstance(raw, bool) or not math.isfinite(number) or number < 0:
            raise InvalidInput(f"{where}: {key} must be a number >= 0")
        numbers[key] = number
    if numbers["fraction"] > 1:
        raise InvalidInput(f"{where}: fraction must be between 0 and 1")
    return ShadowPolicy(target, numbers["fraction"], numbers["tolerance"])


def routing_fields(doc: Mapping[str, Any]) -> dict[str, Any]:
    """A routing document's changes (any of labels, traffic_split and shadow; a null shadow
    clears it) as ``RoutingPolicy`` fields; InvalidInput naming what is wrong."""
    unknown = set(doc) - {"labels", "traffic_split", "shadow"}
    if unknown:
        raise InvalidInput(f"unknown routing key(s) {sorted(unknown)}")
    fields: dict[str, Any] = {}
    if "labels" in doc:
        fields["labels"] = labels_from_mapping(_mapping(doc["labels"], "labels"), "labels")
    if "traffic_split" in doc:
        fields["split"] = split_from_mapping(
            _mapping(doc["traffic_split"], "traffic_split"), "traffic_split"
        )
    if "shadow" in doc:
        value = doc["shadow"]
        fields["shadow"] = (
            None if value is None else shadow_from_mapping(_mapping(value, "shadow"), "shadow")
        )
    return fields


def with_labels(policy: RoutingPolicy, updates: Mapping[str, int | None]) -> RoutingPolicy:
    """``policy`` with each label set to its version, or removed where None."""
    labels = dict(policy.labels)
    for label, number in updates.items():
        if number is None:
            labels.pop(label, None)
        else:
            labels[label] = number
    return replace(policy, labels=labels)


def _mapping(value: Any, what: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidInput(f"'{what}' must be an object")
    return value


def policy_from_config(config: ModelConfig) -> RoutingPolicy:
    """The routing parameters of a config; a malformed one is a ConfigError naming it."""
    params = config.parameters
    try:
        labels: dict[str, int] = {}
        if LABELS_PARAMETER in params:
            text = params[LABELS_PARAMETER].string_value
            labels = labels_from_mapping(dict(_pairs(text, LABELS_PARAMETER)), LABELS_PARAMETER)
        split: tuple[tuple[str, float], ...] = ()
        if SPLIT_PARAMETER in params:
            text = params[SPLIT_PARAMETER].string_value
            split = split_from_mapping(dict(_pairs(text, SPLIT_PARAMETER)), SPLIT_PARAMETER)
        shadow = None
        if SHADOW_PARAMETER in params:
            text = params[SHADOW_PARAMETER].string_value
            shadow = shadow_from_mapping(dict(_pairs(text, SHADOW_PARAMETER)), SHADOW_PARAMETER)
    except InvalidInput as exc:
        raise ConfigError(f"parameters: {exc.message}") from None
    return RoutingPolicy(labels, split, shadow)


# --------------------------------------------------------------------------- shadow results


def compare(primary: Tensors, shadow: Tensors, tolerance: float) -> tuple[bool, float]:
    """Whether two answers agree, and their largest absolute difference (inf: not comparable)."""
    if primary.keys() != shadow.keys():
        return False, math.inf
    worst = 0.0
    for name, a in primary.items():
        b = shadow[name]
        if a.shape != b.shape:
            return False, math.inf
        if a.dtype.kind not in "iufb" or b.dtype.kind not in "iufb":
            if not np.array_equal(a, b):
                return False, math.inf
            continue
        if a.size:
            diff = np.abs(a.astype(np.float64) - b.astype(np.float64))
            both_nan = np.isnan(diff) & np.isnan(a.astype(np.float64))
            worst = max(worst, float(np.max(np.where(both_nan, 0.0, diff))))
    if math.isnan(worst):
        return False, math.inf
    return worst <= tolerance, worst


@dataclass(slots=True)
class ShadowStats:
    sent: int = 0
    agreed: int = 0
    disagreed: int = 0
    failed: int = 0  # the shadow version answered an error
    skipped: int = 0  # not sent: SHADOW_MAX_IN_FLIGHT copies were already running
    max_abs_diff: float = 0.0  # over the answers that could be compared


# --------------------------------------------------------------------------- views


@dataclass(frozen=True, slots=True)
class ShadowCounts:
    """A snapshot of ``ShadowStats`` (``max_abs_diff`` None: nothing could be compared)."""

    sent: int
    agreed: int
    disagreed: int
    failed: int
    skipped: int
    max_abs_diff: float | None


@dataclass(frozen=True, slots=True)
class RoutingView:
    """A model's routing, read only: labels, split, shadow policy and the shadow counts."""

    name: str
    labels: Mapping[str, int]
    traffic_split: tuple[tuple[str, float], ...]
    shadow: ShadowPolicy | None
    shadow_stats: ShadowCounts


def routing_document(view: RoutingView) -> dict[str, Any]:
    """A model's routing as the repository API and the dashboard write it, with its shadow
    counts."""
    policy = RoutingPolicy(view.labels, view.traffic_split, view.shadow)
    return {"name": view.name, **policy_document(policy), "shadow_stats": view.shadow_stats}


# --------------------------------------------------------------------------- per-model state


def request_unit(request_id: str) -> float:
    """A number in [0, 1): a stable hash of the request id (CRC-32, which spreads sequential
    ids as evenly as a cryptographic hash for this purpose), or random without an id."""
    if not request_id:
        return random.random()
    return zlib.crc32(request_id.encode("utf-8")) / 2.0**32


Ready = Callable[[int], bool]  # whether a version number is loaded and READY


@dataclass(frozen=True, slots=True)
class ShadowDecision:
    """Mirror this request to ``version``; report the outcome with ``ModelRouting.shadowed``."""

    version: int
    policy: ShadowPolicy
    stats: ShadowStats  # the counts current when the copy was decided


class ModelRouting:
    """The routing state of one model name; it outlives reloads of the model."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.policy = RoutingPolicy()
        # The split with labels resolved to version numbers, and its total weight.
        self._split: tuple[tuple[int | None, float], ...] = ()
        self._split_total = 0.0
        self.splits = False  # whether a traffic split is set (read per request)
        self.shadow_stats = ShadowStats()
        self._from_config: RoutingPolicy | None = None
        self.shadows_in_flight = 0
        self._last_log_s = 0.0

    def apply_config(self, policy: RoutingPolicy) -> None:
        """Take the config's policy when it differs from the config's last one."""
        if policy != self._from_config:
            self._from_config = policy
            self.set(policy)

    def set(self, policy: RoutingPolicy) -> None:
        if policy.shadow != self.policy.shadow:
            self.shadow_stats = ShadowStats()
        self.policy = policy
        self._split = tuple((self.version_of(t), w) for t, w in policy.split if w > 0)
        self._split_total = sum(w for _, w in self._split)
        self.splits = bool(self._split)

    def set_labels(self, changes: Mapping[str, int | None]) -> dict[str, int]:
        labels = dict(self.policy.labels)
        for label, version in changes.items():
            if version is None:
                labels.pop(label, None)
            else:
                labels[label] = version
        self.set(replace(self.policy, labels=labels))
        return labels

    def version_of(self, target: str) -> int | None:
        return int(target) if target.isdecimal() else self.policy.labels.get(target)

    def label_version(self, label: str) -> int:
        number = self.policy.labels.get(label)
        if number is None:
            raise NotFound(f"model '{self.name}' has no version label '{label}'")
        return number

    def split_choice(self, request_id: str, ready: Ready) -> int | None:
        """The version number the traffic split picks (None: no split, or none of it ready)."""
        if not self._split:
            return None
        unit = request_unit(request_id)
        point = unit * self._split_total
        for number, weight in self._split:  # the usual case: every target is ready
            point -= weight
            if point < 0:
                if number is not None and ready(number):
                    return number
                break
        return self._split_among_ready(unit, ready)

    def _split_among_ready(self, unit: float, ready: Ready) -> int | None:
        choices = [
            (number, weight)
            for target, weight in self.policy.split
            if weight > 0 and (number := self.version_of(target)) is not None and ready(number)
        ]
        if not choices:
            return None
        point = unit * sum(w for _, w in choices)
        for number, weight in choices:
            point -= weight
            if point < 0:
                return number
        return choices[-1][0]

    # ------------------------------------------------------------------ shadow copies

    def shadow(self, primary: int, ready: Ready) -> ShadowDecision | None:
        """Whether to mirror a request ``primary`` served, and to which version."""
        policy = self.policy.shadow
        if policy is None or random.random() >= policy.fraction:
            return None
        target = self.version_of(policy.target)
        if target is None or target == primary or not ready(target):
            return None
        if self.shadows_in_flight >= SHADOW_MAX_IN_FLIGHT:
            self.shadow_stats.skipped += 1
            return None
        self.shadows_in_flight += 1
        self.shadow_stats.sent += 1
        return ShadowDecision(target, policy, self.shadow_stats)

    def shadowed(
        self, decision: ShadowDecision, expected: Tensors, answer: Tensors | BaseException
    ) -> None:
        """Count how a shadow copy went: its answer (compared with ``expected``) or its error."""
        self.shadows_in_flight -= 1
        stats, policy = decision.stats, decision.policy
        if isinstance(answer, BaseException):
            stats.failed += 1
            log.debug(
                "shadow copy to model '%s' v%d failed: %s", self.name, decision.version, answer
            )
        else:
            agreed, diff = compare(expected, answer, policy.tolerance)
            if agreed:
                stats.agreed += 1
            else:
                stats.disagreed += 1
                log.debug(
                    "shadow v%d of model '%s' disagrees with the primary (max |diff| %g)",
                    decision.version,
                    self.name,
                    diff,
                )
            if math.isfinite(diff):
                stats.max_abs_diff = max(stats.max_abs_diff, diff)
        now = time.monotonic()
        if now - self._last_log_s >= SHADOW_LOG_INTERVAL_S:
            self._last_log_s = now
            log.info(
                "shadow v%d of model '%s': %d sent, %d agreed, %d disagreed, %d failed "
                "(tolerance %g, max |diff| %g)",
                decision.version,
                self.name,
                stats.sent,
                stats.agreed,
                stats.disagreed,
                stats.failed,
                policy.tolerance,
                stats.max_abs_diff,
            )

    def view(self) -> RoutingView:
        stats = self.shadow_stats
        return RoutingView(
            name=self.name,
            labels=dict(sorted(self.policy.labels.items())),
            traffic_split=self.policy.split,
            shadow=self.policy.shadow,
            shadow_stats=ShadowCounts(
                stats.sent,
                stats.agreed,
                stats.disagreed,
                stats.failed,
                stats.skipped,
                stats.max_abs_diff if math.isfinite(stats.max_abs_diff) else None,
            ),
        )
