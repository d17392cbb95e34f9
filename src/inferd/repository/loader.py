"""Turns one model folder into loaded versions: config, version policy, backend, instances.

Everything here blocks (reading files, loading runtimes, warmup): the lifecycle calls it on
worker threads and decides what to swap in or retire.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from inferd.backends import select_backend
from inferd.backends.base import Backend, InstancePlacement
from inferd.backends.completion import bool_parameter
from inferd.backends.process import ProcessRecipe
from inferd.backends.work import Executor, Scheduler
from inferd.config.model_config_pb2 import ModelConfig, ModelInstanceGroup
from inferd.config.spec import ModelSpec, build_spec
from inferd.core.errors import ConfigError, InvalidInput
from inferd.core.stats import ModelStats
from inferd.core.types import ModelCaller
from inferd.plane.classification import read_labels
from inferd.plane.model import ModelVersion
from inferd.plane.routing import ROUTING_PARAMETERS, RoutingPolicy, policy_from_config
from inferd.repository.config import read_config
from inferd.repository.layout import select_versions, version_dirs
from inferd.repository.provenance import network_files
from inferd.repository.routing_file import read_policy
from inferd.repository.storage import check_relative
from inferd.repository.warmup import run_warmup
from inferd.scheduling.batcher import DirectScheduler, DynamicBatcher
from inferd.scheduling.cache import ResponseCache
from inferd.scheduling.instances import Instances, ThreadInstances
from inferd.scheduling.limited import LimitedInstances
from inferd.scheduling.policy import BatchingOptions
from inferd.scheduling.processes import MetricsSink, ProcessInstances
from inferd.scheduling.rate_limiter import RateLimiter, asks_of
from inferd.scheduling.recipe import backend_recipe, build_executor
from inferd.scheduling.sequence import SequenceBatcher
from inferd.scheduling.sequence_options import SequenceOptions
from inferd.security.trust import CodePolicy, Grants, Origin, granted

log = logging.getLogger("inferd.repository")

# "true": each instance of the model is a model process (Python models always are).
PROCESS_PARAMETER = "process_instances"
# Lazy serving (``inferd.repository.residency``): "true" keeps the model loaded once it is, and
# the memory the budget counts for it, in bytes, instead of what its load is measured to take.
PIN_PARAMETER = "pinned"
MEMORY_PARAMETER = "memory_bytes"


@dataclass(frozen=True, slots=True)
class LoadOptions:
    default_max_batch_size: int = 64
    auto_complete: bool = True
    cache: ResponseCache | None = None  # the server-wide response cache, if --cache-size > 0
    code_policy: CodePolicy = field(default_factory=CodePolicy)  # --allow-pickle, ...
    call_model: ModelCaller | None = None  # how a model in a model process calls others
    model_metrics: MetricsSink | None = None  # where metrics a model's code records go
    loaded: str = "loaded"  # what the log says was done ("worker 1 copied": a small model)
    rate_limiter: RateLimiter | None = None  # --rate-limit execution_count


@dataclass(frozen=True, slots=True)
class Plan:
    """What a model folder asks for: its config, the versions to serve, backend, routing
    (config parameters with ``routing.json`` on top), the models it needs loaded first, and
    its files that arrived through the network (``inferd.repository.provenance``)."""

    folder: Path
    config: ModelConfig
    dirs: dict[int, Path]
    selected: list[int]
    backend: Backend
    routing: RoutingPolicy
    dependencies: tuple[str, ...] = ()
    network: frozenset[str] = frozenset()  # paths in the folder


# Files of the network that no backend runs as code (the config is read, never run): they do
# not make a whole model the network's.
NOT_CODE = frozenset({"config.pbtxt", "routing.json"})


def plan(name: str, folder: Path, override: ModelConfig | None = None) -> Plan:
    """Read and check a model folder (ConfigError naming the problem)."""
    if override is not None:
        config = ModelConfig()
        config.CopyFrom(override)
        if not config.name:
            config.name = name
        elif config.name != name:
            raise ConfigError(f"config name '{config.name}' does not match the model '{name}'")
    else:
        config = read_config(folder)
    check_config_paths(config)
    dirs = version_dirs(folder)
    if not dirs:
        raise ConfigError(f"model '{name}' has no version folder (expected {name}/1/<model file>)")
    selected = select_versions(dirs, config.version_policy)
    backend = select_backend(config, (dirs[v] for v in selected))
    routing = read_policy(folder, policy_from_config(config))
    # A backend whose models call other models (ensembles, pipelines) names them here.
    needs = tuple(backend.dependencies(config))
    if name in needs:
        raise ConfigError(f"model '{name}' depends on itself")
    network = network_files(folder)
    return Plan(folder, config, dirs, selected, backend, routing, needs, network)


def grants_for(model_plan: Plan, policy: CodePolicy, origin: Origin) -> Grants:
    """What a version of ``model_plan`` may run: by its origin, but its files that arrived
    through the network count as sent through the API, whatever the origin."""
    folder = model_plan.folder
    network = {os.path.realpath(folder / rel): rel for rel in model_plan.network}
    code = tuple(sorted(rel for rel in model_plan.network if rel not in NOT_CODE))
    return policy.grants(origin, network, code)


def check_config_paths(config: ModelConfig) -> None:
    """Every file a config names stays inside the model's folder (ConfigError otherwise)."""
    named: list[tuple[str, str]] = []
    if config.default_model_filename:
        named.append(("default_model_filename", config.default_model_filename))
    for output in config.output:
        if output.label_filename:
            named.append((f"output '{output.name}' label_filename", output.label_filename))
    for sample in config.model_warmup:
        for input_name, data in sample.inputs.items():
            if data.input_data_file:
                where = f"model_warmup '{sample.name}' input '{input_name}' input_data_file"
                named.append((where, data.input_data_file))
    for where, path in named:
        try:
            check_relative(path, where)
        except InvalidInput as exc:
            raise ConfigError(
                f"{exc.message}: files a config names stay in the model folder"
            ) from None


def load_version(
    name: str,
    version: int,
    model_plan: Plan,
    options: LoadOptions,
    origin: Origin = Origin.STARTUP,
) -> ModelVersion:
    """Load, warm up and wrap one version (raises on failure; nothing is left open).

    ``origin`` (where the files came from) and the server's code policy decide what the
    backend may run while it completes the config and builds instances
    (``inferd.security.trust``)."""
    started = time.perf_counter()
    grants = grants_for(model_plan, options.code_policy, origin)
    backend = model_plan.backend
    version_dir = model_plan.dirs[version]
    config = ModelConfig()
    config.CopyFrom(model_plan.config)
    # Routing and process parameters are the server's, not the backend's: it does not see them.
    server_keys = (*ROUTING_PARAMETERS, PROCESS_PARAMETER, PIN_PARAMETER, MEMORY_PARAMETER)
    kept = {k: config.parameters[k].string_value for k in server_keys if k in config.parameters}
    for key in kept:
        del config.parameters[key]
    in_processes = uses_processes(backend, kept)
    bool_parameter(kept, PIN_PARAMETER)  # lazy serving reads these once the model is loaded
    if not kept.get(MEMORY_PARAMETER, "0").strip().isdecimal():
        raise ConfigError(f"parameter {MEMORY_PARAMETER} must be a number of bytes")
    if options.auto_complete:
        with granted(grants):
            backend.complete_config(version_dir, config, options.default_max_batch_size)
    elif not config.platform and not config.backend:
        config.backend = backend.name
    spec = build_spec(config)
    stats = ModelStats()
    own_scheduler = backend.load_scheduler(config, options.call_model, stats)  # ensembles
    if own_scheduler is not None:
        for key, value in kept.items():
            config.parameters[key].string_value = value
        loaded = _scheduled_version(name, version, config, spec, own_scheduler, stats, started)
        loaded.labels = read_labels(model_plan.folder, config)
        return loaded
    signatures = backend.signatures(version_dir, config)  # model files with several
    batching = BatchingOptions.from_config(config) if config.HasField("dynamic_batching") else None
    sequence = SequenceOptions.from_config(config) if config.HasField("sequence_batching") else None
    if config.response_cache.enable and options.cache is None:
        raise ConfigError(
            "response_cache is enabled but the server has no cache (start it with "
            "--cache-size BYTES)"
        )
    label = f"{name}/{version}"
    grouped = group_devices(config, backend)
    where = placements(grouped)
    limiter = options.rate_limiter
    asks = asks_of([(g, [d for _, d in w]) for g, w in grouped]) if limiter else None
    if limiter is not None and asks is not None:
        limiter.check(label, asks)  # before any instance is built: it could never run
    pool: Instances
    with granted(grants):  # a worker's recipe carries the grants to its process
        if in_processes:
            recipes = [process_recipe(backend, version_dir, config, p, label) for p in where]
            pool = ProcessInstances(label, recipes, options.call_model, options.model_metrics)
        else:
            pool = _thread_instances(backend, version_dir, config, where, label, grants)
    try:
        warmups = run_warmup(config, spec, pool, model_plan.folder)
    except Exception:
        close_now(pool)
        raise
    if limiter is not None and asks is not None:
        try:
            pool = LimitedInstances(limiter, pool, asks)
        except Exception:
            close_now(pool)
            raise
    for key, value in kept.items():
        config.parameters[key].string_value = value
    if warmups:
        log.info("warmed up model '%s' version %d: %d execution(s)", name, version, warmups)
    scheduler: Scheduler
    if sequence is not None:
        scheduler = SequenceBatcher(label, pool, sequence, stats)
    elif batching is not None:
        scheduler = DynamicBatcher(label, pool, batching, stats)
    else:
        scheduler = DirectScheduler(pool, stats)
    loaded = ModelVersion(
        name=name,
        version=version,
        config=config,
        spec=spec,
        scheduler=scheduler,
        stats=stats,
        cache=options.cache if config.response_cache.enable else None,
        instance_count=pool.count,
        signatures=signatures,
        labels=read_labels(model_plan.folder, config),
        folder=str(version_dir),
        folder_bytes=_folder_bytes(version_dir),
    )
    loaded.load_seconds = time.perf_counter() - started
    log.info(
        "%s model '%s' version %d (%s, %d instance(s)) in %.2f s",
        options.loaded,
        name,
        version,
        backend.name,
        loaded.instance_count,
        loaded.load_seconds,
    )
    return loaded


def _scheduled_version(
    name: str,
    version: int,
    config: ModelConfig,
    spec: ModelSpec,
    scheduler: Scheduler,
    stats: ModelStats,
    started: float,
) -> ModelVersion:
    """A version whose backend gives a scheduler of its own (an ensemble calling models)."""
    loaded = ModelVersion(
        name=name,
        version=version,
        config=config,
        spec=spec,
        scheduler=scheduler,
        stats=stats,
    )
    loaded.load_seconds = time.perf_counter() - started
    log.info("loaded model '%s' version %d (%s)", name, version, config.platform or "scheduler")
    return loaded


def _folder_bytes(folder: Path) -> int:
    total = 0
    for path in folder.rglob("*"):
        try:
            if path.is_file():
                total += path.stat().st_size
        except OSError:
            continue
    return total


def uses_processes(backend: Backend, parameters: dict[str, str]) -> bool:
    """Whether the model's instances are model processes: Python models always, any other
    model when its config sets ``process_instances``."""
    wanted = bool_parameter(parameters, PROCESS_PARAMETER)
    if backend.processes_only:
        if PROCESS_PARAMETER in parameters and not wanted:
            raise ConfigError(
                f"{backend.name} models always run in model processes "
                f"({PROCESS_PARAMETER} cannot be false)"
            )
        return True
    return wanted


def process_recipe(
    backend: Backend,
    version_dir: Path,
    config: ModelConfig,
    placement: InstancePlacement,
    label: str,
) -> ProcessRecipe:
    """How a model process builds this instance: the backend's own recipe if it has one."""
    own = backend.process_recipe(version_dir, config, placement)
    if own is not None:
        return own
    return backend_recipe(backend, version_dir, config, placement, label)


def _thread_instances(
    backend: Backend,
    version_dir: Path,
    config: ModelConfig,
    where: list[InstancePlacement],
    label: str,
    grants: Grants,
) -> ThreadInstances:
    def build(instance: int) -> Executor:
        with granted(grants):  # also when an instance is rebuilt later, on another thread
            return build_executor(backend, version_dir, config, where[instance], label)

    executors: list[Executor] = []
    try:
        for i in range(len(where)):
            executors.append(build(i))
    except Exception:
        for executor in executors:
            executor.close()
        raise
    return ThreadInstances(label, executors, build)


def close_now(pool: Instances) -> None:
    """Close instances from a loading thread (no event loop runs here)."""
    import asyncio

    asyncio.run(pool.close())


def placements(
    grouped: list[tuple[ModelInstanceGroup, list[tuple[str, int]]]],
) -> list[InstancePlacement]:
    """One placement per execution instance (``group_devices``)."""
    wanted = [(kind, device) for _, where in grouped for kind, device in where]
    return [
        InstancePlacement(kind, device, len(wanted), index)
        for index, (kind, device) in enumerate(wanted)
    ]


def group_devices(
    config: ModelConfig, backend: Backend
) -> list[tuple[ModelInstanceGroup, list[tuple[str, int]]]]:
    """Each instance group with the (kind, device) of each of its instances, in order."""
    groups = list(config.instance_group) or [ModelInstanceGroup(count=1)]
    has_gpu = backend.gpu_available()
    found: list[tuple[ModelInstanceGroup, list[tuple[str, int]]]] = []
    for group in groups:
        count = group.count or 1
        kind = "CPU"
        if group.kind == ModelInstanceGroup.KIND_GPU and not has_gpu:
            log.warning(
                "model '%s' asks for KIND_GPU but no GPU is available; using the CPU", config.name
            )
        elif group.kind in (ModelInstanceGroup.KIND_GPU, ModelInstanceGroup.KIND_AUTO) and has_gpu:
            kind = "GPU"
        devices = list(group.gpus) if kind == "GPU" and group.gpus else [0]
        found.append((group, [(kind, device) for device in devices for _ in range(count)]))
    return found
