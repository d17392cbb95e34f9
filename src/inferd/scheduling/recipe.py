"""How an execution instance builds its executor: from a picklable recipe, never a pickled model.

``build_executor`` is the one place a backend's model becomes an ``Executor`` (in the server
for thread instances, in the model process for process instances). A
``backends.process.ProcessRecipe`` is what the server sends a fresh model process: a factory to
import (``module:function``) and its plain arguments. A framework backend's recipe names the
backend, the version folder, the completed config (serialized) and the placement; the Python
backend has its own (``Backend.process_recipe``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from inferd.backends.process import ProcessRecipe

if TYPE_CHECKING:
    from inferd.backends.base import Backend, InstancePlacement
    from inferd.backends.work import Executor
    from inferd.config.model_config_pb2 import ModelConfig
    from inferd.security.trust import PlainGrants


def build_executor(
    backend: Backend,
    version_dir: Path,
    config: ModelConfig,
    placement: InstancePlacement,
    label: str,
) -> Executor:
    """The backend's request-level executor if it has one for this model, else its batch
    Runtime behind ``BatchExecutor``."""
    from inferd.backends.work import BatchExecutor

    executor = backend.load_executor(version_dir, config, placement)
    if executor is not None:
        return executor
    return BatchExecutor(label, backend.load(version_dir, config, placement))


def backend_recipe(
    backend: Backend,
    version_dir: Path,
    config: ModelConfig,
    placement: InstancePlacement,
    label: str,
) -> ProcessRecipe:
    """A framework backend's model, loaded in the worker by ``backend_executor``, with what
    the server granted the model's code where the recipe is made (``inferd.security.trust``)."""
    from inferd.security.trust import current

    fields = (placement.kind, placement.device_id, placement.instance_count, placement.index)
    grants = current()
    return ProcessRecipe(
        f"{__name__}:backend_executor",
        (
            backend.name,
            str(version_dir),
            config.SerializeToString(),
            fields,
            label,
            grants.plain() if grants is not None else None,
        ),
    )


def backend_executor(
    backend_name: str,
    version_dir: str,
    config_bytes: bytes,
    placement: tuple[str, int, int, int],
    label: str,
    grants: PlainGrants | None = None,
) -> Executor:
    """Runs in the worker: the backend loads the model here, in this process, allowed what
    the server granted it (nothing when ``grants`` is None)."""
    from inferd.backends import get_backend
    from inferd.backends.base import InstancePlacement
    from inferd.config.model_config_pb2 import ModelConfig
    from inferd.security.trust import Grants, granted

    config = ModelConfig.FromString(config_bytes)
    backend = get_backend(backend_name)
    where = InstancePlacement(*placement)
    if grants is None:
        return build_executor(backend, Path(version_dir), config, where, label)
    with granted(Grants.from_plain(grants)):
        return build_executor(backend, Path(version_dir), config, where, label)
