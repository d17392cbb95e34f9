"""TokenStore: scopes, bearer and bare headers, token files re-read when they change."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from inferd.core.errors import ConfigError
from inferd.security.tokens import Scope, TokenStore, token_from_header


def test_scopes_and_headers() -> None:
    store = TokenStore(["inf"], ["adm"])
    assert store.scope_of(token_from_header("Bearer inf")) is Scope.INFERENCE
    assert store.scope_of(token_from_header("bearer   adm ")) is Scope.ADMIN
    assert store.scope_of(token_from_header("inf")) is Scope.INFERENCE  # PAI-EAS style
    assert store.scope_of("nope") is None
    assert store.has(Scope.INFERENCE) and store.has(Scope.ADMIN)
    assert not TokenStore().has(Scope.ADMIN)


def test_a_token_file_is_reread_when_it_changes(tmp_path: Path) -> None:
    path = tmp_path / "admin.tokens"
    path.write_text("# admins\nfirst\n\n")
    store = TokenStore(admin_file=str(path))
    assert store.scope_of("first") is Scope.ADMIN
    path.write_text("second\n")
    os.utime(path, ns=(1, 10**18))  # a different stamp even within one mtime tick
    assert store.scope_of("second") is Scope.ADMIN
    assert store.scope_of("first") is None  # at once: the next call after the change
    path.unlink()  # a file that goes away keeps its last tokens (logged)
    assert store.scope_of("second") is Scope.ADMIN


def test_a_missing_token_file_at_start_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read token file"):
        TokenStore(inference_file=str(tmp_path / "absent"))
