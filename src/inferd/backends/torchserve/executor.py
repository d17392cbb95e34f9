"""Runs a TorchServe handler in its worker process: a batch of requests in, one answer each.

The handler is loaded as TorchServe loads it: ``handler.py`` (or ``module:function``) from the
unpacked archive, which is the working directory and on ``sys.path``, after the ``ts``
package of ``compat/`` (``sys.path[0]``). A module with the function is called as is
(``handle(None, context)`` initializes it); otherwise its one class is instantiated and gets
``initialize(context)``, then ``handle(data, context)`` per batch.

``data`` is one dict per request: each TorchServe parameter (``body``, or the multipart fields)
by name, decoded by its content type as TorchServe does (JSON parsed, text as ``str``, anything
else as ``bytearray``). Answers are encoded as TorchServe encodes them. A handler that raises
fails the whole batch as TorchServe answers it: ``PredictionException``'s code and message,
507 "Out of resources" for a MemoryError, else 503 "Prediction failed"; the worker lives on.
"""

from __future__ import annotations

import functools
import gc
import importlib
import io
import json
import logging
import os
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from inferd.backends import process
from inferd.backends.python.modelfile import where
from inferd.backends.torchserve.settings import HEADERS, NAMES, TORCHSERVE_VERSION, TYPES
from inferd.backends.work import Executed, Result, Work
from inferd.core.errors import ModelFailed, ModelLoadError

log = logging.getLogger("inferd.torchserve")

COMPAT = Path(__file__).parent / "compat"
# TorchServe's built-in handlers, which inferd does not ship, and the package each needs.
BUILTIN_HANDLERS = {
    "image_classifier": "torchvision",
    "image_segmenter": "torchvision",
    "object_detector": "torchvision",
    "vision_handler": "torchvision",
    "densenet_handler": "torchvision",
    "dali_image_classifier": "nvidia.dali",
    "text_classifier": "torchtext",
    "text_handler": "torchtext",
}

GC_THRESHOLD = 10_000
METRICS_FLUSH_S = 1.0  # a worker sends its handler's metrics at most this often
EXIT_TIMED_OUT = 4  # the worker's exit status when its handler outlived responseTimeout
Entry = Callable[[Any, Any], Any]
Initialize = Callable[[Any], Any]


def torchserve_executor(
    model_dir: str,
    manifest_json: str,
    handler: str,
    model_name: str,
    model_version: str,
    version: str,
    batch_size: int,
    model_yaml_json: str,
    index: int,
    response_timeout_s: float = 0,
) -> TorchServeExecutor:
    """The executor of one instance (a worker process's recipe calls this)."""
    return TorchServeExecutor(
        model_dir,
        json.loads(manifest_json),
        handler,
        model_name,
        model_version,
        f"{model_name}/{version}",
        batch_size,
        json.loads(model_yaml_json),
        response_timeout_s,
    )


def _import_handler(handler: str, model_dir: Path, label: str) -> tuple[ModuleType, str]:
    """The handler's module and entry function name ("" : none named)."""
    module_name, _, function = handler.partition(":")
    if module_name.endswith(".py"):
        module_name = module_name[:-3]
    module_name = module_name.split("/")[-1]
    own = model_dir / f"{module_name}.py"
    if own.is_file() or (model_dir / module_name).is_dir():
        try:
            return importlib.import_module(module_name), function
        except BaseException as exc:
            raise ModelLoadError(
                f"model '{label}': handler {own.name} does not import: {where(exc, own)}"
            ) from None
    needs = BUILTIN_HANDLERS.get(module_name)
    if needs is not None:
        try:
            importlib.import_module(needs)
        except ImportError:
            raise ModelLoadError(
                f"model '{label}': the handler '{module_name}' is one of TorchServe's built-in "
                f"handlers, which needs {needs}: it is not installed in the model's Python "
                f"(pip install {needs.split('.')[0]})"
            ) from None
        raise ModelLoadError(
            f"model '{label}': inferd does not ship TorchServe's built-in handler "
            f"'{module_name}'; put the handler's file in the archive (torch-model-archiver "
            "--handler path/to/handler.py)"
        )
    try:
        return importlib.import_module(f"ts.torch_handler.{module_name}"), function
    except ImportError:
        raise ModelLoadError(
            f"model '{label}': handler '{handler}' is neither a file of the archive nor a "
            "handler of the ts package"
        ) from None


def load_entry(module: ModuleType, function: str, label: str) -> tuple[Entry, Initialize]:
    """``(handle, initialize)``: a module's function, or its one class's methods."""
    name = function or "handle"
    found = getattr(module, name, None)
    if callable(found):
        entry: Entry = found
        return entry, lambda context: entry(None, context)
    util = importlib.import_module("ts.utils.util")  # the compat package, in the worker
    classes = util.list_classes_from_module(module)
    if len(classes) != 1:
        raise ModelLoadError(
            f"model '{label}': handler {module.__name__} must define a function '{name}' or "
            f"exactly one class (it defines {len(classes)})"
        )
    service = classes[0]()
    handle = getattr(service, "handle", None)
    if not callable(handle):
        raise ModelLoadError(f"model '{label}': {classes[0].__name__} has no handle()")
    initialize = getattr(service, "initialize", None)
    return handle, initialize if callable(initialize) else (lambda context: None)


def decode_value(value: bytes | bytearray, content_type: str, decode: bool) -> Any:
    """A parameter's value as TorchServe hands it over (a bytearray as is: the worker read it
    out of shared memory as one, its only copy)."""
    if decode and content_type == "application/json":
        try:
            return json.loads(value.decode("utf-8"))
        except ValueError:
            log.warning("Failed json decoding of input data. Forwarding encoded payload")
    elif decode and content_type.startswith("text"):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            log.warning("Failed utf-8 decoding of input data. Forwarding encoded payload")
    return value if isinstance(value, bytearray) else bytearray(value)


def encode_answer(value: Any) -> bytes:
    """An answer's bytes as TorchServe sends them (TypeError: it cannot)."""
    if isinstance(value, bytes | bytearray):
        return bytes(value)
    if isinstance(value, str):
        return value.encode("utf-8")
    kind = type(value)
    if kind is int:  # a class index: json.dumps(indent=2) writes int's repr
        return int.__repr__(value).encode()
    if kind is list and all(type(item) is int for item in value):
        # class indices (postprocess's usual ``argmax(1).tolist()`` row): what json.dumps
        # with indent=2 writes, without its pure-Python indenting encoder
        if not value:
            return b"[]"
        return ("[\n  " + ",\n  ".join(map(int.__repr__, value)) + "\n]").encode()
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        buffer = io.BytesIO()
        torch.save(value, buffer)
        return buffer.getvalue()
    return json.dumps(value, indent=2).encode("utf-8")


class Watchdog:
    """TorchServe's ``responseTimeout``: a handler that has not answered a batch within it has
    its worker process ended (the server answers "Worker died." and starts a new worker).

    A thread of its own looks a few times per timeout (at most once a second) at when the
    running batch started: arming and disarming are an attribute each, no lock, no wake-up."""

    def __init__(self, timeout_s: float, label: str) -> None:
        self.timeout_s = timeout_s
        self.label = label
        self.started: float | None = None  # when the running batch reached the handler
        self._thread: threading.Thread | None = None

    def arm(self) -> None:
        self.started = time.monotonic()
        if self._thread is None:
            self._thread = threading.Thread(target=self._watch, name="responseTimeout", daemon=True)
            self._thread.start()

    def disarm(self) -> None:
        self.started = None

    def _watch(self) -> None:
        step = min(max(self.timeout_s / 4, 0.05), 1.0)
        while True:
            time.sleep(step)
            started = self.started
            if started is not None and time.monotonic() - started > self.timeout_s:
                log.error(
                    "model '%s': the handler did not answer within its responseTimeout of "
                    "%g s: ending this worker",
                    self.label,
                    self.timeout_s,
                )
                sys.stderr.flush()
                os._exit(EXIT_TIMED_OUT)


class TorchServeExecutor:
    """One instance of a TorchServe handler."""

    inline = False
    writable_bytes = True  # the worker reads bodies out of shared memory as bytearrays

    def __init__(
        self,
        model_dir: str,
        manifest: dict[str, Any],
        handler: str,
        model_name: str,
        model_version: str,
        label: str,
        batch_size: int,
        model_yaml: dict[str, Any],
        response_timeout_s: float = 0,
    ) -> None:
        self.label = label
        # This process holds one handler: young-generation collections as rare as the
        # server's own (its --gc-threshold), reference counting frees a batch's objects.
        gc.set_threshold(GC_THRESHOLD, *gc.get_threshold()[1:])
        self._watchdog = Watchdog(response_timeout_s, label) if response_timeout_s > 0 else None
        self.model_version = model_version
        folder = Path(model_dir)
        for path in (str(folder), str(COMPAT)):
            if path in sys.path:
                sys.path.remove(path)
            sys.path.insert(0, path)  # compat first: its ts wins over any other
        os.chdir(folder)
        ts_context = importlib.import_module("ts.context")
        self._processor = ts_context.RequestProcessor
        self._prediction_exception: type[BaseException] = importlib.import_module(
            "ts.utils.util"
        ).PredictionException
        self.metrics = importlib.import_module("ts.metrics.metric_cache").MetricsCache(model_name)
        self._metrics: dict[tuple[Any, ...], list[Any]] = {}  # totals not sent yet
        self._flushed = -METRICS_FLUSH_S  # the first batch's metrics go at once
        self.context = ts_context.Context(
            model_name,
            model_dir,
            manifest,
            batch_size,
            None,
            TORCHSERVE_VERSION,
            True,
            self.metrics,
            model_yaml,
        )
        self._decode = os.environ.get("TS_DECODE_INPUT_REQUEST", "true") != "false"
        module, function = _import_handler(handler, folder, label)
        self._handle, initialize = load_entry(module, function, label)
        self._path = Path(module.__file__ or handler)
        self.metrics.set_request_ids(str(uuid.uuid4()))
        try:
            initialize(self.context)
        except Exception as exc:
            raise ModelLoadError(
                f"model '{label}': the handler's initialize raised {where(exc, self._path)}"
            ) from None

    def _requests(
        self, batch: Sequence[Work]
    ) -> tuple[list[dict[str, Any]], list[Any], dict[int, str]]:
        make_processor = self._processor
        data: list[dict[str, Any]] = []
        processors: list[Any] = []
        ids: dict[int, str] = {}
        decode = self._decode
        for work in batch:
            values = work.inputs["body"]
            parameters = work.parameters
            count = values.shape[-1] if values.ndim else 1
            names = parameters.get(NAMES) or [
                "body" if i == 0 else f"body{i}" for i in range(count)
            ]
            types = parameters.get(TYPES) or [""] * count
            headers = parameters.get(HEADERS) or {}
            rows = values.reshape(-1, count) if values.ndim else values.reshape(1, 1)
            for r, row in enumerate(rows):
                request: dict[str, Any] = {}
                meta: dict[str, Any] = {}
                for name, content_type, value in zip(names, types, row, strict=False):
                    request[name] = decode_value(value, content_type, decode)
                    meta[name] = {"content-type": content_type}
                meta.update(headers)
                ids[len(data)] = work.request_id if len(rows) == 1 else f"{work.request_id}:{r}"
                data.append(request)
                processors.append(make_processor(meta))
        return data, processors, ids

    def execute(self, batch: Sequence[Work]) -> Executed:
        started = time.perf_counter_ns()
        data, processors, ids = self._requests(batch)
        context = self.context
        context.request_ids = ids
        context.request_processor = processors
        context._send_intermediate = functools.partial(self._intermediate, batch, processors)
        self.metrics.set_request_ids(ids)
        built = time.perf_counter_ns()
        watchdog = self._watchdog
        if watchdog is not None:
            watchdog.arm()
        try:
            answers = self._handle(data, context)
        except MemoryError:
            log.error("model '%s': out of memory", self.label, exc_info=True)
            return self._failed(batch, ModelFailed("Out of resources", 507), started, built)
        except Exception as exc:
            if isinstance(exc, self._prediction_exception):
                log.error("model '%s': prediction error", self.label, exc_info=True)
                failed = ModelFailed(str(exc.message), int(exc.error_code))  # type: ignore[attr-defined]
            elif "CUDA" in str(exc):
                log.error("model '%s': CUDA out of memory", self.label, exc_info=True)
                failed = ModelFailed("Out of resources", 507)
            else:
                log.warning(
                    "model '%s': invoking the handler failed: %s\n%s",
                    self.label,
                    where(exc, self._path),
                    traceback.format_exc(),
                )
                failed = ModelFailed("Prediction failed", 503)
            return self._failed(batch, failed, started, built)
        finally:
            context._send_intermediate = None
            if watchdog is not None:
                watchdog.disarm()
        executed = time.perf_counter_ns()
        if not isinstance(answers, list):
            log.warning("model '%s': invalid return type %s", self.label, type(answers))
            return self._failed(
                batch, ModelFailed("Invalid model predict output", 503), started, built
            )
        if len(answers) != len(data):
            log.warning(
                "model '%s': %d answers for a batch of %d", self.label, len(answers), len(data)
            )
            failed = ModelFailed("number of batch response mismatched", 503)
            return self._failed(batch, failed, started, built)
        try:
            encoded = [encode_answer(a) for a in answers]
        except TypeError:
            log.warning("model '%s': unable to serialize its output", self.label, exc_info=True)
            failed = ModelFailed("Unsupported model output data type.", 503)
            return self._failed(batch, failed, started, built)
        self.metrics.add_time("PredictionTime", round((executed - built) / 1e6, 2))
        results: list[Result] = []
        offset = 0
        for work in batch:
            rows = max(work.rows, 1)
            prediction = np.empty((rows, 1), dtype=object)
            meta = np.empty((rows, 1), dtype=object)
            for r in range(rows):
                prediction[r, 0] = encoded[offset + r]
                meta[r, 0] = _meta(processors[offset + r])
            offset += rows
            results.append({"prediction": prediction, "meta": meta})
        self._send_metrics()
        return Executed(
            results, built - started, executed - built, time.perf_counter_ns() - executed
        )

    def _intermediate(
        self, batch: Sequence[Work], processors: list[Any], answers: list[Any], ids: Any
    ) -> None:
        """A streaming handler's answers before its final ones, sent to the server at once
        (requests of one row each: the usual; a request of several rows gets its rows' answers
        in the final one only)."""
        host = process.current()
        if host is None or len(answers) != len(processors) or len(batch) != len(processors):
            return
        for index, answer in enumerate(answers):
            prediction = np.empty((1, 1), dtype=object)
            meta = np.empty((1, 1), dtype=object)
            prediction[0, 0] = encode_answer(answer)
            meta[0, 0] = _meta(processors[index])
            host.send_response(index, {"prediction": prediction, "meta": meta}, False)

    def _failed(
        self, batch: Sequence[Work], error: ModelFailed, started: int, built: int
    ) -> Executed:
        self._send_metrics()
        return Executed([error] * len(batch), built - started, time.perf_counter_ns() - built)

    def _send_metrics(self) -> None:
        """Add the batch's metric records up, and send the totals to the server at most every
        METRICS_FLUSH_S (one message per batch would cost as much as the answer itself)."""
        pending = self._metrics
        for name, kind, unit, labels, value in self.metrics.drain():
            key = (name, kind, unit, labels)
            found = pending.get(key)
            if found is None:
                pending[key] = [value, 1]
            elif kind == "gauge":
                found[0] = value
            else:
                found[0] += value
                found[1] += 1
        now = time.monotonic()
        if not pending or now - self._flushed < METRICS_FLUSH_S:
            return
        host = process.current()
        if host is not None:
            records = [(*key, value, count) for key, (value, count) in pending.items()]
            host.send_metrics(self.label, records)
        pending.clear()
        self._flushed = now

    def close(self) -> None:
        pass


def _meta(processor: Any) -> bytes:
    """What the handler set on one response: JSON, or b"" when it set nothing."""
    status = processor.get_response_status_code()
    phrase = processor.get_response_status_phrase()
    headers = processor.get_response_headers()
    if status == 200 and not phrase and not headers:
        return b""
    return json.dumps({"status": status, "phrase": phrase or "", "headers": headers}).encode()
