"""TorchServe archives for the end-to-end tests, built with the real ``torch-model-archiver``
from handlers written as TorchServe's documentation shows them."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.support import free_port

# A BaseHandler subclass that overrides preprocess and postprocess (TorchServe's custom
# handler guide), with the failures the tests provoke and a metric of its own.
LINEAR_HANDLER = """
import json
import os

import torch
from ts.torch_handler.base_handler import BaseHandler
from ts.utils.util import PredictionException


class LinearHandler(BaseHandler):
    def preprocess(self, data):
        rows = []
        for row in data:
            body = row.get("data") or row.get("body")
            if isinstance(body, (bytes, bytearray)):
                body = json.loads(body)
            if body == "fail":
                raise PredictionException("the input says fail", 418)
            if body == "crash":
                raise ValueError("the handler broke")
            if body == "exit":
                os._exit(1)
            rows.append(body["x"])
        return torch.tensor(rows, dtype=torch.float32)

    def postprocess(self, data):
        self.context.metrics.add_counter("LinearRows", len(data))
        return [{"y": [round(v, 4) for v in row]} for row in data.tolist()]

    def get_insights(self, tensor, inputs, target):
        return [{"target": target, "width": tensor.shape[1]} for _ in range(tensor.shape[0])]
"""

# The model file of the eager (state dict) archive: one torch.nn.Module class.
LINEAR_MODEL = """
import torch


class Linear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 2)

    def forward(self, x):
        return self.fc(x)
"""

# A module-level handle(data, context) (TorchServe's simplest custom handler).
ECHO_HANDLER = """
def handle(data, context):
    if data is None:  # the initialization call
        return None
    answers = []
    for index, row in enumerate(data):
        body = row.get("body")
        if body == "created":
            context.set_response_status(201, "Created", idx=index)
        if body == "csv":
            context.set_response_content_type(index, "text/csv")
            answers.append("a,b\\n1,2\\n")
            continue
        answers.append(
            {
                "params": {name: type(value).__name__ for name, value in row.items()},
                "values": {
                    name: value.decode() if isinstance(value, (bytes, bytearray)) else value
                    for name, value in row.items()
                },
                "explain": context.get_request_header(index, "explain"),
                "url_path": context.get_request_header(index, "url_path"),
            }
        )
    return answers
"""

# A plain class with initialize and handle, reading model-config.yaml; batched.
BATCH_HANDLER = """
class BatchCounter:
    def initialize(self, context):
        self.greeting = context.model_yaml_config["handler"]["greeting"]
        self.batch_size = context.system_properties["batch_size"]
        self.calls = 0

    def handle(self, data, context):
        self.calls += 1
        return [
            {
                "greeting": self.greeting,
                "batch": len(data),
                "batch_size": self.batch_size,
                "body": bytes(row["body"]).decode(),
            }
            for row in data
        ]
"""

BATCH_CONFIG = """
batchSize: 4
maxBatchDelay: 300
minWorkers: 1
maxWorkers: 2
responseTimeout: 30
handler:
  greeting: hello
"""

# Stands in for densenet161 (nothing may be downloaded): a JPEG in, class scores out.
IMAGE_HANDLER = """
import io

import torch
from PIL import Image
from ts.torch_handler.base_handler import BaseHandler

LABELS = ["tabby", "tiger_cat", "Egyptian_cat", "lynx", "Persian_cat"]


class ImageClassifier(BaseHandler):
    def preprocess(self, data):
        images = []
        for row in data:
            image = row.get("data") or row.get("body")
            picture = Image.open(io.BytesIO(image)).convert("RGB").resize((8, 8))
            pixels = torch.tensor(list(picture.getdata()), dtype=torch.float32) / 255.0
            images.append(pixels.flatten())
        return torch.stack(images)

    def postprocess(self, data):
        probabilities = torch.softmax(data, dim=1)
        return [
            {LABELS[i]: round(float(p), 4) for i, p in enumerate(row.tolist())}
            for row in probabilities
        ]
"""

# A streaming handler (TorchServe's streaming guide): intermediate answers, then the last.
STREAMING_HANDLER = """
from ts.handler_utils.utils import send_intermediate_predict_response


def handle(data, context):
    if data is None:
        return None
    for step in range(3):
        send_intermediate_predict_response(
            [f"part{step} " for _ in data],
            context.request_ids,
            "Intermediate Prediction success",
            200,
            context,
        )
    return ["end" for _ in data]
"""

# A handler that outlives its responseTimeout when asked to.
SLOW_HANDLER = """
import time


def handle(data, context):
    if data is None:
        return None
    if any(row.get("body") == b"sleep" for row in data):
        time.sleep(30)
    return ["done"] * len(data)
"""


def archiver() -> str:
    return str(Path(sys.executable).parent / "torch-model-archiver")


def archive(
    work: Path,
    store: Path,
    name: str,
    version: str,
    handler: str,
    *extra: str,
) -> Path:
    """``torch-model-archiver`` as a TorchServe user runs it."""
    subprocess.run(
        [
            archiver(),
            "--model-name",
            name,
            "--version",
            version,
            "--handler",
            handler,
            "--export-path",
            str(store),
            "--force",
            *extra,
        ],
        cwd=work,
        check=True,
        capture_output=True,
    )
    return store / name


def _write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(text).lstrip())
    return path


def build_store(root: Path) -> Path:
    """A model store with every archive the tests use; returns it."""
    import torch
    from PIL import Image

    work = root / "work"
    store = root / "store"
    work.mkdir(parents=True)
    store.mkdir()
    torch.manual_seed(0)
    linear = torch.nn.Linear(4, 2)
    with torch.no_grad():
        linear.weight.copy_(torch.arange(8, dtype=torch.float32).reshape(2, 4) / 10)
        linear.bias.zero_()
    torch.jit.script(linear.eval()).save(work / "linear.pt")
    _write(work, "model.py", LINEAR_MODEL)
    holder = {"fc." + k: v for k, v in linear.state_dict().items()}
    torch.save(holder, work / "linear_state.pt")
    _write(work, "linear_handler.py", LINEAR_HANDLER)
    _write(work, "echo_handler.py", ECHO_HANDLER)
    _write(work, "batch_handler.py", BATCH_HANDLER)
    _write(work, "model-config.yaml", BATCH_CONFIG)
    _write(work, "image_handler.py", IMAGE_HANDLER)
    _write(work, "slow_handler.py", SLOW_HANDLER)
    _write(work, "streaming_handler.py", STREAMING_HANDLER)
    (work / "slow.yaml").write_text("responseTimeout: 2\n")
    image = torch.nn.Sequential(torch.nn.Linear(192, 16), torch.nn.ReLU(), torch.nn.Linear(16, 5))
    torch.jit.script(image.eval()).save(work / "densenet161.pt")
    picture = Image.new("RGB", (64, 48))
    for x in range(64):
        for y in range(48):
            picture.putpixel((x, y), (x * 4, y * 5, (x + y) * 2))
    picture.save(root / "kitten.jpg", "JPEG")
    pt = ("--serialized-file", "linear.pt")
    archive(work, store, "linear", "1.0", "linear_handler.py", *pt)
    archive(
        work,
        store,
        "linear_eager",
        "2.0",
        "linear_handler.py",
        "--model-file",
        "model.py",
        "--serialized-file",
        "linear_state.pt",
    )
    archive(work, store, "echo", "1.0", "echo_handler.py")
    archive(
        work,
        store,
        "batched",
        "1.0",
        "batch_handler.py",
        "--config-file",
        "model-config.yaml",
        "--archive-format",
        "no-archive",
    )
    archive(
        work, store, "densenet161", "1.0", "image_handler.py", "--serialized-file", "densenet161.pt"
    )
    archive(work, store, "slow", "1.0", "slow_handler.py", "--config-file", "slow.yaml")
    archive(work, store, "imageclass", "1.0", "image_classifier", *pt)
    archive(work, store, "streaming", "1.0", "streaming_handler.py")
    return store


@pytest.fixture(scope="session")
def torchserve_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_store(tmp_path_factory.mktemp("torchserve"))


@dataclass
class Ports:
    """TorchServe's four ports, on free ports of loopback."""

    inference: int = field(default_factory=free_port)
    management: int = field(default_factory=free_port)
    grpc_inference: int = field(default_factory=free_port)
    grpc_management: int = field(default_factory=free_port)

    def args(self) -> list[str]:
        return [
            "--torchserve-inference-port",
            str(self.inference),
            "--torchserve-management-port",
            str(self.management),
            "--torchserve-grpc-inference-port",
            str(self.grpc_inference),
            "--torchserve-grpc-management-port",
            str(self.grpc_management),
        ]

    @property
    def inference_url(self) -> str:
        return f"http://127.0.0.1:{self.inference}"

    @property
    def management_url(self) -> str:
        return f"http://127.0.0.1:{self.management}"
