"""Where a v2 JSON request's Python cost goes: bytecodes per request, per function and per stage.

The server is built in this process on the demo ``half_plus_two`` and its RSGI entry point is
called directly with a fixed request (no socket, no granian), first to warm up, then under
``sys.settrace`` with opcode events, which count every bytecode the interpreter runs. Counts
are exact and repeat from run to run, unlike timings on a shared host. Tracing makes each call
about 50x slower, so the inline threshold is raised here to keep the model on the event loop,
as it is in a real run.

``--api tfs`` counts TF Serving's REST predict on the same model instead
(``{"instances": [1.0]}``), and ``--api binary`` a v2 request with binary tensors both ways (a
JSON header, then the input's raw bytes; ``binary_data_output`` asked), so the paths' costs can
be set side by side. ``--api torchserve`` counts TorchServe's ``POST /predictions/mnist`` with
a 28x28 PNG body on TorchServe's mnist example (``torchserve_side_by_side.py``'s archive): the
handler runs in its worker process as in a real run, so what is counted is the serving
process's side (route, body, hand-off, the answer's message and the reply), one request at a
time.

    PYTHONPATH=src .venv/bin/python benchmarks/request_opcodes.py [--requests 2000] [--functions 25]
        [--api v2|binary|tfs|torchserve]
"""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile
from pathlib import Path
from types import FrameType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.rsgi_stub import Protocol, Scope

BODY = b'{"inputs":[{"name":"x","shape":[1,1],"datatype":"FP32","data":[1.0]}]}'
# A binary tensor request: a JSON header (its length in a header), then x's four FP32 bytes.
BINARY_HEADER = (
    b'{"inputs":[{"name":"x","shape":[1,1],"datatype":"FP32",'
    b'"parameters":{"binary_data_size":4}}],"parameters":{"binary_data_output":true}}'
)
JSON = {"content-type": "application/json"}
BINARY = {
    "content-type": "application/octet-stream",
    "inference-header-content-length": str(len(BINARY_HEADER)),
}
# Each API's request: (path, body, headers, what the report calls it).
APIS = {
    "v2": ("/v2/models/half_plus_two/infer", BODY, JSON, "v2 JSON"),
    "binary": (
        "/v2/models/half_plus_two/infer",
        BINARY_HEADER + b"\x00\x00\x80\x3f",  # 1.0
        BINARY,
        "v2 binary tensors",
    ),
    "tfs": (
        "/v1/models/half_plus_two:predict",
        b'{"instances":[1.0]}',
        JSON,
        "TF Serving REST predict",
    ),
    # the body: torchserve_side_by_side.digit_png(), made when counting
    "torchserve": (
        "/predictions/mnist",
        b"",
        {"content-type": "application/octet-stream"},
        "TorchServe predictions (mnist, PNG body)",
    ),
}

# (stage, predicate on "file:function") in order: the first match names a function's stage.
STAGES: list[tuple[str, tuple[str, ...]]] = [
    ("access checks (Host, Origin, token)", ("http_guard.py:", "access.py:")),
    (
        "encode and send",
        (
            "v2/http.py:encode_response",
            "http.py:_send",
            "codecs.py:to_json_data",
            "codecs.py:to_raw",
            "v2/http.py:response_encoding",
            "tfserving/http.py:tf_json",
            "tfserving/http.py:_finite",
            "tfserving/http.py:_predictions",
            "tfserving/http.py:_json_value",
            "torchserve/models.py:_prediction",
        ),
    ),
    (
        "decode (v2 JSON body, datatypes, shapes, values)",
        (
            "v2/http.py:decode_request",
            "v2/http.py:_decode_inline",
            "v2/headers.py:",
            "v2/http.py:_split_body",
            "v2/http.py:_requested_outputs",
            "v2/http.py:json_object",
            "v2/http.py:parse_json",
            "codecs.py:",
            "datatypes.py:",
            "shm_tensors.py:",
            "tfserving/http.py:",
            "torchserve/forms.py:",
        ),
    ),
    (
        "HTTP edge (route, limits, body read and its deadline, client watch)",
        ("transport/http.py:", "deadlines.py:", "watch.py:", "asyncio/", "v2/http.py:admit"),
    ),
    ("v2 handler", ("v2/http.py:",)),
    ("TorchServe route and request", ("torchserve/http.py:", "torchserve/models.py:", "uuid.py")),
    (
        "hand-off to the worker process and its answer",
        ("processes.py:", "wire.py:", "channel.py:", "shm.py:", "process_slots.py:"),
    ),
    ("TF Serving target, signature and shapes", ("tfserving.py:",)),
    ("validation (inputs and outputs against the config)", ("validate.py:", "spec.py:")),
    ("routing and data plane", ("registry.py:", "routing.py:", "dataplane.py:")),
    ("statistics, metrics, access-log check", ("stats.py:", "metrics.py:", "requests.py:")),
    ("model, scheduler, inline execution", ("model.py:", "scheduling/", "types.py:")),
    ("onnxruntime call", ("onnxruntime",)),
    ("object construction (dataclass __init__)", ("<string>:",)),
]


def stage_of(key: str) -> str:
    for stage, markers in STAGES:
        if any(marker in key for marker in markers):
            return stage
    return "other"


async def _torchserve_app(work: Path) -> Any:
    """A server of TorchServe's mnist example (built as the side-by-side builds it), its
    TorchServe inference app."""
    from torchserve_side_by_side import mnist_archives

    from inferd.app import flags
    from inferd.app.server import NetworkServer

    store = work / "store"
    store.mkdir()
    mnist_archives(work / "mnist", store)
    args = ["--model-repository", str(work / "models"), "--model-store", str(store),
            "--models", "mnist=mnist.mar", "--default-workers-per-model", "1"]  # fmt: skip
    (work / "models").mkdir()
    server = NetworkServer(flags.parse(args))
    torchserve = server.torchserve
    assert torchserve is not None
    server.core.also_load = await torchserve.register_at_start()
    await server.core.start()
    return torchserve.inference_app


async def count(
    requests: int, api: str = "v2"
) -> tuple[collections.Counter[str], collections.Counter[int]]:
    from inferd.app import flags

    try:
        from inferd.app.server import NetworkServer
    except ImportError:  # a tree from before the core (inferd.Server) and its frontends split
        from inferd.app.server import Server as NetworkServer  # type: ignore[attr-defined,no-redef]
    from inferd.demo.models import write_demo_repository
    from inferd.scheduling import instances

    instances.INLINE_BELOW_S = 1.0  # tracing is slow: keep the model inline, as in a real run
    instances.INLINE_BELOW_NS = 10**9
    path, body, headers, _ = APIS[api]
    if api == "torchserve":
        from torchserve_side_by_side import digit_png

        body = digit_png()
        app = await _torchserve_app(Path(tempfile.mkdtemp()))
    else:
        repo = Path(tempfile.mkdtemp()) / "models"
        write_demo_repository(repo, models=["half_plus_two"])
        args = ["--model-repository", str(repo), "--model-control-mode", "explicit",
                "--load-model", "half_plus_two"]  # fmt: skip
        server = NetworkServer(flags.parse(args))
        if hasattr(server, "core"):
            await server.core.start()
        else:
            await server._load_models()
        app = server.http_app
    scope = Scope(path, body, headers)
    protocol = Protocol(body)
    for _ in range(3000):
        await app.__rsgi__(scope, protocol)
    counts: collections.Counter[str] = collections.Counter()

    def on_opcode(frame: FrameType, event: str, arg: Any) -> Any:
        if event == "opcode":
            code = frame.f_code
            where = code.co_filename.split("/src/")[-1].split("site-packages/")[-1]
            counts[f"{where}:{code.co_name}"] += 1
        return on_opcode

    def on_call(frame: FrameType, event: str, arg: Any) -> Any:
        frame.f_trace_opcodes = True
        frame.f_trace_lines = False
        return on_opcode

    sys.settrace(on_call)
    try:
        for _ in range(requests):
            await app.__rsgi__(scope, protocol)
    finally:
        sys.settrace(None)
    return counts, protocol.answers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--functions", type=int, default=25, help="busiest functions to list")
    parser.add_argument("--api", choices=sorted(APIS), default="v2")
    args = parser.parse_args()
    import uvloop

    counts, answers = uvloop.run(count(args.requests, args.api))
    assert set(answers) == {200}, answers
    n = args.requests
    per_request = {key: value / n for key, value in counts.items() if "request_opcodes" not in key}
    total = sum(per_request.values())
    stages: collections.Counter[str] = collections.Counter()
    for key, value in per_request.items():
        stages[stage_of(key)] += value
    model = "mnist.mar" if args.api == "torchserve" else "half_plus_two"
    print(f"{model}, {APIS[args.api][3]}: {total:,.0f} bytecodes per request ({n} requests)\n")
    print("| stage | bytecodes/request | share |\n|---|---|---|")
    for stage, value in stages.most_common():
        print(f"| {stage} | {value:,.0f} | {100 * value / total:.0f} % |")
    print("\n| function | bytecodes/request |\n|---|---|")
    for key, value in sorted(per_request.items(), key=lambda kv: -kv[1])[: args.functions]:
        print(f"| {key} | {value:,.1f} |")


if __name__ == "__main__":
    main()
