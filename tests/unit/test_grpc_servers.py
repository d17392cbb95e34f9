"""inferd.protocols.transport.grpc_servers: one set of limits for both gRPC servers."""

from __future__ import annotations

from inferd.protocols.transport.grpc_servers import grpcio_options
from inferd.protocols.transport.h2grpc.host import Limits


def test_grpcio_gets_the_limits_its_core_has() -> None:
    options = dict(grpcio_options(Limits(idle_timeout_s=30.0, keepalive_time_s=7200.0)))
    assert options["grpc.max_concurrent_streams"] == 100
    assert options["grpc.max_metadata_size"] == 16 * 1024
    assert options["grpc.max_connection_idle_ms"] == 30_000
    assert options["grpc.keepalive_time_ms"] == 7_200_000
    assert options["grpc.keepalive_timeout_ms"] == 20_000
    assert options["grpc.http2.max_ping_strikes"] == 2
    assert options["grpc.http2.min_ping_interval_without_data_ms"] == 300_000
    assert options["grpc.server_handshake_timeout_ms"] == 10_000


def test_the_sweep_runs_at_a_quarter_of_the_shortest_timeout() -> None:
    assert Limits().sweep_s() == 1.0
    assert Limits(body_timeout_s=1.0).sweep_s() == 0.25
