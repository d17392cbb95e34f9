"""The real TorchServe (PyPI ``torchserve``, Java) on loopback, for side-by-side tests and the
benchmark: started with a ``config.properties`` of its own ports, stopped by process id.

``INFERD_TORCHSERVE_VENV`` names a venv holding ``torchserve`` (``/work/shared/peers/setup.sh``
makes ``/tmp/torchserve-venv``); Java must be on the PATH.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tests.support import free_port

VENV_VARIABLE = "INFERD_TORCHSERVE_VENV"


def peer_venv() -> Path | None:
    """The venv with TorchServe, when the run asks for one and it is usable."""
    value = os.environ.get(VENV_VARIABLE)
    if not value:
        return None
    venv = Path(value)
    if not (venv / "bin" / "torchserve").exists() or shutil.which("java") is None:
        return None
    return venv


def _children(pid: int) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(proc.name))
    return found


def _tree(pid: int) -> list[int]:
    every = [pid]
    for child in _children(pid):
        every += _tree(child)
    return every


@dataclass
class TorchServePeer:
    venv: Path
    store: Path
    workdir: Path
    models: list[str]
    workers: int = 1
    extra_args: list[str] = field(default_factory=list)  # more torchserve flags
    inference: int = field(default_factory=free_port)
    management: int = field(default_factory=free_port)
    metrics: int = field(default_factory=free_port)
    grpc_inference: int = field(default_factory=free_port)
    grpc_management: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def inference_url(self) -> str:
        return f"http://127.0.0.1:{self.inference}"

    @property
    def management_url(self) -> str:
        return f"http://127.0.0.1:{self.management}"

    def start(self, timeout_s: float = 180.0) -> TorchServePeer:
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = self.workdir / "config.properties"
        config.write_text(
            f"inference_address=http://127.0.0.1:{self.inference}\n"
            f"management_address=http://127.0.0.1:{self.management}\n"
            f"metrics_address=http://127.0.0.1:{self.metrics}\n"
            "grpc_inference_address=127.0.0.1\ngrpc_management_address=127.0.0.1\n"
            f"grpc_inference_port={self.grpc_inference}\n"
            f"grpc_management_port={self.grpc_management}\n"
            f"default_workers_per_model={self.workers}\n"
            "install_py_dep_per_model=false\ndisable_token_authorization=true\n"
            "enable_model_api=true\n"
        )
        logs = self.workdir / "logs"
        env = {
            **os.environ,
            "LOG_LOCATION": str(logs),
            "METRICS_LOCATION": str(logs),
            "PATH": f"{self.venv / 'bin'}:{os.environ.get('PATH', '')}",
        }
        env.pop("PYTHONPATH", None)  # the peer runs its own ts package, not inferd's
        with open(self.workdir / "torchserve.log", "wb") as log:
            self.proc = subprocess.Popen(
                [
                    str(self.venv / "bin" / "torchserve"),
                    "--start",
                    "--foreground",
                    "--ncs",
                    "--disable-token-auth",
                    "--model-store",
                    str(self.store),
                    "--ts-config",
                    str(config),
                    *self.extra_args,
                    "--models",
                    *self.models,
                ],
                cwd=self.workdir,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        names = [m.partition("=")[0] for m in self.models]
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"torchserve exited: {self.log()[-3000:]}")
            if all(self._ready(n) for n in names):
                return self
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"torchserve did not start in {timeout_s} s: {self.log()[-3000:]}")

    def _ready(self, name: str) -> bool:
        try:
            found = httpx.get(f"{self.management_url}/models/{name}", timeout=2).json()
        except (httpx.HTTPError, ValueError):
            return False
        workers = found[0].get("workers", []) if isinstance(found, list) and found else []
        return bool(workers) and all(w.get("status") == "READY" for w in workers)

    def log(self) -> str:
        path = self.workdir / "torchserve.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        """Java first (it outlives its launcher), then the launcher, then any worker left."""
        if self.proc is None:
            return
        every = _tree(self.proc.pid)
        for pid in every[1:] + every[:1]:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and any(Path(f"/proc/{p}").exists() for p in every):
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=0.2)
        for pid in every:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.proc = None
