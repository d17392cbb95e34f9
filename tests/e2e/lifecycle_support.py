"""Helpers for the model lifecycle tests: tiny ONNX models, repository edits, polling waits."""

from __future__ import annotations

import asyncio
import io
import os
import shutil
import tarfile
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import httpx
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tests.support import ServerProcess

T = TypeVar("T")
HPT = "half_plus_two"
# One client for the whole run: httpx.post() builds a client (and an SSL context) per call.
HTTP = httpx.Client(timeout=30)


def affine_onnx(scale: float, offset: float) -> bytes:
    """y = scale * x + offset on FP32 ``[batch]``, like the demo's half_plus_two."""
    graph = helper.make_graph(
        [
            helper.make_node("Mul", ["x", "scale"], ["scaled"]),
            helper.make_node("Add", ["scaled", "offset"], ["y"]),
        ],
        "affine",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch"])],
        initializer=[
            numpy_helper.from_array(np.array(scale, dtype=np.float32), "scale"),
            numpy_helper.from_array(np.array(offset, dtype=np.float32), "offset"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    data: bytes = model.SerializeToString()
    onnx.checker.check_model(model)
    return data


HALF_PLUS_TWO = affine_onnx(0.5, 2.0)
HALF_PLUS_THREE = affine_onnx(0.5, 3.0)


def numbered_onnx(version: int) -> bytes:
    """The model a version swap serves as version N: y = 0.5 * x + N, so each answer shows
    which version gave it (``right_for_version``)."""
    return affine_onnx(0.5, float(version))


def right_for_version(response: httpx.Response) -> str:
    """Why an answer to ``x_body([1.0])`` is not what ``numbered_onnx`` of the version that
    answered computes ('' when it is)."""
    doc = response.json()
    version = str(doc.get("model_version", ""))
    try:
        value = doc["outputs"][0]["data"][0]
    except (KeyError, IndexError, TypeError):
        return f"no output in {doc}"
    if not version.isdecimal() or value != 0.5 + int(version):
        return f"version '{version}' answered {value}"
    return ""


def version_archive(version: int) -> bytes:
    """A .tar.gz of a model folder holding version ``version`` alone (``numbered_onnx``)."""
    data = numbered_onnx(version)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        info = tarfile.TarInfo(f"{version}/model.onnx")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def write_version(model_dir: Path, version: int, onnx_bytes: bytes = HALF_PLUS_TWO) -> None:
    """Add a version folder atomically (written aside, then renamed into place)."""
    model_dir.mkdir(parents=True, exist_ok=True)
    aside = model_dir.parent / f".tmp-{model_dir.name}-{version}"
    (aside).mkdir(parents=True)
    (aside / "model.onnx").write_bytes(onnx_bytes)
    os.rename(aside, model_dir / str(version))


def remove_version(model_dir: Path, version: int) -> None:
    aside = model_dir.parent / f".gone-{model_dir.name}-{version}"
    os.rename(model_dir / str(version), aside)
    shutil.rmtree(aside)


def index(server: ServerProcess, **body: Any) -> list[dict[str, str]]:
    r = HTTP.post(f"{server.http_url}/v2/repository/index", json=body)
    assert r.status_code == 200, r.text
    entries: list[dict[str, str]] = r.json()
    return entries


def states(server: ServerProcess, name: str) -> dict[str, str]:
    """``{version: state}`` of one model in the index ('' for a model not loaded)."""
    return {e["version"]: e["state"] for e in index(server) if e["name"] == name}


def x_body(values: list[float], **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "inputs": [{"name": "x", "shape": [len(values), 1], "datatype": "FP32", "data": values}]
    }
    body.update(extra)
    return body


def infer(
    server: ServerProcess, model: str, values: list[float], path: str = "", **extra: Any
) -> httpx.Response:
    url = f"{server.http_url}/v2/models/{model}{path}/infer"
    return HTTP.post(url, json=x_body(values, **extra))


class Traffic:
    """Inference requests from ``clients`` connections in a background thread until ``stop``:
    ``answers`` counts them by HTTP status (0: no answer), ``failures`` keeps the first few
    that were not 200. ``check`` (e.g. ``right_for_version``) says what is wrong with a 200
    answer ('' when nothing is): ``wrong`` counts those."""

    def __init__(
        self,
        server: ServerProcess,
        models: list[str],
        clients: int = 4,
        check: Callable[[httpx.Response], str] | None = None,
    ) -> None:
        self.server = server
        self.models = models
        self.clients = clients
        self.check = check
        self.wrong = 0
        self.answers: Counter[int] = Counter()
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    def start(self) -> Traffic:
        self._thread.start()
        return self

    def stop(self) -> Counter[int]:
        self._stop.set()
        self._thread.join(timeout=60)
        return self.answers

    async def _run(self) -> None:
        async def client(offset: int) -> None:
            async with httpx.AsyncClient(base_url=self.server.http_url, timeout=30) as http:
                count = offset
                while not self._stop.is_set():
                    model = self.models[count % len(self.models)]
                    count += 1
                    try:
                        r = await http.post(f"/v2/models/{model}/infer", json=x_body([1.0]))
                    except httpx.HTTPError as exc:  # counted as status 0
                        status, text = 0, repr(exc)
                    else:
                        status, text = r.status_code, r.text
                        why = self.check(r) if self.check and status == 200 else ""
                        if why:
                            self.wrong += 1
                            if len(self.failures) < 5:
                                self.failures.append(f"{model}: {why}")
                    self.answers[status] += 1
                    if status != 200 and len(self.failures) < 5:
                        self.failures.append(f"{model}: {status} {text}")

        await asyncio.gather(*(client(i) for i in range(self.clients)))
