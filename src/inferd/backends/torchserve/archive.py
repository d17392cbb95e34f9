"""TorchServe model archives as ``torch-model-archiver`` writes them: read and unpacked.

An archive is a ``.mar`` file (a zip: the default and ``zip-store`` formats) or a folder
(``--archive-format no-archive``), with ``MAR-INF/MANIFEST.json`` inside::

    {"runtime": "python", "model": {"modelName": "mnist", "modelVersion": "1.0",
     "handler": "mnist_handler.py", "serializedFile": "mnist_cnn.pt",
     "modelFile": "mnist.py", "configFile": "model-config.yaml", ...}, ...}

``configFile`` names the archive's ``model-config.yaml``: TorchServe's front-end settings
(``batchSize``, ``maxBatchDelay``, ``minWorkers``...) and anything the handler reads from
``context.model_yaml_config``. A zip is unpacked once per file version into a cache folder
(its members must stay inside it); a folder is used in place. Nothing here runs model code.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
import threading
import zipfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from inferd.core.errors import ConfigError
from inferd.install import install_hint

MANIFEST = "MAR-INF/MANIFEST.json"
SUFFIX = ".mar"
_unpacking = threading.Lock()


@dataclass(frozen=True, slots=True)
class Manifest:
    """``MAR-INF/MANIFEST.json``: what the archiver recorded (``raw`` as the handler sees it)."""

    model_name: str
    model_version: str
    handler: str
    serialized_file: str = ""
    model_file: str = ""
    config_file: str = ""
    requirements_file: str = ""
    runtime: str = "python"
    raw: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def parse(cls, data: bytes, where: str) -> Manifest:
        try:
            doc = json.loads(data)
        except ValueError as exc:
            raise ConfigError(f"{where}: {MANIFEST} is not JSON: {exc}") from None
        model = doc.get("model") if isinstance(doc, dict) else None
        if not isinstance(model, dict):
            raise ConfigError(f"{where}: {MANIFEST} has no 'model' object")

        def text(key: str) -> str:
            value = model.get(key, "")
            if not isinstance(value, str):
                raise ConfigError(f"{where}: {MANIFEST} model.{key} must be a string")
            return value

        return cls(
            model_name=text("modelName"),
            model_version=text("modelVersion") or "1.0",
            handler=text("handler"),
            serialized_file=text("serializedFile"),
            model_file=text("modelFile"),
            config_file=text("configFile"),
            requirements_file=text("requirementsFile"),
            runtime=str(doc.get("runtime") or "python"),
            raw=doc,
        )


def find_archive(version_dir: Path) -> Path:
    """The archive of a version folder: its one ``.mar`` file, the folder itself when it is an
    unpacked archive, or its one sub-folder that is (ConfigError otherwise)."""
    if (version_dir / MANIFEST).is_file():
        return version_dir
    mars = sorted(p for p in version_dir.glob(f"*{SUFFIX}") if p.is_file() or p.is_dir())
    if len(mars) == 1:
        return mars[0]
    if len(mars) > 1:
        names = ", ".join(p.name for p in mars)
        raise ConfigError(f"{version_dir} holds several TorchServe archives ({names}): keep one")
    folders = [p for p in version_dir.iterdir() if p.is_dir() and (p / MANIFEST).is_file()]
    if len(folders) == 1:
        return folders[0]
    raise ConfigError(
        f"{version_dir} holds no TorchServe archive (a .mar file, or a folder with {MANIFEST})"
    )


def is_archive(path: Path) -> bool:
    """Whether ``path`` is a ``.mar`` zip or an unpacked archive folder."""
    if path.is_dir():
        return (path / MANIFEST).is_file()
    return path.is_file() and zipfile.is_zipfile(path)


def read_member(archive: Path, name: str) -> bytes | None:
    """One file of an archive (None when it has no such file)."""
    rel = _member(name, str(archive))
    if archive.is_dir():
        path = archive / rel
        return path.read_bytes() if path.is_file() else None
    try:
        with zipfile.ZipFile(archive) as zf:
            try:
                return zf.read(rel)
            except KeyError:
                return None
    except (OSError, zipfile.BadZipFile) as exc:
        raise ConfigError(f"{archive} is not a readable model archive: {exc}") from None


def read_manifest(archive: Path) -> Manifest:
    data = read_member(archive, MANIFEST)
    if data is None:
        raise ConfigError(f"{archive} has no {MANIFEST}: it is not a TorchServe model archive")
    return Manifest.parse(data, str(archive))


def read_model_yaml(archive: Path, manifest: Manifest) -> dict[str, Any]:
    """The archive's ``model-config.yaml`` ({} when the manifest names none)."""
    if not manifest.config_file:
        return {}
    data = read_member(archive, manifest.config_file)
    if data is None:
        raise ConfigError(f"{archive}: its manifest names {manifest.config_file}, which is absent")
    return parse_yaml(data, f"{archive}/{manifest.config_file}")


def parse_yaml(data: bytes, where: str) -> dict[str, Any]:
    try:
        import yaml
    except ImportError:
        raise ConfigError(
            f"{where}: reading model-config.yaml needs PyYAML ({install_hint('torchserve')})"
        ) from None
    try:
        doc = yaml.safe_load(data)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{where} is not valid YAML: {exc}") from None
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise ConfigError(f"{where} must be a mapping of settings")
    return doc


def unpacked(archive: Path, cache_dir: Path | None = None) -> Path:
    """The folder handlers see as ``model_dir``: a folder archive itself, else the zip
    unpacked once per (path, size, mtime) into ``cache_dir``."""
    if archive.is_dir():
        return archive
    stat = archive.stat()
    key = hashlib.sha256(f"{archive.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    root = cache_dir or Path(tempfile.gettempdir()) / "inferd-mar"
    target = root / key.hexdigest()[:16]
    with _unpacking:
        if (target / ".unpacked").exists():
            return target
        if target.exists():
            shutil.rmtree(target)
        target.mkdir(parents=True)
        try:
            with zipfile.ZipFile(archive) as zf:
                for info in zf.infolist():
                    rel = _member(info.filename, str(archive))
                    if info.is_dir():
                        (target / rel).mkdir(parents=True, exist_ok=True)
                        continue
                    path = target / rel
                    path.parent.mkdir(parents=True, exist_ok=True)
                    with zf.open(info) as src, open(path, "wb") as dst:
                        shutil.copyfileobj(src, dst, 1 << 20)
        except (OSError, zipfile.BadZipFile) as exc:
            shutil.rmtree(target, ignore_errors=True)
            raise ConfigError(f"cannot unpack model archive {archive}: {exc}") from None
        except ConfigError:
            shutil.rmtree(target, ignore_errors=True)
            raise
        (target / ".unpacked").touch()
    return target


def _member(name: str, where: str) -> str:
    """A member path that stays inside the archive (ConfigError otherwise)."""
    path = PurePosixPath(name.replace("\\", "/"))
    if path.is_absolute() or ".." in path.parts or (path.parts and ":" in path.parts[0]):
        raise ConfigError(f"{where}: member '{name}' would leave the archive")
    return str(path)
