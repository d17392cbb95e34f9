"""Hostile clients against the gRPC port: the native server and grpcio side by side.

Starts ``inferd serve`` (loopback, one echo model) once with ``--grpc-server native`` and once
with ``--grpc-server grpcio``, runs every probe of ``tests/e2e/hostile_probes.py`` against each
while a real client (grpcio) calls ModelInfer in a loop, and prints for each probe and server:
the process tree's RSS growth per hostile connection at its peak, what was still held a few
seconds after the connections closed, the real client's p99 during the probe against its idle
p99, and what the server answered. A second server with ``--auth-token`` takes the
length-prefix probe without a token.

    .venv/bin/python benchmarks/hostile_grpc.py [--hold-s 5] [--only "rapid reset"]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.e2e.hostile_probes import PROBES, WIDE, Outcome, Target, length_prefix, measure
from tests.e2e.hostile_support import RealClient, write_echo_model
from tests.support import ServerProcess

MIB = 1024 * 1024


def run_server(
    root: Path, kind: str, names: list[str], hold_s: float, extra: list[str]
) -> list[Outcome]:
    server = ServerProcess(root, extra_args=["--grpc-server", kind, *extra]).start()
    outcomes = []
    try:
        assert server.proc is not None
        target = Target(server.proc.pid, server.host, server.grpc_port)
        with RealClient(server.grpc_address) as client:
            for name in names:
                if name == "length prefix, no token":
                    continue
                outcomes.append(measure(target, name, PROBES[name], client, hold_s))
                print(f"  [{kind}] {_row(outcomes[-1])}", flush=True)
    finally:
        server.stop()
    if "length prefix, no token" in names:
        token = "probe-token"
        authed = ServerProcess(
            root, extra_args=["--grpc-server", kind, "--auth-token", token, *extra]
        ).start()
        try:
            assert authed.proc is not None
            target = Target(authed.proc.pid, authed.host, authed.grpc_port, token=token)
            with _AuthedClient(authed.grpc_address, token) as client:
                outcomes.append(
                    measure(target, "length prefix, no token", length_prefix, client, hold_s)
                )
                print(f"  [{kind}] {_row(outcomes[-1])}", flush=True)
        finally:
            authed.stop()
    return outcomes


class _AuthedClient(RealClient):
    def __init__(self, address: str, token: str) -> None:
        super().__init__(address)
        self.metadata = (("authorization", f"Bearer {token}"),)
        call = self.stub.ModelInfer

        def with_token(request: object, timeout: float) -> object:
            return call(request, timeout=timeout, metadata=self.metadata)

        self.stub.ModelInfer = with_token


def _row(o: Outcome) -> str:
    ratio = o.p99_during_s / o.p99_idle_s if o.p99_idle_s == o.p99_idle_s and o.p99_idle_s else 0
    return (
        f"{o.name:26} {o.connections:5d} conn  peak {o.per_connection_bytes / MIB:8.2f} MiB/conn "
        f"(total {o.peak_bytes / MIB:7.1f})  left {o.left_bytes / MIB:7.1f} MiB  "
        f"p99 {o.p99_during_s * 1e3:7.1f} ms vs idle {o.p99_idle_s * 1e3:5.1f} ({ratio:4.1f}x, "
        f"{o.calls_during} calls)  {o.note}"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hold-s", type=float, default=5.0)
    parser.add_argument("--only", action="append", default=[], help="probe names (repeat)")
    parser.add_argument("--server", action="append", default=[], help="native and/or grpcio")
    parser.add_argument("--extra", default="", help="more flags for both servers")
    args = parser.parse_args()
    names = args.only or [*PROBES, "length prefix, no token"]
    kinds = args.server or ["native", "grpcio"]
    with tempfile.TemporaryDirectory() as tmp:
        root = write_echo_model(Path(tmp) / "models")
        write_echo_model(root, "wide")
        (root / "wide" / "config.pbtxt").write_text(WIDE)
        results = {}
        for kind in kinds:
            print(f"--grpc-server {kind}  (load average {os.getloadavg()[0]:.1f})", flush=True)
            results[kind] = run_server(root, kind, names, args.hold_s, args.extra.split())
    print()
    for kind, outcomes in results.items():
        print(f"== {kind}")
        for o in outcomes:
            print("  " + _row(o))


if __name__ == "__main__":
    main()
