"""inferd: one-step model deployment and fast inference over KServe v2 and TF Serving APIs.

``inferd.Server`` runs a model repository in this process (see ``inferd.app.embedded``); it is
imported on first use, so ``import inferd`` stays cheap (worker processes import the package).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from inferd.version import __version__

if TYPE_CHECKING:
    from inferd.app.calls import Outputs
    from inferd.app.embedded import Server
    from inferd.app.settings import Settings
    from inferd.core.errors import (
        ConfigError,
        DeadlineExceeded,
        InferdError,
        InternalError,
        InvalidInput,
        ModelLoadError,
        NotFound,
        Unavailable,
    )

__all__ = [
    "ConfigError",
    "DeadlineExceeded",
    "InferdError",
    "InternalError",
    "InvalidInput",
    "ModelLoadError",
    "NotFound",
    "Outputs",
    "Server",
    "Settings",
    "Unavailable",
    "__version__",
]

# The public names, by the module that defines them.
_LAZY = {
    "Server": "inferd.app.embedded",
    "Outputs": "inferd.app.calls",
    "Settings": "inferd.app.settings",
    **dict.fromkeys(
        (
            "ConfigError",
            "DeadlineExceeded",
            "InferdError",
            "InternalError",
            "InvalidInput",
            "ModelLoadError",
            "NotFound",
            "Unavailable",
        ),
        "inferd.core.errors",
    ),
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'inferd' has no attribute '{name}'")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
