"""Shared fixtures: the demo repository (built once) and a server serving it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from inferd.demo.models import write_demo_repository
from tests.support import ServerProcess


@pytest.fixture(scope="session")
def demo_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("repo") / "models"
    write_demo_repository(root)
    return root


@pytest.fixture(scope="session")
def server(demo_repo: Path) -> Iterator[ServerProcess]:
    """One server on the demo models for every end-to-end test that only reads."""
    proc = ServerProcess(demo_repo).start()
    yield proc
    proc.stop()
