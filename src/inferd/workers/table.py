"""The model table: what the model host tells the frontend workers about its models.

A frontend worker loads no model (tiny ones aside, ``workers.copies``). It knows each model from
the host's record of it (states, reasons, each loaded version's completed config, class labels
and signatures, the routing policy), sent as plain data, and builds a stand-in ``ModelVersion``
per version whose scheduler forwards each request to the host (``workers.forward``). Metadata,
configs, readiness, the index and request validation are then answered by the frontend alone
(``workers.mirror``).

``Fingerprints`` says which records changed since they were last sent: a record is replaced
whole on most changes, but a retired version's state is updated in place, so the host compares
what it sent with what it has rather than watching the registry.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from inferd.backends.work import Scheduler
from inferd.config.model_config_pb2 import ModelConfig
from inferd.config.spec import SignatureSpec, build_spec, signature_spec
from inferd.core.datatypes import BY_NAME
from inferd.core.errors import NotFound
from inferd.plane.model import ModelState, ModelVersion
from inferd.plane.registry import ModelRecord, Registry
from inferd.repository import routing_file
from inferd.workers.copies import copyable
from inferd.workers.rows import joinable_rows

Doc = dict[str, Any]
# (model name, version number, rows that may travel as one, [the byte of its queue, the answer
# while it is full] or None) -> the scheduler that forwards the version's requests.
SchedulerFactory = Callable[[str, int, int, "list[Any] | None"], Scheduler]


# --------------------------------------------------------------------------- the host's side


class Serials:
    """A number for each loaded version object, so a frontend keeps its stand-in (and its
    statistics) while the host keeps the version, and builds a new one after a reload.
    ``queue_slot``: the byte that shows the frontends when the version's queue is full
    (``workers.queues``)."""

    def __init__(self, queue_slot: Callable[[ModelVersion], int | None] | None = None) -> None:
        self._serials: weakref.WeakKeyDictionary[ModelVersion, int] = weakref.WeakKeyDictionary()
        self._next = 1
        self.queue_slot = queue_slot or _no_slot

    def __call__(self, version: ModelVersion) -> int:
        found = self._serials.get(version)
        if found is None:
            found = self._serials[version] = self._next
            self._next += 1
        return found


def _no_slot(version: ModelVersion) -> None:
    return None


def _queue_doc(version: ModelVersion, slot: int | None) -> list[Any] | None:
    """[the queue's byte, the answer while it is full], for a queue-limited version."""
    if slot is None:
        return None
    full_error = getattr(version.scheduler, "full_error", None)
    return [slot, full_error().message if full_error is not None else ""]


def _tensors(spec_tensors: Iterable[Any], batched: bool) -> list[list[Any]]:
    lead = [-1] if batched else []
    return [[t.name, t.datatype.name, lead + list(t.dims)] for t in spec_tensors]


def _signature_doc(signature: SignatureSpec) -> list[Any]:
    batched = signature.spec.max_batch_size > 0
    return [
        signature.name,
        signature.method,
        _tensors(signature.spec.inputs, batched),
        _tensors(signature.spec.outputs, batched),
    ]


def version_doc(
    version: ModelVersion, serial: int, copy_bytes: int, queue_slot: int | None = None
) -> Doc:
    return {
        "version": version.version,
        "serial": serial,
        "config": version.config.SerializeToString(),
        "state": version.state.value,
        "instances": version.instance_count,
        "load_s": version.load_seconds,
        "labels": {name: list(labels) for name, labels in version.labels.items()},
        "signatures": [_signature_doc(s) for s in version.signatures.values()],
        # Where a frontend loads its own copy from (workers.copies), when it runs one.
        "copy": version.folder if copyable(version, copy_bytes) else None,
        # How many rows of compatible requests may travel as one (workers.rows).
        "rows": joinable_rows(version),
        # The byte that says when the version's queue is full (workers.queues).
        "queue": _queue_doc(version, queue_slot),
    }


def record_doc(
    record: ModelRecord, registry: Registry, serials: Serials, copy_bytes: int = 0
) -> Doc:
    routing = registry.routing_of(record.name)
    return {
        "name": record.name,
        "state": record.state.value,
        "reason": record.reason,
        "status": [[s.version, s.state.value, s.reason] for s in record.status.values()],
        "versions": [
            version_doc(v, serials(v), copy_bytes, serials.queue_slot(v))
            for v in record.versions.values()
        ],
        "config": record.config.SerializeToString() if record.config is not None else None,
        "routing": None
        if routing is None
        else routing_file.document(routing.policy, set(routing_file.KEYS)),
    }


def fingerprint(record: ModelRecord, registry: Registry, serials: Serials) -> tuple[Any, ...]:
    """What a frontend's copy of the record depends on: equal fingerprints, nothing to send."""
    routing = registry.routing_of(record.name)
    return (
        record.state,
        record.reason,
        tuple(record.status.values()),
        tuple((n, serials(v), v.state) for n, v in record.versions.items()),
        id(record.config),
        None if routing is None else routing.policy,
    )


def _record(registry: Registry, name: str) -> ModelRecord | None:
    try:
        return registry.record(name)
    except NotFound:
        return None


@dataclass(slots=True)
class Fingerprints:
    """The fingerprint of every record as last sent to the frontends."""

    copy_bytes: int = 0  # --http-workers-copy-bytes
    sent: dict[str, tuple[Any, ...]] = field(default_factory=dict)

    def changes(
        self, registry: Registry, serials: Serials, names: Iterable[str] | None = None
    ) -> tuple[list[Doc], list[str]]:
        """The records that changed since they were last sent (as documents), and the names
        gone; of ``names`` only, when given."""
        if names is None:
            records = registry.records()
            candidates = list(self.sent)
        else:
            candidates = list(names)
            found = (_record(registry, name) for name in candidates)
            records = [r for r in found if r is not None]
        docs: list[Doc] = []
        seen: set[str] = set()
        for record in records:
            seen.add(record.name)
            mark = fingerprint(record, registry, serials)
            if self.sent.get(record.name) != mark:
                self.sent[record.name] = mark
                docs.append(record_doc(record, registry, serials, self.copy_bytes))
        gone = [name for name in candidates if name in self.sent and name not in seen]
        for name in gone:
            del self.sent[name]
        return docs, gone

    def everything(self, registry: Registry, serials: Serials) -> list[Doc]:
        """Every record as a document (a frontend that just connected, once the others have
        the changes: ``changes`` is the mark of what was sent)."""
        docs = [record_doc(r, registry, serials, self.copy_bytes) for r in registry.records()]
        self.sent = {r.name: fingerprint(r, registry, serials) for r in registry.records()}
        return docs


# --------------------------------------------------------------------------- the frontend's side


def config_of(data: bytes) -> ModelConfig:
    config = ModelConfig()
    config.ParseFromString(data)
    return config


def _signature(config: ModelConfig, doc: list[Any]) -> SignatureSpec:
    name, method, inputs, outputs = doc

    def tensors(items: list[list[Any]]) -> list[tuple[str, Any, tuple[int, ...]]]:
        return [(t, BY_NAME[dtype], tuple(dims)) for t, dtype, dims in items]

    return signature_spec(config, name, method, tensors(inputs), tensors(outputs))


def stand_in(name: str, doc: Doc, schedulers: SchedulerFactory) -> ModelVersion:
    """A frontend's version of a model the host serves: its requests go to the host, and
    so do response cache look-ups (the server's one cache is the host's)."""
    config = config_of(doc["config"])
    number = int(doc["version"])
    version = ModelVersion(
        name=name,
        version=number,
        config=config,
        spec=build_spec(config),
        scheduler=schedulers(name, number, int(doc["rows"]), doc.get("queue")),
        instance_count=int(doc["instances"]),
        load_seconds=float(doc["load_s"]),
        state=ModelState(doc["state"]),
        signatures={s[0]: _signature(config, s) for s in doc["signatures"]},
        labels={out: tuple(labels) for out, labels in doc["labels"].items()},
    )
    return version
