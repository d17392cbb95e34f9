"""Large bodies on TorchServe's ``/predictions`` as users run it (``--http-workers`` given, which
TorchServe's ports keep to one serving process; the handler in a worker process): the handler
gets the body as sent, however large, and the server's memory (RSS of its whole process tree)
comes back after."""

from __future__ import annotations

import concurrent.futures
import socket
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.e2e.hostile_support import tree_rss
from tests.e2e.torchserve_support import Ports, archive
from tests.support import ServerProcess

BODIES, BODY_BYTES = 3, 40 * 1000 * 1000
MAX_BODY_BYTES = 64 << 20

# Answers the length and the first and last bytes of each request's body.
SIZE_HANDLER = """
def handle(data, context):
    if data is None:
        return None
    answers = []
    for row in data:
        body = row.get("body") or row.get("data") or b""
        answers.append(f"{len(body)} {bytes(body[:1]).decode()} {bytes(body[-1:]).decode()}")
    return answers
"""


@pytest.fixture(scope="module")
def ports() -> Ports:
    return Ports()


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, ports: Ports) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("ts-bodies")
    work, store, models = root / "work", root / "store", root / "models"
    for folder in (work, store, models):
        folder.mkdir()
    (work / "size_handler.py").write_text(SIZE_HANDLER.lstrip())
    archive(work, store, "size", "1.0", "size_handler.py")
    args = ["--model-store", str(store), "--models", "size=size.mar", *ports.args()]
    args += ["--http-max-body-bytes", str(MAX_BODY_BYTES)]
    server = ServerProcess(models, ["--http-workers", "3", *args]).start(timeout_s=120)
    yield server
    server.stop()


def _settled(pid: int, near: int, within_s: float) -> int:
    """The tree's RSS once it is within 48 MiB of ``near`` (or after ``within_s``)."""
    deadline = time.monotonic() + within_s
    rss = tree_rss(pid)
    while rss - near > 48 << 20 and time.monotonic() < deadline:
        time.sleep(0.5)
        rss = tree_rss(pid)
    return rss


def test_large_bodies_reach_the_handler_whole_and_their_memory_comes_back(
    served: ServerProcess, ports: Ports
) -> None:
    assert served.proc is not None
    url = f"{ports.inference_url}/predictions/size"
    with httpx.Client(timeout=120) as client:
        assert client.post(url, content=b"abc").text == "3 a c"
    time.sleep(1)
    idle = tree_rss(served.proc.pid)
    bodies = [bytes([65 + i]) + b"x" * (BODY_BYTES - 2) + bytes([97 + i]) for i in range(BODIES)]

    def send(body: bytes) -> httpx.Response:
        return httpx.post(url, content=body, timeout=120)

    with concurrent.futures.ThreadPoolExecutor(BODIES) as pool:
        answers = list(pool.map(send, bodies))
    assert [a.status_code for a in answers] == [200] * BODIES
    expected = [f"{BODY_BYTES} {chr(65 + i)} {chr(97 + i)}" for i in range(BODIES)]
    assert [a.text for a in answers] == expected
    del bodies
    after = _settled(served.proc.pid, idle, 10)
    print(f"\nRSS {(after - idle) / 2**20:+.0f} MiB after {BODIES} bodies of {BODY_BYTES} bytes")
    assert after - idle < 48 << 20  # each body crossed to the handler's process; none is kept


def test_a_large_form_is_cut_into_its_parameters(served: ServerProcess, ports: Ports) -> None:
    """A multipart body above the size parsed on the event loop: parsed on a thread, the
    same parameters."""
    payload = b"y" * (3 << 20)
    r = httpx.post(
        f"{ports.inference_url}/predictions/size",
        files={"data": ("big.bin", payload, "application/octet-stream")},
        timeout=120,
    )
    assert r.status_code == 200, r.text
    assert r.text == f"{len(payload)} y y"


def test_a_body_over_the_limit_is_refused_before_it_is_read(
    served: ServerProcess, ports: Ports
) -> None:
    """--http-max-body-bytes (TorchServe's max_request_size) bounds the port's bodies: a head
    declaring more is answered 413, in TorchServe's error shape, with no body sent."""
    with socket.create_connection(("127.0.0.1", ports.inference), timeout=60) as s:
        s.sendall(
            b"POST /predictions/size HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            + f"Content-Length: {MAX_BODY_BYTES + 1}\r\n\r\n".encode()
        )
        answer = s.recv(1 << 16)
    assert answer.startswith(b"HTTP/1.1 413"), answer
    assert b'"code": 413' in answer and b"--http-max-body-bytes" in answer
