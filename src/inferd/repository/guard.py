"""Unload guard: a listing that suddenly loses most of a store's models is a fault of the store.

A bucket recreated empty, a prefix briefly missing while a sync tool rewrites it, a listing
cut short: none of these is an operator asking to unload everything. When one listing of a
store lacks every model the server had from it, or more than ``max_fraction`` of them, those
models are held: they keep serving, the index and metrics say why, and they unload only when
they are still missing ``grace_s`` seconds later, or when an unload call confirms it. Losing
fewer models than that is an ordinary deletion and unloads them at once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Set
from dataclasses import dataclass, field

log = logging.getLogger("inferd.repository")


@dataclass(frozen=True, slots=True)
class Held:
    """A model kept serving although its store's listing lost it."""

    name: str
    store: str
    since_s: float  # monotonic time of the first listing without it
    since_unix_s: float
    unload_at_unix_s: float

    def reason(self) -> str:
        when = time.strftime("%H:%M:%S", time.localtime(self.since_unix_s))
        left_s = max(0.0, self.unload_at_unix_s - time.time())
        return (
            f"missing from model repository '{self.store}' since {when}, with most of its "
            f"models: serving on as a store fault; unloading in {left_s:.0f} s unless it "
            "returns (or an unload call confirms it)"
        )


@dataclass(frozen=True, slots=True)
class Verdict:
    unload: frozenset[str] = frozenset()  # missing models to unload now
    held: frozenset[str] = frozenset()  # missing models that keep serving for now


@dataclass(slots=True)
class UnloadGuard:
    max_fraction: float = 0.5
    grace_s: float = 60.0
    clock: Callable[[], float] = time.monotonic
    held: dict[str, Held] = field(default_factory=dict)
    faults: int = 0  # listings judged a store fault, since start

    def review(self, store: str, had: Set[str], listed: Set[str]) -> Verdict:
        """Judge one successful listing of ``store``: ``had`` are the models the server has
        from it, ``listed`` the ones the listing shows (or elsewhere serves)."""
        now = self.clock()
        for name in [n for n, h in self.held.items() if h.store == store and n in listed]:
            del self.held[name]
            log.info("model '%s' is back in model repository '%s'", name, store)
        missing = set(had) - set(listed)
        if not missing:
            return Verdict()
        already = {n for n in missing if n in self.held}
        fresh = missing - already
        faulty = len(missing) == len(had) or len(missing) > self.max_fraction * len(had)
        if fresh and (faulty or already) and self.grace_s > 0:
            if not already:
                self.faults += 1
                log.warning(
                    "model repository '%s' lists %d of the %d models loaded from it: treating "
                    "it as a store fault; they keep serving, and unload if still missing "
                    "after %g s (--repository-unload-grace-s) or on an unload call",
                    store,
                    len(had) - len(missing),
                    len(had),
                    self.grace_s,
                )
            wall = time.time()
            for name in sorted(fresh):
                self.held[name] = Held(name, store, now, wall, wall + self.grace_s)
            already |= fresh
            fresh = set()
        due = {n for n in already if now - self.held[n].since_s >= self.grace_s}
        for name in sorted(due):
            log.warning(
                "model '%s' is still missing from model repository '%s' after %.0f s: unloading it",
                name,
                store,
                now - self.held.pop(name).since_s,
            )
        return Verdict(frozenset(fresh | due), frozenset(already - due))

    def release(self, name: str) -> bool:
        """Stop holding a model (it was unloaded, or it serves from elsewhere now)."""
        return self.held.pop(name, None) is not None
