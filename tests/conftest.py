"""Shared fixtures: the demo repository (built once) and a server serving it; and how the tests
are spread over parallel workers (pytest-xdist, ``--dist loadscope``: scripts/test)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from inferd.demo.models import write_demo_repository
from tests.support import ServerProcess

# A module that defines one of these fixtures (a server it starts for its tests) keeps its
# tests together under `--dist loadscope`; every other test is a unit of its own.
_SHARED_SCOPE = re.compile(r"""scope=["'](module|class|package)["']""")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """pytest-xdist's ``--dist loadscope`` (scripts/test), by module where it pays: the tests of
    a module that shares a fixture run on one worker, which sets it up once, and every other
    test goes on its own to whichever worker is free. (Session fixtures, like ``server``
    below, are set up once per worker.) Decided from the test files, as the controller
    collects nothing."""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling  # type: ignore[import-untyped]

    root = config.rootpath
    shared: dict[str, bool] = {}

    class ByModuleWherePaying(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            if module not in shared:
                source = (root / module).read_text() if (root / module).is_file() else ""
                shared[module] = bool(_SHARED_SCOPE.search(source))
            return module if shared[module] else nodeid

    return ByModuleWherePaying(config, log)


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
