"""How to install one of inferd's extras, written for where this inferd came from.

No package index has inferd: from a checkout (an editable install) the command names the
checkout's folder; from a wheel it names the packages the extra brings, read from the installed
metadata (its platform markers evaluated here).
"""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

_EXTRA = re.compile(r"""\bextra\s*==\s*["']([\w.-]+)["']""")


def checkout() -> Path | None:
    """The source checkout this inferd is imported from (an editable install), else None."""
    root = Path(__file__).resolve().parents[2]
    if (root / "pyproject.toml").is_file() and (root / "src" / "inferd").is_dir():
        return root
    return None


def _applies(marker: str, extra: str) -> bool:
    """Whether a requirement's marker holds here for ``extra``; True where it cannot be
    evaluated (pip then evaluates it)."""
    try:
        from packaging.markers import Marker

        return Marker(marker).evaluate({"extra": extra})
    except Exception:  # no packaging, or a marker it cannot read
        return True


def requirements(extra: str) -> list[str]:
    """The requirements an extra adds (inferd's own extras within it expanded)."""
    try:
        declared = importlib.metadata.requires("inferd") or []
    except importlib.metadata.PackageNotFoundError:
        return []
    found: list[str] = []
    for text in declared:
        requirement, _, marker = text.partition(";")
        if extra not in _EXTRA.findall(marker) or not _applies(marker, extra):
            continue
        own = re.fullmatch(r"\s*inferd\s*\[([^\]]*)\]\s*", requirement)
        if own is not None:
            for inner in own.group(1).split(","):
                found += [r for r in requirements(inner.strip()) if r not in found]
        elif requirement.strip() not in found:
            found.append(requirement.strip())
    return found


def install_hint(extra: str) -> str:
    """``pip install ...`` that brings ``extra``, as a user types it."""
    root = checkout()
    if root is not None:
        return f"pip install -e '{root}[{extra}]'"
    packages = requirements(extra)
    if packages:
        return "pip install " + " ".join(f"'{p.replace(' ', '')}'" for p in packages)
    return f"install the '{extra}' extra of inferd"
