"""The dependency graph of the loaded models: which models need which others loaded first.

A model declares what it needs when it is planned (an ensemble names its composing models);
the control plane loads those first, unloads the models that need a model it unloads, and
with Triton's ``unload_dependents`` also unloads what an unloaded model needed and nothing
else still uses. A declaration that would close a cycle is refused.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

from inferd.core.errors import ConfigError


class Dependencies:
    def __init__(self) -> None:
        self._needs: dict[str, tuple[str, ...]] = {}

    def declare(self, name: str, needs: Iterable[str]) -> None:
        """Replace what ``name`` needs (ConfigError naming the cycle if one would close)."""
        wanted = tuple(dict.fromkeys(needs))
        for need in wanted:
            path = self._path(need, name)
            if path is not None:
                cycle = " -> ".join([name, *path])
                raise ConfigError(f"model dependencies form a cycle: {cycle}")
        if wanted:
            self._needs[name] = wanted
        else:
            self._needs.pop(name, None)

    def forget(self, name: str) -> None:
        self._needs.pop(name, None)

    def needs(self, name: str) -> tuple[str, ...]:
        """What ``name`` needs directly."""
        return self._needs.get(name, ())

    def load_order(self, name: str) -> list[str]:
        """Everything ``name`` needs, directly or not, each after what it needs itself."""
        order: list[str] = []
        seen = {name}

        def visit(model: str) -> None:
            for need in self._needs.get(model, ()):
                if need not in seen:
                    seen.add(need)
                    visit(need)
                    order.append(need)

        visit(name)
        return order

    def users(self, name: str) -> list[str]:
        """Every model that needs ``name``, directly or not, each before what it needs (the
        order to unload them in)."""
        found: list[str] = []
        seen = {name}
        frontier = [name]
        while frontier:
            model = frontier.pop()
            for user, needs in sorted(self._needs.items()):
                if model in needs and user not in seen:
                    seen.add(user)
                    found.append(user)
                    frontier.append(user)
        rank = {m: len(self.load_order(m)) for m in found}
        return sorted(found, key=lambda m: (-rank[m], m))

    def orphans(self, name: str, loaded: Collection[str]) -> list[str]:
        """What ``name`` needed that no other model in ``loaded`` needs once ``name`` is gone,
        in unload order (users before what they need)."""
        gone = {name}
        for need in reversed(self.load_order(name)):
            still_used = any(
                need in self._needs.get(other, ()) for other in loaded if other not in gone
            )
            if not still_used:
                gone.add(need)
        candidates = [m for m in self.load_order(name) if m in gone]
        return list(reversed(candidates))

    def _path(self, start: str, goal: str) -> list[str] | None:
        """A chain of needs from ``start`` to ``goal`` (both included), if there is one."""
        if start == goal:
            return [start]
        for need in self._needs.get(start, ()):
            rest = self._path(need, goal)
            if rest is not None:
                return [start, *rest]
        return None
