"""What the server says about the model (inputs, batching) and its statistics, before and after.

KServe v2 over HTTP (``GET /v2/models/{m}``, ``/config``, ``/stats``) or gRPC (ModelMetadata,
ModelConfig, ModelStatistics), and TF Serving REST (``GET /v1/models/{m}/metadata``).
Blocking calls: the runner asks these between load levels, never while measuring.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from typing import Any, Protocol

import orjson

from inferd.bench.options import BenchError, BenchOptions, Target
from inferd.bench.specs import ModelSpec, StatsSnapshot, TensorSpec, snapshot_from_doc

_TIMEOUT_S = 10.0


class ServerClient(Protocol):
    """The control-plane calls the bench makes; one implementation per protocol."""

    def model_spec(self) -> ModelSpec: ...

    def stats(self) -> StatsSnapshot | None: ...

    def close(self) -> None: ...


def connect(options: BenchOptions, target: Target) -> ServerClient:
    if options.protocol == "grpc":
        from inferd.bench.grpc_metadata import GrpcServerClient

        return GrpcServerClient(target, options.model, options.version)
    if options.service_kind == "tfserving":
        return TfServingClient(target, options.model, options.version)
    return V2HttpClient(target, options.model, options.version)


class _HttpJson:
    def __init__(self, target: Target) -> None:
        self.target = target

    def get(self, path: str) -> tuple[int, Any]:
        """Status and parsed JSON body; unreachable servers are a BenchError."""
        url = f"http://{self.target.host}:{self.target.port}{self.target.base_path}{path}"
        try:
            with urllib.request.urlopen(url, timeout=_TIMEOUT_S) as response:
                return response.status, _json(response.read())
        except urllib.error.HTTPError as exc:
            return exc.code, _json(exc.read())
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise BenchError(f"cannot reach {self.target.address}: {reason}") from None


def _json(body: bytes) -> Any:
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        return body.decode("utf-8", "replace").strip()[:200]


def _error_text(doc: Any) -> str:
    if isinstance(doc, dict) and "error" in doc:
        return str(doc["error"])
    return str(doc)[:200] or "no reason given"


def _model_path(prefix: str, model: str, version: str) -> str:
    return f"{prefix}/models/{model}" + (f"/versions/{version}" if version else "")


class V2HttpClient(_HttpJson):
    def __init__(self, target: Target, model: str, version: str) -> None:
        super().__init__(target)
        self.model, self.version = model, version
        self.path = _model_path("/v2", model, version)

    def model_spec(self) -> ModelSpec:
        status, doc = self.get(self.path)
        if status != 200 or not isinstance(doc, dict):
            raise BenchError(
                f"model '{self.model}' at {self.target.address}: HTTP {status}: {_error_text(doc)}"
            )
        inputs = tuple(
            TensorSpec(str(i["name"]), str(i["datatype"]), tuple(int(d) for d in i["shape"]))
            for i in doc.get("inputs") or []
            if isinstance(i, dict) and {"name", "datatype", "shape"} <= i.keys()
        )
        status, config = self.get(self.path + "/config")
        max_batch = None
        if status == 200 and isinstance(config, dict):
            config = config.get("config", config)  # KServe wraps it, Triton does not
            max_batch = int(config.get("max_batch_size", 0) or 0)
        return ModelSpec(self.model, self.version, inputs, max_batch)

    def stats(self) -> StatsSnapshot | None:
        try:
            status, doc = self.get(self.path + "/stats")
        except BenchError:
            return None  # the server went away; the load itself reports the errors
        return snapshot_from_doc(doc, self.version) if status == 200 else None

    def close(self) -> None:
        pass


_TF_DTYPES = {
    "DT_BOOL": "BOOL",
    "DT_UINT8": "UINT8",
    "DT_UINT16": "UINT16",
    "DT_UINT32": "UINT32",
    "DT_UINT64": "UINT64",
    "DT_INT8": "INT8",
    "DT_INT16": "INT16",
    "DT_INT32": "INT32",
    "DT_INT64": "INT64",
    "DT_HALF": "FP16",
    "DT_FLOAT": "FP32",
    "DT_DOUBLE": "FP64",
    "DT_BFLOAT16": "BF16",
    "DT_STRING": "BYTES",
}


class TfServingClient(_HttpJson):
    def __init__(self, target: Target, model: str, version: str) -> None:
        super().__init__(target)
        self.model, self.version = model, version

    def model_spec(self) -> ModelSpec:
        status, doc = self.get(_model_path("/v1", self.model, self.version) + "/metadata")
        if status != 200 or not isinstance(doc, dict):
            raise BenchError(
                f"model '{self.model}' at {self.target.address}: HTTP {status}: {_error_text(doc)}"
            )
        try:
            signatures = doc["metadata"]["signature_def"]["signature_def"]
            signature = signatures.get("serving_default") or next(iter(signatures.values()))
            inputs = tuple(
                TensorSpec(
                    name,
                    _TF_DTYPES.get(spec.get("dtype", ""), "FP32"),
                    tuple(int(d["size"]) for d in spec["tensor_shape"].get("dim", [])),
                )
                for name, spec in sorted(signature["inputs"].items())
            )
        except (KeyError, TypeError, ValueError, StopIteration, AttributeError):
            raise BenchError(
                f"model '{self.model}' at {self.target.address}: metadata has no usable "
                "serving signature"
            ) from None
        return ModelSpec(self.model, self.version, inputs, None)

    def stats(self) -> StatsSnapshot | None:
        return None

    def close(self) -> None:
        pass
