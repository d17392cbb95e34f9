"""Whether code that comes with a model may run: the operator's decision, never the model's.

Loading a pickle (scikit-learn/joblib), running a Python model, or a TensorFlow graph that
reads or writes files runs code written by whoever supplied the model. The server decides per
capability (``--allow-pickle``, ``--allow-python-models``, ``--allow-unsafe-ops``) and per
origin of the model: present in the repository at start, arrived in a repository later (a
poll, an S3 bucket), or sent through the API (``file:`` load parameters, uploads). No model
config field can grant anything.

The loader states what is granted around each backend call (``granted``); a backend asks
before it runs such code (``require``), and gets a ModelLoadError naming the flag otherwise::

    from inferd.security.trust import Capability, require
    require(Capability.PYTHON_MODELS, "model.py is a Python model")   # in load / load_executor
"""

from __future__ import annotations

import contextlib
import contextvars
import enum
from collections.abc import Iterator
from dataclasses import dataclass

from inferd.core.errors import ConfigError, ModelLoadError


class Capability(enum.Enum):
    PICKLE = "pickle"
    PYTHON_MODELS = "python-models"
    UNSAFE_OPS = "unsafe-ops"

    @property
    def flag(self) -> str:
        return f"--allow-{self.value}"


class Origin(enum.Enum):
    """Where the files of a model being loaded came from."""

    STARTUP = "present in the repository at start"
    REPOSITORY = "arrived in the repository after start"
    API = "sent through the repository API"


class Grant(enum.Enum):
    """A capability's setting: never, for models present at start only, or always."""

    NEVER = "never"
    STARTUP = "startup"
    ALWAYS = "always"

    @classmethod
    def parse(cls, text: str, flag: str) -> Grant:
        lowered = text.strip().lower()
        if lowered in ("always", "true", "1", "yes", "on"):
            return cls.ALWAYS
        if lowered in ("never", "false", "0", "no", "off"):
            return cls.NEVER
        if lowered == "startup":
            return cls.STARTUP
        raise ConfigError(f"{flag} must be never, startup or always, not '{text}'")


class CodeNotAllowed(ModelLoadError):
    """A model needs a capability the server does not grant for its origin."""


@dataclass(frozen=True, slots=True)
class CodePolicy:
    pickle: Grant = Grant.STARTUP
    python_models: Grant = Grant.STARTUP
    unsafe_ops: Grant = Grant.STARTUP
    # Models sent through the API may run code only when the API itself needs an admin token.
    admin_token: bool = False

    def grant(self, capability: Capability) -> Grant:
        if capability is Capability.PICKLE:
            return self.pickle
        if capability is Capability.PYTHON_MODELS:
            return self.python_models
        return self.unsafe_ops

    def allows(self, capability: Capability, origin: Origin) -> bool:
        grant = self.grant(capability)
        if grant is Grant.NEVER:
            return False
        if origin is Origin.STARTUP:
            return True
        if grant is Grant.STARTUP:
            return False
        return origin is Origin.REPOSITORY or self.admin_token

    def grants(self, origin: Origin) -> Grants:
        allowed = frozenset(c for c in Capability if self.allows(c, origin))
        return Grants(allowed, origin, self)

    def why_not(self, capability: Capability, origin: Origin) -> str:
        grant = self.grant(capability)
        if grant is Grant.NEVER:
            return f"the server runs with {capability.flag} never"
        if grant is Grant.STARTUP:
            return (
                f"this model was {origin.value}, and {capability.flag} is 'startup' (only models "
                f"present at start); start the server with {capability.flag} always to allow it"
            )
        return (
            f"this model was {origin.value}, which needs {capability.flag} always and an "
            "--admin-token (or --admin-token-file) so that only admins can send code"
        )


@dataclass(frozen=True, slots=True)
class Grants:
    """What a model being loaded may do, and why not."""

    allowed: frozenset[Capability]
    origin: Origin
    policy: CodePolicy

    def plain(self) -> PlainGrants:
        """As plain values, for the recipe of a worker process (``Grants.from_plain``)."""
        p = self.policy
        policy = (p.pickle.value, p.python_models.value, p.unsafe_ops.value, p.admin_token)
        return tuple(sorted(c.value for c in self.allowed)), self.origin.name, policy

    @classmethod
    def from_plain(cls, plain: PlainGrants) -> Grants:
        allowed, origin, (pickle, python_models, unsafe_ops, admin_token) = plain
        policy = CodePolicy(Grant(pickle), Grant(python_models), Grant(unsafe_ops), admin_token)
        return cls(frozenset(Capability(c) for c in allowed), Origin[origin], policy)


# Grants as a worker process's recipe carries them: capabilities, origin, the policy's settings.
PlainGrants = tuple[tuple[str, ...], str, tuple[str, str, str, bool]]


# Nothing is granted outside a loader's ``granted`` block.
_CURRENT: contextvars.ContextVar[Grants | None] = contextvars.ContextVar(
    "inferd_trust_grants", default=None
)


@contextlib.contextmanager
def granted(grants: Grants) -> Iterator[None]:
    """Backend calls inside this block may run what ``grants`` allows."""
    token = _CURRENT.set(grants)
    try:
        yield
    finally:
        _CURRENT.reset(token)


def current() -> Grants | None:
    """What the enclosing ``granted`` block allows (None outside one)."""
    return _CURRENT.get()


def allowed(capability: Capability) -> bool:
    grants = _CURRENT.get()
    return grants is not None and capability in grants.allowed


def require(capability: Capability, what: str) -> None:
    """Raise CodeNotAllowed (``what``, and the flag that would allow it) unless granted."""
    grants = _CURRENT.get()
    if grants is not None and capability in grants.allowed:
        return
    why = (
        grants.policy.why_not(capability, grants.origin)
        if grants is not None
        else f"no server granted {capability.flag}"
    )
    raise CodeNotAllowed(f"{what}, which runs code from the model's files: refused, as {why}")
