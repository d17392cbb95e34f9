"""The first fields of ``Settings``: the repository a server serves, and where and how it
listens (its HTTP and gRPC ports, its serving processes, the limits of a gRPC connection)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


def opt(help_text: str, **extra: Any) -> Any:
    """A field's metadata: its help text, and how its flag takes values (``repeat``...)."""
    return {"help": help_text, **extra}


@dataclass(slots=True)
class ListenSettings:
    model_repository: list[str] = field(
        default_factory=list,
        metadata=opt(
            "model repository: a folder or s3://bucket/prefix; repeat for several", repeat=True
        ),
    )
    model_name: str = field(
        default="",
        metadata=opt(
            "serve the --model-repository folder as one model of this name: its numbered version "
            "folders, or its files as version 1 (a single model as KServe's storage initializer "
            "and TF Serving's --model_base_path lay it out); a local folder"
        ),
    )
    http_address: str = field(default="0.0.0.0", metadata=opt("address the HTTP server binds"))
    http_port: int = field(default=8080, metadata=opt("HTTP port (KServe v2 and TF Serving REST)"))
    http_workers: str = field(
        default="auto",
        metadata=opt(
            "serving processes sharing the HTTP and gRPC ports (SO_REUSEPORT): worker 0 loads "
            "and runs every model (one copy, one batcher per model); the others decode and "
            "encode requests and forward each to it. A number, or auto: the usable CPU cores from "
            "three up (one process below three: it keeps two cores busy, and the hop to worker 0 "
            "costs more than it gives), fewer if the other workers (256 MiB each) would not fit "
            "in half the available memory; 1 with lazy serving (--model-memory-budget), where a "
            "number N shares the one budget, worker 0's: it loads the models the other "
            "workers' requests need"
        ),
    )
    http_workers_copy_bytes: int = field(
        default=1 << 20,
        metadata=opt(
            "with several --http-workers: an ONNX Runtime or OpenVINO model of at most this "
            "many bytes on disk that runs on threads without batching (no dynamic or sequence "
            "batcher, no response cache) is also loaded by every other worker, since running "
            "it costs less than forwarding it; 0: every model is loaded once (as with lazy "
            "serving, whose budget counts the models once, in worker 0)"
        ),
    )
    allow_grpc: bool = field(default=True, metadata=opt("serve gRPC (KServe v2 / Triton)"))
    grpc_address: str = field(default="0.0.0.0", metadata=opt("address the gRPC server binds"))
    grpc_port: int = field(default=8081, metadata=opt("gRPC port (KServe v2 / Triton)"))
    grpc_server: str = field(
        default="auto",
        metadata=opt(
            "gRPC server: native (HTTP/2 in libnghttp2, about the CPU cost of an HTTP request), "
            "grpcio, or auto (native when libnghttp2 loads, else grpcio)"
        ),
    )
    grpc_max_message_bytes: int = field(
        default=128 * 1024 * 1024,
        metadata=opt("largest gRPC message accepted or sent"),
    )
    # ---- gRPC connection limits (docs/security/limits.md); Triton's names where it has one
    grpc_max_concurrent_streams: int = field(
        default=100,
        metadata=opt("calls in progress on one gRPC connection (HTTP/2 streams, advertised)"),
    )
    grpc_max_header_list_bytes: int = field(
        default=16 * 1024,
        metadata=opt(
            "largest header list (metadata) of a gRPC call, advertised and enforced as it "
            "arrives; past it the call's stream is reset"
        ),
    )
    grpc_header_timeout_s: float = field(
        default=10.0,
        metadata=opt(
            "seconds a new gRPC connection has to send its HTTP/2 preface, and a header "
            "block to arrive whole; else the connection is closed"
        ),
    )
    grpc_body_timeout_s: float = field(
        default=60.0,
        metadata=opt(
            "seconds a gRPC request may stall mid-message (a unary call: before its end) "
            "before its stream is reset with DEADLINE_EXCEEDED (native server)"
        ),
    )
    grpc_idle_timeout_s: float = field(
        default=300.0,
        metadata=opt("seconds a gRPC connection with no call open stays before GOAWAY and close"),
    )
    grpc_keepalive_time: int = field(
        default=7_200_000,
        metadata=opt(
            "Triton's name, in ms: a gRPC connection silent this long is sent a keep-alive ping"
        ),
    )
    grpc_keepalive_timeout: int = field(
        default=20_000,
        metadata=opt("Triton's name, in ms: a keep-alive ping unanswered this long closes"),
    )
    grpc_keepalive_permit_without_calls: bool = field(
        default=False,
        metadata=opt("Triton's name: clients may send keep-alive pings with no call open"),
    )
    grpc_http2_min_recv_ping_interval_without_data: int = field(
        default=300_000,
        metadata=opt(
            "Triton's name, in ms: client pings closer than this, with no data sent between, "
            "count as strikes"
        ),
    )
    grpc_http2_max_ping_strikes: int = field(
        default=2,
        metadata=opt(
            "Triton's name: ping strikes tolerated; past them GOAWAY (too_many_pings) and close"
        ),
    )
    tfserving_tensor_content: bool = field(
        default=False,
        metadata=opt(
            "TF Serving gRPC Predict answers in tensor_content instead of typed value fields "
            "(TF Serving's --enable_serialization_as_tensor_content)"
        ),
    )
