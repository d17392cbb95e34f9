"""Third-party backends: the ``inferd.backends`` entry-point group.

A distribution installed beside inferd registers its ``inferd.backends.base.Backend``
subclass under a name::

    [project.entry-points."inferd.backends"]
    mybackend = "my_package.backend:MyBackend"

The name selects it in a config (``backend: "mybackend"``), as do the Triton ``platform``
values the class lists. Such a backend is the operator's code: it is installed with pip by
whoever runs the server, never sent over the network, and runs in the server's process like
a built-in one.

A built-in backend wins over an entry point of the same name (the server logs the clash,
naming the distribution), and two distributions registering one name select neither. An
entry point that fails to import, raises when built or gives something that is not a
Backend fails only the loads of the models that select it, with a ``ConfigError`` naming
the distribution; the server keeps serving the others.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from importlib.metadata import EntryPoint, entry_points
from typing import TYPE_CHECKING

from inferd.core.errors import ConfigError

if TYPE_CHECKING:
    from inferd.backends.base import Backend

GROUP = "inferd.backends"
log = logging.getLogger("inferd.backends")
_reported: set[tuple[str, str]] = set()


def distribution(ep: EntryPoint) -> str:
    """The distribution that registered ``ep``, as pip lists it ("name version")."""
    dist = ep.dist
    if dist is None:
        return "an unknown distribution"
    return f"{dist.metadata['Name']} {dist.version}"


def registered(builtin: Collection[str]) -> dict[str, list[EntryPoint]]:
    """The group's entry points by name, leaving out (and logging, once) those whose name a
    built-in backend already has. A name with several entry points is ambiguous."""
    found: dict[str, list[EntryPoint]] = {}
    for ep in entry_points(group=GROUP):
        if ep.name in builtin:
            clash = (ep.name, distribution(ep))
            if clash not in _reported:
                _reported.add(clash)
                log.warning(
                    "backend '%s' of the distribution %s is ignored: a built-in backend has "
                    "that name",
                    *clash,
                )
            continue
        found.setdefault(ep.name, []).append(ep)
    return found


def load(name: str, eps: list[EntryPoint]) -> Backend:
    """The Backend that ``name``'s entry point gives (ConfigError naming its distribution)."""
    from inferd.backends.base import Backend

    if len(eps) > 1:
        where = ", ".join(sorted(distribution(ep) for ep in eps))
        raise ConfigError(f"backend '{name}' is registered by several distributions ({where})")
    ep = eps[0]
    source = f"backend '{name}' (entry point '{ep.value}' of the distribution {distribution(ep)})"
    try:
        factory = ep.load()
        backend = factory()
    except (Exception, SystemExit) as exc:
        log.error("%s failed to load", source, exc_info=exc)
        raise ConfigError(f"{source} failed to load: {type(exc).__name__}: {exc}") from None
    if not isinstance(backend, Backend):
        raise ConfigError(f"{source} is not a subclass of inferd.backends.base.Backend")
    if not backend.name:
        backend.name = name
    elif backend.name != name:
        raise ConfigError(f"{source} calls itself '{backend.name}'; name it '{name}'")
    return backend
