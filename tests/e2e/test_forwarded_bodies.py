"""Large tensors through the default layout: a frontend forwards a request for a model only the
host runs (a dynamic batcher) through shared memory, a large one copied there off its event
loop; every value arrives where it was sent, whichever serving process took the connection."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import numpy as np
import pytest

from tests.support import ServerProcess

ECHO = """backend: "echo"
max_batch_size: 2
input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [-1] }]
output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [-1] }]
dynamic_batching { }
"""
VALUES = 1_500_000  # 6 MB a request: above what a frontend copies on its event loop


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("forwarded") / "models"
    (root / "echo" / "1").mkdir(parents=True)
    (root / "echo" / "config.pbtxt").write_text(ECHO)
    args = ["--http-workers", "3", "--model-control-mode", "explicit", "--load-model", "*"]
    proc = ServerProcess(root, extra_args=args).start()
    yield proc
    proc.stop()


def _echo(server: ServerProcess, values: np.ndarray) -> np.ndarray:
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "INPUT0",
                    "shape": list(values.shape),
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": values.nbytes},
                }
            ],
            "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
        }
    ).encode()
    with httpx.Client(timeout=120) as client:  # a new connection: the kernel picks a process
        r = client.post(
            f"{server.http_url}/v2/models/echo/infer",
            content=header + values.tobytes(),
            headers={
                "content-type": "application/octet-stream",
                "inference-header-content-length": str(len(header)),
            },
        )
    assert r.status_code == 200, r.text
    length = int(r.headers["inference-header-content-length"])
    shape = json.loads(r.content[:length])["outputs"][0]["shape"]
    return np.frombuffer(r.content[length:], np.float32).reshape(shape)


def test_large_tensors_arrive_whole_through_every_serving_process(server: ServerProcess) -> None:
    assert server.workers() == 3
    rng = np.random.default_rng(0)
    for _ in range(9):  # all nine on the host alone: odds of 3**-9
        values = rng.standard_normal((1, VALUES), dtype=np.float32)
        assert np.array_equal(_echo(server, values), values)
