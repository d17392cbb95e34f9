"""The API tokens and their scopes: inference, or admin (which includes inference).

Tokens come from flags and from files (one a line, ``#`` comments), re-read when a file
changes. A presented token is compared with every known one in constant time (digests,
``hmac.compare_digest``, no early exit), and no token is ever logged or put in a message.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import logging
import os
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field

from inferd.core.errors import ConfigError

log = logging.getLogger("inferd.auth")


class Scope(enum.IntEnum):
    """What a token may do; a higher scope includes the lower ones."""

    INFERENCE = 1
    ADMIN = 2


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8")).digest()


def read_token_file(path: str) -> list[str]:
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError as exc:
        raise ConfigError(f"cannot read token file '{path}': {exc.strerror}") from None
    return [t for t in (line.strip() for line in lines) if t and not t.startswith("#")]


@dataclass(slots=True)
class _File:
    path: str
    scope: Scope
    stamp: tuple[int, int] = (0, 0)  # (mtime_ns, size) last read
    digests: list[bytes] = field(default_factory=list)


class TokenStore:
    """Known tokens by scope; ``scope_of`` answers which scope a presented token has."""

    def __init__(
        self,
        inference: Iterable[str] = (),
        admin: Iterable[str] = (),
        inference_file: str = "",
        admin_file: str = "",
    ) -> None:
        self._fixed: list[tuple[bytes, Scope]] = [
            *((_digest(t), Scope.INFERENCE) for t in inference if t),
            *((_digest(t), Scope.ADMIN) for t in admin if t),
        ]
        self._files = [
            _File(path, scope)
            for path, scope in ((inference_file, Scope.INFERENCE), (admin_file, Scope.ADMIN))
            if path
        ]
        self._lock = threading.Lock()
        self._all: list[tuple[bytes, Scope]] = list(self._fixed)
        for f in self._files:  # a missing file at start is a configuration error
            self._read(f, strict=True)
        self._rebuild()

    def _read(self, f: _File, strict: bool) -> bool:
        try:
            st = os.stat(f.path)
        except OSError as exc:
            if strict:
                raise ConfigError(f"cannot read token file '{f.path}': {exc.strerror}") from None
            return False
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp == f.stamp:
            return False
        try:
            tokens = read_token_file(f.path)
        except ConfigError:
            if strict:
                raise
            log.error("cannot re-read token file '%s'; keeping its previous tokens", f.path)
            return False
        f.stamp, f.digests = stamp, [_digest(t) for t in tokens]
        if not strict:
            log.info("token file '%s' changed: %d token(s) now", f.path, len(tokens))
        return True

    def _rebuild(self) -> None:
        self._all = list(self._fixed) + [(d, f.scope) for f in self._files for d in f.digests]

    def _refresh(self) -> None:
        """Re-read a token file whose stamp changed. Checked on every call (a stat per file,
        about a microsecond): a token removed from the file is refused at once by every
        serving process, not after each process's next periodic look."""
        for f in self._files:
            try:
                st = os.stat(f.path)
            except OSError:
                continue  # gone or unreadable now: its previous tokens stay (logged on read)
            if (st.st_mtime_ns, st.st_size) != f.stamp:
                break
        else:
            return
        with self._lock:
            changed = [self._read(f, strict=False) for f in self._files]
            if any(changed):
                self._rebuild()

    def has(self, scope: Scope) -> bool:
        """Whether any token of exactly this scope is configured (flags or files)."""
        return any(s is scope for _, s in self._fixed) or any(f.scope is scope for f in self._files)

    def scope_of(self, token: str) -> Scope | None:
        """The highest scope of a matching token; every known token is compared."""
        self._refresh()
        presented = _digest(token)
        found = 0
        for digest, scope in self._all:
            if hmac.compare_digest(presented, digest):
                found = max(found, int(scope))
        return Scope(found) if found else None


def token_from_header(value: str) -> str:
    """``Bearer <token>`` or the bare ``<token>`` (as PAI-EAS clients send it)."""
    value = value.strip()
    scheme, _, rest = value.partition(" ")
    if rest and scheme.lower() == "bearer":
        return rest.strip()
    return value
