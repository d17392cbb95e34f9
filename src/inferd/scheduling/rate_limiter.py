"""Triton's rate limiter: which model instance may execute next, across every model.

With ``--rate-limit execution_count`` an instance group may declare ``rate_limiter { resources
[...] priority: N }``. An instance executes only when every resource it asks for is free: the
resources are held for the execution and released after it. Instances waiting for resources are
*staged*; the one with the lowest ``executions x priority`` goes first (priority 0 counts as 1),
so an instance of priority 2 gets half the turns of one of priority 1 (Triton's weighted round
robin). A staged instance that does not fit waits at the head: nothing behind it overtakes it.

A resource is per device (a CPU instance is on device 0) unless one instance declares it
``global``; declaring it both ways is a load error. How many copies exist: ``--rate-limit-resource
NAME:COUNT[:DEVICE]`` (without DEVICE: on every device; a global resource takes the largest count
given for it), else the most any one loaded instance asks for. A count given that is smaller
than an instance's ask fails that model's load, naming the resource.

``RateLimiter`` is the one per process (the model host, where every model runs); it is driven on
the event loop, except ``register`` / ``unregister``, which loads call from their threads.
``inferd.scheduling.limited`` puts a model version's instances behind it.
"""

from __future__ import annotations

import heapq
import itertools
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from inferd.config.model_config_pb2 import ModelInstanceGroup
from inferd.core.errors import ConfigError
from inferd.core.stats import Duration

GLOBAL = -1  # the device key of a global resource
MODES = ("off", "execution_count")

# (device or GLOBAL, resource name) -> count
Counts = dict[tuple[int, str], int]


@dataclass(frozen=True, slots=True)
class Ask:
    """What one instance asks of the limiter: resources by (device or GLOBAL, name), and its
    priority (at least 1)."""

    resources: tuple[tuple[tuple[int, str], int], ...] = ()
    priority: int = 1


@dataclass(frozen=True, slots=True)
class ExplicitResource:
    """One ``--rate-limit-resource``: ``device`` None means every device."""

    name: str
    count: int
    device: int | None = None


def parse_resource(text: str) -> ExplicitResource:
    """``NAME:COUNT`` or ``NAME:COUNT:DEVICE`` (Triton's ``--rate-limit-resource``)."""
    parts = text.split(":")
    usage = f"--rate-limit-resource takes NAME:COUNT or NAME:COUNT:DEVICE, got '{text}'"
    if len(parts) not in (2, 3) or not parts[0].strip():
        raise ConfigError(usage)
    try:
        count = int(parts[1])
        device = int(parts[2]) if len(parts) == 3 else None
    except ValueError:
        raise ConfigError(usage) from None
    if count < 0 or (device is not None and device < 0):
        raise ConfigError(f"{usage}: counts and devices are 0 or more")
    return ExplicitResource(parts[0].strip(), count, device)


def asks_of(groups: Sequence[tuple[ModelInstanceGroup, Sequence[int]]]) -> list[Ask] | None:
    """Each instance's ask, from its instance group and its device (``groups``: each group with
    the devices of its instances, in order); None when no group declares a ``rate_limiter``
    (the instances are not limited at all)."""
    if not any(g.HasField("rate_limiter") for g, _ in groups):
        return None
    asks: list[Ask] = []
    for group, devices in groups:
        limiter = group.rate_limiter
        for device in devices:
            wanted: dict[tuple[int, str], int] = {}
            for resource in limiter.resources:
                if not resource.name:
                    raise ConfigError("instance_group rate_limiter: a resource has no name")
                key = (GLOBAL if getattr(resource, "global") else device, resource.name)
                wanted[key] = max(wanted.get(key, 0), resource.count)
            asks.append(Ask(tuple(sorted(wanted.items())), max(1, limiter.priority)))
    return asks


class Slot:
    """One limited instance as the limiter sees it: its ask, its executions, and what runs
    when it is granted its resources (``on_grant``)."""

    __slots__ = ("ask", "executions", "on_grant")

    def __init__(self, ask: Ask, on_grant: Callable[[Slot], None]) -> None:
        self.ask = ask
        self.executions = 0
        self.on_grant = on_grant

    @property
    def scaled_priority(self) -> int:
        return self.executions * self.ask.priority


@dataclass(slots=True)
class _Registered:
    label: str
    slots: list[Slot]


@dataclass(slots=True)
class RateLimiter:
    """The process's resources, who holds them, and the instances waiting for them."""

    explicit: Sequence[ExplicitResource] = ()
    limits: Counts = field(default_factory=dict)
    allocated: Counts = field(default_factory=dict)
    waits: dict[str, Duration] = field(default_factory=dict)  # model label -> time waited
    _models: dict[int, _Registered] = field(default_factory=dict)
    _staged: list[tuple[int, int, Slot]] = field(default_factory=list)
    _order: itertools.count[int] = field(default_factory=itertools.count)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    # ------------------------------------------------------------------ loading

    def check(self, label: str, asks: Sequence[Ask]) -> None:
        """ConfigError when ``asks`` could never run beside what is registered."""
        with self._lock:
            self._limits(label, [s.ask for m in self._models.values() for s in m.slots] + [*asks])

    def register(
        self, label: str, asks: Sequence[Ask], on_grant: Callable[[Slot], None]
    ) -> list[Slot]:
        """Add a model version's instances (ConfigError, and nothing added, when the
        resources cannot ever let one of them run)."""
        slots = [Slot(ask, on_grant) for ask in asks]
        with self._lock:
            asked = [s.ask for m in self._models.values() for s in m.slots] + list(asks)
            self.limits = self._limits(label, asked)
            self._models[id(slots)] = _Registered(label, slots)
            self.waits.setdefault(label, Duration())
        return slots

    def unregister(self, slots: list[Slot]) -> None:
        with self._lock:
            gone = self._models.pop(id(slots), None)
            if gone is None:
                return
            if not any(m.label == gone.label for m in self._models.values()):
                self.waits.pop(gone.label, None)
            asked = [s.ask for m in self._models.values() for s in m.slots]
            self.limits = self._limits(gone.label, asked)

    def _limits(self, label: str, asked: Iterable[Ask]) -> Counts:
        """The count of every resource asked for: given, else the largest ask."""
        most: Counts = {}
        for ask in asked:
            for key, count in ask.resources:
                most[key] = max(most.get(key, 0), count)
        global_names = {name for device, name in most if device == GLOBAL}
        for device, name in most:
            if device != GLOBAL and name in global_names:
                raise ConfigError(
                    f'model {label}: resource "{name}" is both global and per device in the '
                    "instance groups' rate_limiter"
                )
        limits: Counts = {}
        for (device, name), needed in most.items():
            given = self._given(device, name)
            if given is not None and given < needed:
                where = "global" if device == GLOBAL else f"device {device}"
                raise ConfigError(
                    f'model {label}: resource "{name}" ({where}) is limited to {given} by '
                    f"--rate-limit-resource, which will prevent scheduling of its instances: "
                    f"the minimum required count is {needed}"
                )
            limits[device, name] = needed if given is None else given
        return limits

    def _given(self, device: int, name: str) -> int | None:
        counts = [
            e.count
            for e in self.explicit
            if e.name == name and (device == GLOBAL or e.device is None or e.device == device)
        ]
        return max(counts) if counts else None

    # ------------------------------------------------------------------ the event loop

    def stage(self, slot: Slot) -> None:
        """``slot`` has work: it runs (``on_grant``) once its resources are free and no staged
        instance of a lower scaled priority waits."""
        self._push(slot)
        self._grant()

    def release(self, slot: Slot, executed: bool = True, then: Sequence[Slot] = ()) -> None:
        """``slot``'s execution ended: its resources are free again, once the instances with
        work again (``then``, ``slot`` among them) are staged, as Triton orders it: the freed
        resources go to whichever of every staged instance comes first."""
        if executed:
            slot.executions += 1
        for again in then:
            self._push(again)
        allocated = self.allocated
        for key, count in slot.ask.resources:
            allocated[key] -= count
        self._grant()

    def _push(self, slot: Slot) -> None:
        heapq.heappush(self._staged, (slot.scaled_priority, next(self._order), slot))

    def _grant(self) -> None:
        staged = self._staged
        limits, allocated = self.limits, self.allocated
        while staged:
            slot = staged[0][2]
            resources = slot.ask.resources
            for key, count in resources:
                if allocated.get(key, 0) + count > limits.get(key, 0):
                    return  # the head waits; nothing overtakes it
            heapq.heappop(staged)
            for key, count in resources:
                allocated[key] = allocated.get(key, 0) + count
            slot.on_grant(slot)

    def record_wait(self, label: str, ns: int) -> None:
        duration = self.waits.get(label)
        if duration is not None:
            with self._lock:  # the metrics port reads from its own thread
                duration.add(ns)

    def wait_snapshot(self) -> dict[str, Duration]:
        with self._lock:
            return {
                label: Duration(d.count, d.ns, list(d.buckets)) for label, d in self.waits.items()
            }


def limiter_from(mode: str, resources: Sequence[str]) -> RateLimiter | None:
    """The process's limiter for ``--rate-limit`` / ``--rate-limit-resource`` (None: off)."""
    mode = mode.strip().lower()
    if mode not in MODES:
        raise ConfigError(f"--rate-limit takes {' or '.join(MODES)}, got '{mode}'")
    explicit = [parse_resource(text) for text in resources]
    if mode == "off":
        return None
    return RateLimiter(explicit)
