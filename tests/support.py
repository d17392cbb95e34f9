"""Test support: a real inferd server in a subprocess on free ports."""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import signal
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx

T = TypeVar("T")

# The serving processes of a server a test starts, as `--http-workers auto` (the default) picks
# them on a machine of three cores: a model host and two frontends, so that what one frontend
# sets must reach the other, not only the host. Lazy serving (a memory budget) is one process
# under auto, so its servers run auto. INFERD_TEST_HTTP_WORKERS=N runs every server with N;
# a test's own --http-workers (or INFERD_HTTP_WORKERS in its env) wins over both.
DEFAULT_WORKERS = 3
_LAZY = {"--model-memory-budget", "--max-loaded-models"}


def binary_header(name: str, shape: list[int], datatype: str, size: int, **doc: Any) -> bytes:
    """A v2 binary request's JSON header: one input of ``size`` bytes, then ``doc``'s keys."""
    item: dict[str, Any] = {"name": name, "shape": shape, "datatype": datatype}
    item["parameters"] = {"binary_data_size": size}
    return json.dumps({"inputs": [item], **doc}).encode()


PYTHON_PAGE = Path(__file__).resolve().parents[1] / "docs" / "python" / "index.md"


def docs_block(page: Path, path: str) -> str:
    """The block a docs page writes to ``path`` (``<!-- run file=PATH -->``), as written."""
    from inferd_docs.examples import blocks

    found = [b.body for b in blocks(page) if b.options.get("file") == path]
    assert len(found) == 1, f"{page} has no block for {path}"
    return found[0]


def wait_for(check: Callable[[], T | None], what: str, timeout_s: float = 60.0) -> T:
    """Poll ``check`` until it returns something truthy, and return that; fail naming ``what``.

    The deadline only bounds a wait that went wrong: a test waits for what it needs to see (a
    count in the metrics, a line in a log), never a fixed time on the hope it has happened.
    """
    deadline = time.monotonic() + timeout_s
    last: T | None = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what} (last: {last!r})")


def pending_requests(server: ServerProcess, model: str = "") -> int:
    """The server's count of a model's requests in flight, queued or executing (every model's
    when ``model`` is empty): ``inferd_pending_requests`` in /metrics."""
    text = httpx.get(f"{server.http_url}/metrics", timeout=30).text
    prefix = f'inferd_pending_requests{{model="{model}",' if model else "inferd_pending_requests{"
    lines = [ln for ln in text.splitlines() if ln.startswith(prefix)]
    return sum(int(float(ln.rsplit(" ", 1)[1])) for ln in lines)


def _port_block() -> range:
    """The ports this test process hands out: below the kernel's ephemeral range, so that no
    outgoing connection (the kernel takes their ports from that range) can take one between
    the moment a test picks it and the moment its server binds it; each pytest-xdist worker
    its own block, so that workers never pick the same port."""
    try:
        ephemeral = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral = 32768
    low, high = 10000, min(ephemeral, 65536)
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    index = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
    size = (high - low) // max(1, workers)
    return range(low + index * size, low + (index + 1) * size) if size >= 200 else range(0)


_BLOCK = _port_block()
# A random start, so that test runs side by side (two checkouts) do not walk the same ports.
_NEXT = iter(random.sample(_BLOCK, len(_BLOCK)))


def free_port() -> int:
    """A port free on loopback now, that no other test process of this run will pick."""
    for port in _NEXT:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue  # in use (a server of an earlier test, or another program)
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:  # block used up: any port
        s.bind(("127.0.0.1", 0))
        found: int = s.getsockname()[1]
        return found


class PortTaken(RuntimeError):
    """The server could not bind a port chosen for it: another process took it meanwhile."""


@dataclass
class ServerProcess:
    """``inferd serve`` on free ports; the log is kept for assertions and failures."""

    repository: Path
    extra_args: Sequence[str] = ()
    env: dict[str, str] = field(default_factory=dict)
    http_port: int = 0  # 0: a free port, chosen here (again, should another process take it)
    grpc_port: int = 0
    log_path: Path | None = None
    proc: subprocess.Popen[bytes] | None = None
    host: str = "127.0.0.1"  # the loopback address both servers bind
    python: str = sys.executable  # the interpreter that runs `-m inferd`
    token: str = ""  # sent by the readiness probe (servers started with --auth-health)
    scheme: str = "http"  # https for servers started with --tls-cert
    verify: str | bool = True  # the CA file the probe trusts, for https
    repository_flag: bool = True  # False: no --model-repository (a TorchServe model store)
    cwd: Path | None = None  # the server's working folder (relative paths in its flags)
    _chosen: tuple[bool, bool] = field(default=(False, False), init=False, repr=False)

    def __post_init__(self) -> None:
        self._chosen = not self.http_port, not self.grpc_port
        self._choose_ports()

    def _choose_ports(self) -> None:
        chose_http, chose_grpc = self._chosen
        if chose_http:
            self.http_port = free_port()
        if chose_grpc:
            self.grpc_port = free_port()

    @property
    def http_url(self) -> str:
        return f"{self.scheme}://{self.host}:{self.http_port}"

    @property
    def http_address(self) -> str:
        return f"{self.host}:{self.http_port}"

    @property
    def grpc_address(self) -> str:
        return f"{self.host}:{self.grpc_port}"

    def start(self, timeout_s: float = 60.0, until: str = "/v2/health/ready") -> ServerProcess:
        """Start the server and wait until ``until`` answers 200 (ready: on every worker; live:
        the model host may still be loading the startup models, the frontends bind after).

        A port chosen here is free when chosen, but another process (tests run in parallel)
        may bind it before the server does: then the server starts again on new ports."""
        for _ in range(4):
            try:
                return self._start(timeout_s, until)
            except PortTaken:
                self._choose_ports()
        return self._start(timeout_s, until)

    def _start(self, timeout_s: float, until: str) -> ServerProcess:
        self.log_path = self.log_path or self.repository.parent / f"server-{self.http_port}.log"
        args = [
            self.python,
            "-m",
            "inferd",
            "serve",
            *(["--model-repository", str(self.repository)] if self.repository_flag else []),
            "--http-address",
            self.host,
            "--http-port",
            str(self.http_port),
            "--grpc-address",
            self.host,
            *self.extra_args,
        ]
        if os.environ.get("INFERD_TEST_GRPC", "1") != "1":
            args.append("--allow-grpc=false")  # else every server would bind the default 8081
        elif "--grpc-port" not in self.extra_args:
            args += ["--grpc-port", str(self.grpc_port)]
        workers = os.environ.get("INFERD_TEST_HTTP_WORKERS") or self._default_workers()
        env = {**os.environ, "RUST_BACKTRACE": "0", "INFERD_HTTP_WORKERS": workers, **self.env}
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                args, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=self.cwd
            )
        deadline = time.monotonic() + timeout_s
        headers = {"authorization": self.token} if self.token else {}
        verify: ssl.SSLContext | bool = (
            ssl.create_default_context(cafile=self.verify)
            if isinstance(self.verify, str)
            else self.verify
        )
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                text = self.log()
                if "Address already in use" in text and any(self._chosen):
                    raise PortTaken(text)
                raise RuntimeError(f"inferd exited with {self.proc.returncode}:\n{text}")
            try:
                ready = httpx.get(
                    f"{self.http_url}{until}", timeout=1, headers=headers, verify=verify
                )
                every = until == "/v2/health/live" or self._every_worker_listens()
                if ready.status_code == 200 and every:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"inferd did not become ready in {timeout_s} s:\n{self.log()}")

    def _default_workers(self) -> str:
        """What auto runs on a machine of DEFAULT_WORKERS cores (a variable, not the flag, so
        that benchmarks can start older trees too)."""
        flags = {arg.split("=", 1)[0] for arg in self.extra_args}
        env = {**os.environ, **self.env}
        lazy = flags & _LAZY or any(
            f"INFERD_{f[2:].upper().replace('-', '_')}" in env for f in _LAZY
        )
        return "auto" if lazy else str(DEFAULT_WORKERS)

    def _every_worker_listens(self) -> bool:
        """Several workers: each has bound the port (the model host binds first and says
        "listening: HTTP" for the server, each frontend once it has the host's models and says
        "worker N takes connections"). A replacement worker says it again: distinct workers
        are counted."""
        count = self.workers()
        if count == 1:
            return True
        log = self.log()
        first = {0} if "listening: HTTP" in log else set()
        others = {int(n) for n in re.findall(r"worker (\d+) takes connections", log)}
        return len(first | others) >= count

    def workers(self) -> int:
        """The serving processes of the started server, as its log says (one if it says
        nothing: one process, or TorchServe's APIs)."""
        found = re.search(r"(\d+) HTTP workers", self.log())
        return int(found.group(1)) if found else 1

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path else ""

    def ask_each_worker(self, message: dict[str, Any], timeout_s: float = 60.0) -> list[Any]:
        """Each serving process's own answer to ``message`` (``workers.node``'s ops, e.g.
        ``{"op": "statistics", ...}``), asked over its socket in the run folder: what that
        process alone holds, not the server's totals; None from a process whose socket does
        not answer (stopped, or not started yet). One process has no such socket: []."""
        count = self.workers()
        found = re.search(r"run folder (\S+)\)", self.log())
        if count == 1 or not found:
            return []
        from inferd.workers.peers import Peers, WorkerRole

        peers = Peers(WorkerRole(0, count, Path(found.group(1))))

        async def ask(index: int) -> Any:
            try:
                return await peers.ask(index, message, timeout_s)
            except (OSError, asyncio.IncompleteReadError):
                return None

        async def ask_all() -> list[Any]:
            return [await ask(i) for i in range(count)]

        return asyncio.run(ask_all())

    def stop(self) -> int | None:
        """Stop at once (SIGINT); SIGTERM would drain first (tests/e2e/test_drain.py)."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode
