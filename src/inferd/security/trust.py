"""Whether code that comes with a model may run: the operator's decision, never the model's.

Loading a pickle (scikit-learn/joblib), running a Python model, or a TensorFlow graph that
reads or writes files runs code written by whoever supplied the model. The server decides per
capability (``--allow-pickle``, ``--allow-python-models``, ``--allow-unsafe-ops``) and per
origin of the model: present in the repository at start, arrived in a repository later (a
poll, an S3 bucket), or sent through the API (``file:`` load parameters, uploads). No model
config field can grant anything.

Files that arrived through the network keep that origin whatever the model's (the server's
record of them, ``inferd.repository.provenance``): a load, a config given in a load call, a
restart, another version never makes them the operator's; only a change of the file on disk
does. The loader states what is granted around each backend call (``granted``); a backend asks
before it runs such code (``require``), naming the file it runs when it runs one file (a
pickle), else every file of the model counts (a Python model may import or read any of them),
and gets a ModelLoadError naming the flag otherwise::

    from inferd.security.trust import Capability, require
    require(Capability.PICKLE, "model.joblib is a pickle", [path])   # in load / load_executor
    require(Capability.PYTHON_MODELS, "model.py is a Python model")   # any file of the model
"""

from __future__ import annotations

import contextlib
import contextvars
import enum
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

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

    def grants(
        self,
        origin: Origin,
        network: Mapping[str, str] | None = None,
        network_code: tuple[str, ...] = (),
    ) -> Grants:
        """What a model of ``origin`` may run; ``network`` (absolute path -> path in the
        model) are its files that arrived through the network, ``network_code`` those of
        them that count when no one file is named (all but the config)."""
        allowed = frozenset(c for c in Capability if self.allows(c, origin))
        return Grants(allowed, origin, self, dict(network or {}), network_code)

    def why_not(self, capability: Capability, origin: Origin, subject: str = "") -> str:
        """Why ``capability`` is refused to a model of ``origin`` (``subject``: the file that
        decided it, one of the network's, as the sentence names it)."""
        grant = self.grant(capability)
        if grant is Grant.NEVER:
            return f"the server runs with {capability.flag} never"
        who = (
            f"{subject} was {origin.value} (the model folder's record says so until the file "
            "changes on disk)"
            if subject
            else f"this model was {origin.value}"
        )
        admins = (
            f"{capability.flag} always and an --admin-token (or --admin-token-file) so that only "
            "admins can send code"
        )
        if grant is Grant.STARTUP:
            allow = (
                admins
                if origin is Origin.API
                else f"start the server with {capability.flag} always to allow it"
            )
            return (
                f"{who}, and {capability.flag} is 'startup' (only models present at start); "
                f"{'that needs ' if origin is Origin.API else ''}{allow}"
            )
        return f"{who}, which needs {admins}"


@dataclass(frozen=True, slots=True)
class Grants:
    """What a model being loaded may do, and why not."""

    allowed: frozenset[Capability]  # for the model's origin
    origin: Origin
    policy: CodePolicy
    # Files of the model that arrived through the network: absolute path -> path in the model.
    network: Mapping[str, str] = field(default_factory=dict)
    network_code: tuple[str, ...] = ()  # those that count when no one file is named

    def network_file(self, files: Iterable[str | os.PathLike[str]] | None) -> str | None:
        """The first of ``files`` (None: any file of the model) that arrived through the
        network, as a path in the model; None when none did."""
        if files is None:
            return self.network_code[0] if self.network_code else None
        for path in files:
            rel = self.network.get(os.path.realpath(path))
            if rel is not None:
                return rel
        return None

    def plain(self) -> PlainGrants:
        """As plain values, for the recipe of a worker process (``Grants.from_plain``)."""
        p = self.policy
        policy = (p.pickle.value, p.python_models.value, p.unsafe_ops.value, p.admin_token)
        network = tuple(sorted(self.network.items()))
        allowed = tuple(sorted(c.value for c in self.allowed))
        return allowed, self.origin.name, policy, network, self.network_code

    @classmethod
    def from_plain(cls, plain: PlainGrants) -> Grants:
        allowed, origin, settings, network, network_code = plain
        pickle, python_models, unsafe_ops, admin_token = settings
        policy = CodePolicy(Grant(pickle), Grant(python_models), Grant(unsafe_ops), admin_token)
        capabilities = frozenset(Capability(c) for c in allowed)
        return cls(capabilities, Origin[origin], policy, dict(network), tuple(network_code))


# Grants as a worker process's recipe carries them: capabilities, origin, the policy's settings,
# the files that arrived through the network.
PlainGrants = tuple[
    tuple[str, ...],
    str,
    tuple[str, str, str, bool],
    tuple[tuple[str, str], ...],
    tuple[str, ...],
]


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


Paths = Iterable[str | os.PathLike[str]] | None


def allowed(capability: Capability, files: Paths = None) -> bool:
    """Whether ``capability`` is granted for ``files`` (None: every file of the model)."""
    grants = _CURRENT.get()
    if grants is None:
        return False
    if grants.network_file(files) is not None:
        return grants.policy.allows(capability, Origin.API)
    return capability in grants.allowed


def require(capability: Capability, what: str, files: Paths = None) -> None:
    """Raise CodeNotAllowed (``what``, and the flag that would allow it) unless granted for
    ``files``, the files that would run (None: any file of the model may)."""
    grants = _CURRENT.get()
    if grants is None:
        why = f"no server granted {capability.flag}"
    else:
        sent = grants.network_file(files)
        if sent is None:
            if capability in grants.allowed:
                return
            why = grants.policy.why_not(capability, grants.origin)
        else:
            if grants.policy.allows(capability, Origin.API):
                return
            subject = f"'{sent}'"
            if files is None:  # no one file named: any file of the model decides
                subject += ", a file of the model (which its code may read or import),"
            why = grants.policy.why_not(capability, Origin.API, subject)
    raise CodeNotAllowed(f"{what}, which runs code from the model's files: refused, as {why}")
