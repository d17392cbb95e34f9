"""Models small and simple enough to copy into every worker: running one costs less than
forwarding it to the model host.

A request forwarded to the host costs a message each way and a wake-up of each process, tens
of microseconds of CPU: more than a tiny model takes to run. So a version that runs on threads
without any batching (no dynamic or sequence batcher, no response cache, not decoupled, not a
Python model nor an ensemble) on a light runtime (ONNX Runtime, OpenVINO: ``LIGHT_RUNTIMES``),
whose files are at most ``--http-workers-copy-bytes``, is also loaded by every frontend
worker, from the folder the host loaded it from and with the host's completed config, and runs
there. Nothing it could do depends on seeing every request, and its weights cost that little
more memory per worker. Every other model is loaded once, by the host.

A frontend loads a copy with no code capability granted (no pickles, no unsafe operations): a
model that needs one is forwarded instead, like one whose copy does not load for any reason.
"""

from __future__ import annotations

from pathlib import Path

from inferd.backends import select_backend
from inferd.backends.completion import copies_only
from inferd.config.model_config_pb2 import ModelConfig
from inferd.plane.model import ModelVersion
from inferd.plane.routing import RoutingPolicy
from inferd.repository.loader import LoadOptions, Plan, load_version
from inferd.scheduling.batcher import DirectScheduler
from inferd.scheduling.instances import ThreadInstances
from inferd.security.trust import CodePolicy, Grant

NOTHING_GRANTED = CodePolicy(Grant.NEVER, Grant.NEVER, Grant.NEVER)
# Runtimes a frontend may load for a copy: a few tens of MB in a process. TensorFlow, PyTorch
# and the tabular libraries cost one to six hundred MB each, more than forwarding saves.
LIGHT_RUNTIMES = frozenset({"onnxruntime", "openvino"})


def copyable(version: ModelVersion, max_bytes: int) -> bool:
    """Whether frontends should run a copy of ``version`` (the host's; module doc)."""
    scheduler = version.scheduler
    return (
        0 < version.folder_bytes <= max_bytes
        and version.config.backend in LIGHT_RUNTIMES
        and bool(version.folder)
        and Path(version.folder).is_dir()  # not an upload's staging folder, removed since
        and isinstance(scheduler, DirectScheduler)
        and isinstance(scheduler.pool, ThreadInstances)
        and version.cache is None
        and not version.decoupled
    )


def load_copy(
    name: str, number: int, config: ModelConfig, folder: str, worker: int
) -> ModelVersion:
    """Load a copy of a host's version from its folder (blocking: on a worker thread)."""
    copies_only()  # the host warned of what its config asks that the backend ignores
    version_dir = Path(folder)
    backend = select_backend(config, [version_dir])
    dirs = {number: version_dir}
    plan = Plan(version_dir.parent, config, dirs, [number], backend, RoutingPolicy())
    options = LoadOptions(
        auto_complete=False, code_policy=NOTHING_GRANTED, loaded=f"worker {worker} copied"
    )
    return load_version(name, number, plan, options)
