"""Triton's repository layout: ``<repo>/<model>/[config.pbtxt]`` and ``<model>/<version>/...``.

Finds model folders and their numbered versions, and applies the version policy.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from inferd.config.model_config_pb2 import ModelVersionPolicy
from inferd.core.errors import ConfigError


def list_models(roots: Iterable[Path]) -> dict[str, Path]:
    """Every model folder in the repositories; a name found twice is an error."""
    found: dict[str, Path] = {}
    for root in roots:
        if not root.is_dir():
            raise ConfigError(f"model repository '{root}' is not a directory")
        for entry in sorted(root.iterdir()):
            if entry.name.startswith(".") or not entry.is_dir():
                continue
            if entry.name in found:
                raise ConfigError(
                    f"model '{entry.name}' is in two repositories: {found[entry.name]} and {entry}"
                )
            found[entry.name] = entry
    return found


def version_dirs(model_dir: Path) -> dict[int, Path]:
    """Numbered version folders (positive integers); other entries are ignored."""
    versions: dict[int, Path] = {}
    for entry in model_dir.iterdir():
        if entry.is_dir() and entry.name.isdecimal() and int(entry.name) > 0:
            versions[int(entry.name)] = entry
    return dict(sorted(versions.items()))


def select_versions(available: Iterable[int], policy: ModelVersionPolicy) -> list[int]:
    """The versions the policy serves, ascending (default: the latest one)."""
    versions = sorted(available)
    choice = policy.WhichOneof("policy_choice")
    if choice == "all":
        return versions
    if choice == "specific":
        wanted = sorted({int(v) for v in policy.specific.versions})
        missing = [v for v in wanted if v not in versions]
        if missing:
            raise ConfigError(
                f"version_policy specific lists version(s) {missing} that have no folder"
            )
        return wanted
    count = policy.latest.num_versions if choice == "latest" else 1
    if count < 1:
        raise ConfigError("version_policy latest num_versions must be at least 1")
    return versions[-count:]
