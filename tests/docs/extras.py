"""What ``pip install -e '.[EXTRAS]'`` brings, read from pyproject.toml and the metadata of the
packages installed here: the distributions (dependencies of dependencies included) and the
modules they provide. The docs tests use it to run an example with only what the page tells
its reader to install, and to check that an extra holds what the docs need."""

from __future__ import annotations

import functools
import importlib.metadata
import re
import tomllib
from collections.abc import Iterable
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
PROJECT = "inferd"


def _name(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _own(extras: Iterable[str]) -> list[Requirement]:
    """inferd's requirements with these extras, from the checkout's pyproject.toml (the
    installed metadata may be older), its own extras (``inferd[a,b]``) expanded."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    found = [Requirement(r) for r in project["dependencies"]]
    pending, seen = list(extras), set()
    while pending:
        extra = pending.pop()
        if extra in seen:
            continue
        seen.add(extra)
        for text in project["optional-dependencies"][extra]:
            requirement = Requirement(text)
            if _name(requirement.name) == PROJECT:
                pending += requirement.extras
            else:
                found.append(requirement)
    return found


def _applies(requirement: Requirement, extra: str = "") -> bool:
    return requirement.marker is None or requirement.marker.evaluate({"extra": extra})


@functools.cache
def distributions(extras: tuple[str, ...]) -> frozenset[str]:
    """The distributions (normalised names) that inferd with ``extras`` installs."""
    found: set[str] = {PROJECT}
    pending = [(r.name, frozenset(r.extras)) for r in _own(extras) if _applies(r)]
    done: set[tuple[str, frozenset[str]]] = set()
    while pending:
        name, wanted = pending.pop()
        if (_name(name), wanted) in done:
            continue
        done.add((_name(name), wanted))
        found.add(_name(name))
        try:
            requires = importlib.metadata.requires(name) or []
        except importlib.metadata.PackageNotFoundError:
            continue  # not installed here: it provides no module to hide either
        for text in requires:
            requirement = Requirement(text)
            if any(_applies(requirement, extra) for extra in ("", *wanted)):
                pending.append((requirement.name, frozenset(requirement.extras)))
    return frozenset(found)


def missing_modules(extras: tuple[str, ...]) -> list[str]:
    """The top-level modules installed here that inferd with ``extras`` would not have."""
    kept = distributions(extras)
    return sorted(
        module
        for module, owners in importlib.metadata.packages_distributions().items()
        if module.isidentifier() and not any(_name(owner) in kept for owner in owners)
    )


def hiding_folder(extras: tuple[str, ...], folder: Path) -> Path:
    """A folder whose ``sitecustomize`` makes importing ``missing_modules(extras)`` fail, as
    in an environment with only inferd and those extras; put it first on PYTHONPATH."""
    folder.mkdir(parents=True, exist_ok=True)
    names = missing_modules(extras)
    (folder / "sitecustomize.py").write_text(
        "import sys\n"
        f"for name in {names!r}:\n"
        "    sys.modules.setdefault(name, None)  # import fails, as where it is not installed\n"
    )
    return folder
