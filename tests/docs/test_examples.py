"""Every runnable example of the docs and the README, run as written against a live server.

Blocks are marked with ``<!-- run -->`` and friends (``inferd_docs.examples``, described on the
contributor page "Writing docs"). Each page runs in a folder of its own, seeded with demo models
in ``./models``; its blocks talk to the page's own server (a ``<!-- run server -->`` block) or
else to one shared server on the demo models. ``localhost:8080`` and ``localhost:8081`` in a
block become that server's HTTP and gRPC addresses; a page server's TorchServe ports (8085,
8086, 7070, 7071 by default) get free ports too, substituted the same way. A run block marked
``env=EXTRAS`` runs with only what ``pip install -e '.[EXTRAS]'`` installs (``tests.docs.extras``
hides every other installed module): the environment its page tells the reader to make.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from inferd_docs.examples import Block, blocks, matches

from inferd.demo.models import PIPELINE_MODELS, write_demo_repository
from tests.docs.extras import hiding_folder
from tests.support import ServerProcess, free_port

ROOT = Path(__file__).resolve().parents[2]
DEMO = ("half_plus_two", "digits", "resnet50", *PIPELINE_MODELS)
PAGE_MODELS = "half_plus_two,digits"  # a page's ./models unless its server block says models=
LINKED_ABOVE_BYTES = 1 << 20  # bigger demo files are hard-linked into a page's folder, not copied
BLOCK_TIMEOUT_S = 180
_ADDRESS_FLAGS = ("--http-port", "--grpc-port", "--http-address", "--grpc-address")
# A page server's other ports: the flag, and the default a page's blocks write.
_OTHER_PORTS = {
    "--torchserve-inference-port": 8085,
    "--torchserve-management-port": 8086,
    "--torchserve-grpc-inference-port": 7070,
    "--torchserve-grpc-management-port": 7071,
}


def _pages() -> list[Path]:
    docs = [p for p in (ROOT / "docs").rglob("*.md") if "hooks" not in p.parts]
    return [p for p in sorted([ROOT / "README.md", *docs]) if blocks(p)]


# Session-scoped (once per test process): the pages then need not run in one process, and run
# in parallel under pytest-xdist; none of them changes these models or that server.
@pytest.fixture(scope="session")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("docs") / "models"
    write_demo_repository(root, models=list(DEMO))
    return root


class Shared:
    """The server on the demo models that pages without a server of their own talk to,
    started on first use."""

    def __init__(self, demo: Path) -> None:
        self.demo = demo
        self.server: ServerProcess | None = None

    def get(self) -> ServerProcess:
        if self.server is None:
            self.server = ServerProcess(self.demo).start()
        return self.server


@pytest.fixture(scope="session")
def shared(demo: Path) -> Iterator[Shared]:
    holder = Shared(demo)
    yield holder
    if holder.server is not None:
        holder.server.stop()


def _seed(demo: Path, folder: Path, names: str) -> None:
    """Copy demo models into ``folder/models`` (big files as hard links, so cheap)."""
    for name in names.split(","):
        target = folder / "models" / name
        if target.exists():
            continue
        for source in (demo / name).rglob("*"):
            dest = target / source.relative_to(demo / name)
            if source.is_dir():
                dest.mkdir(parents=True, exist_ok=True)
                continue
            dest.parent.mkdir(parents=True, exist_ok=True)
            if source.stat().st_size > LINKED_ABOVE_BYTES:
                os.link(source, dest)
            else:
                shutil.copy2(source, dest)


def _serve_args(block: Block, folder: Path) -> tuple[Path | None, list[str]]:
    """The repository (None: the command names none) and the other flags of the block's
    ``inferd serve`` command, without its addresses and ports (the harness picks free ones)."""
    command = " ".join(
        line.split("#", 1)[0].rstrip().removesuffix("\\") for line in block.body.splitlines()
    )
    words = shlex.split(command)
    assert words[:2] == ["inferd", "serve"], f"{block}: not an `inferd serve` command"
    repositories: list[str] = []
    rest: list[str] = []
    args = iter(words[2:])
    for word in args:
        name = word.split("=", 1)[0]
        if name == "--model-repository":
            repositories.append(word.split("=", 1)[1] if "=" in word else next(args))
        elif name in _ADDRESS_FLAGS or name in _OTHER_PORTS:
            if "=" not in word:
                next(args)
        else:
            rest.append(word)
    for more in repositories[1:]:
        rest += ["--model-repository", more]
    return (folder / repositories[0] if repositories else None), rest


def _substitute(text: str, server: ServerProcess) -> str:
    text = text.replace("localhost:8080", server.http_address)
    text = text.replace("localhost:8081", server.grpc_address)
    for flag, default in _OTHER_PORTS.items():
        if flag in server.extra_args:
            port = server.extra_args[server.extra_args.index(flag) + 1]
            text = text.replace(f"localhost:{default}", f"{server.host}:{port}")
    return text


def _run(block: Block, folder: Path, server: ServerProcess) -> None:
    text = _substitute(block.body, server)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    if "env" in block.options:  # only what `pip install -e '.[EXTRAS]'` installs
        extras = tuple(e for e in block.options["env"].split(",") if e)
        hide = hiding_folder(extras, folder / f"_env_{'_'.join(extras) or 'plain'}")
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(hide), env.get("PYTHONPATH")) if p)
    if block.lang == "python":
        script = folder / f"_example_{block.line}.py"
        script.write_text(text)
        command = [sys.executable, str(script)]
    elif block.lang in ("bash", "sh", "console"):
        command = ["bash", "-e", "-o", "pipefail", "-c", text]
    else:
        raise AssertionError(f"{block}: cannot run a '{block.lang}' block")
    done = subprocess.run(
        command, cwd=folder, env=env, capture_output=True, text=True, timeout=BLOCK_TIMEOUT_S
    )
    where = f"{block} ({block.lang}):\n{text}\n--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}"
    assert done.returncode == 0, f"exit {done.returncode} in {where}\n--- server\n{server.log()}"
    if block.expected is not None:
        assert matches(block.expected, done.stdout), f"expected\n{block.expected}\nfrom {where}"


@pytest.mark.parametrize("page", _pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_examples_run_as_written(page: Path, demo: Path, shared: Shared, tmp_path: Path) -> None:
    found = blocks(page)
    folder = tmp_path / "page"
    folder.mkdir()
    seeded = [b.options["models"] for b in found if b.kind == "server" and "models" in b.options]
    _seed(demo, folder, ",".join(seeded) or PAGE_MODELS)
    own: ServerProcess | None = None
    try:
        for block in found:
            if block.kind == "file":
                path = folder / block.options["file"]
                path.parent.mkdir(parents=True, exist_ok=True)
                path.unlink(missing_ok=True)  # never write through a hard link
                path.write_text(block.body)
            elif block.kind == "server":
                if own is not None:
                    own.stop()
                repository, flags = _serve_args(block, folder)
                tls = any(f.split("=", 1)[0] == "--tls-cert" for f in flags)
                for flag in _OTHER_PORTS:
                    flags += [flag, str(free_port())]
                own = ServerProcess(
                    repository or folder / "models",
                    flags,
                    repository_flag=repository is not None,
                    cwd=folder,
                    log_path=folder / f"server-{block.line}.log",
                    scheme="https" if tls else "http",
                    verify=not tls,  # the probe only waits; the page's blocks check the cert
                ).start()
            else:
                _run(block, folder, own or shared.get())
    finally:
        if own is not None:
            own.stop()
