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

from tests.e2e.hostile_support import Peak, tree_rss
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

# Holds each body a while (the server's memory then shows every copy of it still alive) and
# answers its type and length.
HOLD_HANDLER = """
import time

def handle(data, context):
    if data is None:
        return None
    time.sleep(1.5)
    return [f"{type(row.get('body')).__name__} {len(row.get('body'))}" for row in data]
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
    (work / "hold_handler.py").write_text(HOLD_HANDLER.lstrip())
    archive(work, store, "size", "1.0", "size_handler.py")
    archive(work, store, "hold", "1.0", "hold_handler.py")
    models_arg = "size=size.mar,hold=hold.mar"
    args = ["--model-store", str(store), "--models", models_arg, *ports.args()]
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


def test_a_large_body_is_held_at_most_twice_on_its_way_to_the_handler(
    served: ServerProcess, ports: Ports
) -> None:
    """The server lets go of its copy once the handler's worker has one, and the worker reads
    it out of shared memory once, as the bytearray TorchServe hands over: while the handler
    holds it, and at the worst moment on its way, the tree holds about two copies (three and
    more before: the server's until the answer, the worker's bytes and the bytearray)."""
    assert served.proc is not None
    url = f"{ports.inference_url}/predictions/hold"
    size = 60 * 1000 * 1000
    with httpx.Client(timeout=120) as client:
        assert client.post(url, content=b"abc").text == "bytearray 3"
        time.sleep(1)
        body = b"z" * size
        with Peak(served.proc.pid) as rss:
            answer = client.post(url, content=body)
        del body
    assert answer.status_code == 200, answer.text
    assert answer.text == f"bytearray {size}"
    grown = rss.peak - rss.start
    print(f"\nRSS peak {grown / 2**20:+.0f} MiB for a body of {size / 2**20:.0f} MiB")
    assert grown < 2.6 * size  # about 2 (3.6 before)


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
