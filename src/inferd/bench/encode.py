"""Request bodies encoded once, before any load: HTTP v2 (binary or JSON), gRPC, TF Serving REST.

An HTTP request is kept as its complete bytes (request line, headers and body), so a
worker only writes it to a socket; a gRPC request is kept as a serialized ModelInferRequest.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from inferd.bench.inputs import Sample
from inferd.bench.options import BenchError, BenchOptions, Target
from inferd.protocols import codecs

GRPC_INFER_METHOD = "/inference.GRPCInferenceService/ModelInfer"
HEADER_LENGTH = "Inference-Header-Content-Length"


@dataclass(frozen=True, slots=True)
class Workload:
    """Everything a worker process needs to send requests to one target."""

    protocol: str  # "http" | "grpc"
    host: str
    port: int
    requests: tuple[bytes, ...]  # sent in turn
    encoding: str  # "v2 binary", "v2 json", "grpc", "tfserving json": for the report


def build(options: BenchOptions, target: Target, samples: list[Sample]) -> Workload:
    if options.protocol == "grpc":
        bodies = tuple(grpc_body(options.model, options.version, s) for s in samples)
        return Workload("grpc", target.host, target.port, bodies, "grpc")
    encoded: list[tuple[bytes, str, int | None]] = []
    if options.service_kind == "tfserving":
        path = _path(target, "/v1", options) + ":predict"
        encoded += [(tfserving_body(s), "application/json", None) for s in samples]
        encoding = "tfserving json"
    else:
        path = _path(target, "/v2", options) + "/infer"
        for sample in samples:
            if options.binary:
                body, length = v2_binary_body(sample)
                encoded.append((body, "application/octet-stream", length))
            else:
                encoded.append((v2_json_body(sample), "application/json", None))
        encoding = "v2 binary" if options.binary else "v2 json"
    host_header = f"{target.host}:{target.port}"
    requests = tuple(
        http_request(path, host_header, body, ctype, length) for body, ctype, length in encoded
    )
    return Workload("http", target.host, target.port, requests, encoding)


def _path(target: Target, prefix: str, options: BenchOptions) -> str:
    version = f"/versions/{options.version}" if options.version else ""
    return f"{target.base_path}{prefix}/models/{options.model}{version}"


def http_request(
    path: str, host: str, body: bytes, content_type: str, header_length: int | None
) -> bytes:
    lines = [
        f"POST {path} HTTP/1.1",
        f"Host: {host}",
        f"Content-Type: {content_type}",
        f"Content-Length: {len(body)}",
    ]
    if header_length is not None:
        lines.append(f"{HEADER_LENGTH}: {header_length}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def _input_header(tensor: Any) -> dict[str, Any]:
    return {
        "name": tensor.name,
        "shape": list(tensor.array.shape),
        "datatype": tensor.datatype.name,
    }


def v2_json_body(sample: Sample) -> bytes:
    inputs = []
    for tensor in sample:
        if tensor.datatype.name == "BF16":
            raise BenchError(f"input '{tensor.name}': BF16 needs binary data (drop --json)")
        inputs.append(
            {**_input_header(tensor), "data": codecs.to_json_data(tensor.name, tensor.array)}
        )
    return orjson.dumps({"inputs": inputs}, option=orjson.OPT_SERIALIZE_NUMPY)


def v2_binary_body(sample: Sample) -> tuple[bytes, int]:
    """The binary tensor extension: a JSON header, then raw tensors; and the header length."""
    raws = [codecs.to_raw(t.array) for t in sample]
    inputs = [
        {**_input_header(t), "parameters": {"binary_data_size": len(raw)}}
        for t, raw in zip(sample, raws, strict=True)
    ]
    header = orjson.dumps({"inputs": inputs, "parameters": {"binary_data_output": True}})
    return b"".join([header, *raws]), len(header)


def grpc_body(model: str, version: str, sample: Sample) -> bytes:
    from inferd.protocols import grpc_service_pb2 as pb

    request = pb.ModelInferRequest(model_name=model, model_version=version)
    for tensor in sample:
        request.inputs.add(
            name=tensor.name, datatype=tensor.datatype.name, shape=list(tensor.array.shape)
        )
        request.raw_input_contents.append(bytes(codecs.to_raw(tensor.array)))
    body: bytes = request.SerializeToString()
    return body


def tfserving_body(sample: Sample) -> bytes:
    """``{"instances": [...]}``: rows of the one input, or one object per row for several."""
    values = {t.name: _tf_json_value(t.name, t.array) for t in sample}
    if len(values) == 1:
        instances: Any = next(iter(values.values()))
    else:
        rows = {t.array.shape[0] if t.array.ndim else 1 for t in sample}
        if len(rows) != 1 or any(t.array.ndim == 0 for t in sample):
            raise BenchError("TF Serving row format needs the same batch size for every input")
        instances = [{n: v[i] for n, v in values.items()} for i in range(rows.pop())]
    return orjson.dumps({"instances": instances}, option=orjson.OPT_SERIALIZE_NUMPY)


def _tf_json_value(name: str, array: np.ndarray) -> Any:
    """A value orjson writes as (nested) JSON: a numeric array, or nested lists of str."""
    if array.dtype == object:
        texts = codecs.to_json_data(name, array)
        return np.array(texts, dtype=object).reshape(array.shape).tolist()
    if array.dtype.itemsize == 2 and array.dtype.kind not in "iub":
        return array.astype(np.float32)  # FP16 / BF16 as JSON numbers
    return array
