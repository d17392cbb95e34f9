"""The event loop's own work per batched request, counted in instructions (callgrind).

The host's noise moves a timing by more than one cut of the request path is worth; an
instruction count does not move. This drives the server's HTTP application in process, as
granian would (``HttpApp.__rsgi__`` with a stand-in for granian's protocol object, so granian's
own cost is not counted), with rounds of 64 concurrent one-row binary requests (1x1024 FP32)
for an echo model batched as the wide-MLP benchmark's (max_batch_size 64, preferred 64; the
queue delay is long, so every batch holds 64 under valgrind's slowness too, and the disconnect
watch never starts). Run under callgrind twice, with 4 and 24 rounds, counting the main
thread (the event loop) only; the difference divided by 20 x 64 is the instructions per
request, start-up taken out.

    python benchmarks/loop_instructions.py [--tree LABEL=PATH ...]   # instructions per request
    python benchmarks/loop_instructions.py --rounds N --child TREE    # one run (no valgrind)

Needs ``valgrind`` on the PATH.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.core_bench import trees_from
from benchmarks.rsgi_stub import Protocol, Scope

CONCURRENCY = 64
ROUNDS = (4, 24)
CONFIG = """name: "echo"
backend: "echo"
max_batch_size: 64
input [{ name: "input" data_type: TYPE_FP32 dims: [1024] }]
output [{ name: "output" data_type: TYPE_FP32 dims: [1024] }]
parameters { key: "delay_ms" value: { string_value: "1" } }
dynamic_batching { preferred_batch_size: [64] max_queue_delay_microseconds: 10000000 }
"""


def request_body() -> tuple[bytes, int]:
    row = np.random.default_rng(2).standard_normal((1, 1024), dtype=np.float32).tobytes()
    header = (
        b'{"inputs":[{"name":"input","shape":[1,1024],"datatype":"FP32",'
        b'"parameters":{"binary_data_size":4096}}],"parameters":{"binary_data_output":true}}'
    )
    return header + row, len(header)


async def drive(repository: str, rounds: int) -> None:
    from inferd.app import flags

    try:
        from inferd.app.server import NetworkServer
    except ImportError:  # a tree from before the core (inferd.Server) and its frontends split
        from inferd.app.server import Server as NetworkServer  # type: ignore[attr-defined,no-redef]

    body, header_length = request_body()

    argv = ["--model-repository", repository, "--model-control-mode", "explicit"]
    server = NetworkServer(flags.parse([*argv, "--load-model", "echo"]))
    if hasattr(server, "core"):
        await server.core.start()
    else:
        await server._load_models()
    app = server.http_app
    path = "/v2/models/echo/infer"
    headers = {
        "content-type": "application/octet-stream",
        "inference-header-content-length": str(header_length),
    }
    protocol = Protocol(body, arrives_later=True)
    # Valgrind slows requests past the disconnect watch's start: keep it off.
    watch = getattr(app, "_watch", None)
    if watch is not None:
        watch.after_s = 1e6
    else:  # older trees read a module constant
        import inferd.protocols.transport.http as http

        setattr(http, "WATCH_AFTER_S", 1e6)  # noqa: B010

    async def one_round() -> None:
        rsgi = app.__rsgi__
        await asyncio.gather(
            *(rsgi(Scope(path, body, headers), protocol) for _ in range(CONCURRENCY))
        )

    for _ in range(8):  # warm: caches filled, every signature accepted once
        await one_round()
    for _ in range(rounds):
        await one_round()
    if set(protocol.answers) != {200}:
        raise SystemExit(f"answers by status: {dict(protocol.answers)}")
    os._exit(0)  # no shutdown work in the count


def child(tree: str, rounds: int) -> None:
    sys.path.insert(0, str(Path(tree) / "src"))
    with tempfile.TemporaryDirectory() as repository:
        model = Path(repository) / "echo"
        (model / "1").mkdir(parents=True)
        (model / "config.pbtxt").write_text(CONFIG)
        import uvloop

        uvloop.run(drive(repository, rounds))


def instructions(tree: str, rounds: int) -> int:
    with tempfile.TemporaryDirectory() as work:
        out = Path(work) / "callgrind.out"
        subprocess.run(
            ["valgrind", "--tool=callgrind", "--separate-threads=yes",
             f"--callgrind-out-file={out}", sys.executable, __file__, "--child", tree,
             "--rounds", str(rounds)],
            check=True, capture_output=True,
            env={**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"},
        )  # fmt: skip
        main_thread = Path(f"{out}-01")  # the event loop's thread only
        summary = subprocess.run(
            ["callgrind_annotate", str(main_thread)], check=True, capture_output=True, text=True
        ).stdout
    found = re.search(r"([\d,]+) \([^)]*\)\s+PROGRAM TOTALS", summary)
    assert found is not None, summary[:500]
    return int(found.group(1).replace(",", ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tree", action="append", default=[], metavar="LABEL=PATH")
    parser.add_argument("--child", metavar="TREE", help=argparse.SUPPRESS)
    parser.add_argument("--rounds", type=int, default=ROUNDS[1])
    args = parser.parse_args()
    if args.child:
        child(args.child, args.rounds)
        return
    for label, tree in trees_from(args.tree):
        few, many = (instructions(str(tree), rounds) for rounds in ROUNDS)
        per_request = (many - few) / ((ROUNDS[1] - ROUNDS[0]) * CONCURRENCY)
        print(f"{label}: {per_request:,.0f} instructions per request on the event loop")


if __name__ == "__main__":
    main()
