"""PyTorch backend end to end: TorchScript and torch.export models built at test time."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import numpy as np
import pytest

from tests.e2e.backend_checks import (
    BATCHING,
    check_all_protocols,
    check_batching,
    unavailable_reason,
    version_dir,
    write_config,
)
from tests.support import ServerProcess

if TYPE_CHECKING:  # mypy sees the module (as Any: torch is not followed, see pyproject)
    import torch
else:
    torch = pytest.importorskip("torch")
# torch.jit.script warns that TorchScript is deprecated; serving its files is the point here.
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

# Triton's naming convention, so the config maps names to forward's positions.
SCRIPT_CONFIG = """
input [{ name: "INPUT__0" data_type: TYPE_FP32 dims: [16] }]
output [
  { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [4] },
  { name: "OUTPUT__1" data_type: TYPE_INT64 dims: [1] reshape: { shape: [] } }
]
"""
ONE_THREAD = 'parameters { key: "intra_op_thread_count" value: { string_value: "1" } }\n'


class Mlp(torch.nn.Module):  # type: ignore[misc]
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.Sequential(
            torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)
        )

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        scores = torch.softmax(self.layers(x), dim=1)
        return scores, scores.argmax(dim=1)


class Scaled(torch.nn.Module):  # type: ignore[misc]
    def forward(self, x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        return x * scale + 1.0


@pytest.fixture(scope="module")
def mlp() -> Mlp:
    torch.manual_seed(0)
    model = Mlp()
    model.eval()
    return model


@pytest.fixture(scope="module")
def torch_server(mlp: Mlp, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("torch") / "models"
    scripted = torch.jit.script(mlp)
    for name, config in (
        ("script", SCRIPT_CONFIG + "max_batch_size: 64\n" + ONE_THREAD),
        ("script_batched", SCRIPT_CONFIG + BATCHING),
        ("script_no_config", ""),
    ):
        scripted.save(str(version_dir(root, name) / "model.pt"))
        write_config(root, name, config)
    batch = torch.export.Dim("batch", min=1, max=1024)
    example = (torch.randn(2, 3), torch.randn(2, 3))
    program = torch.export.export(
        Scaled(), example, dynamic_shapes={"x": {0: batch}, "scale": {0: batch}}
    )
    torch.export.save(program, str(version_dir(root, "exported") / "model.pt2"))
    # script_no_config fails to load on purpose: ready means "startup is done", not "all READY".
    server = ServerProcess(root, extra_args=["--strict-readiness=false"]).start(timeout_s=120)
    yield server
    server.stop()


def test_torchscript(torch_server: ServerProcess, mlp: Mlp) -> None:
    rows = np.random.default_rng(0).standard_normal((5, 16)).astype(np.float32)
    with torch.inference_mode():
        scores, labels = mlp(torch.from_numpy(rows))
    expected = {"OUTPUT__0": scores.numpy(), "OUTPUT__1": labels.numpy()}
    check_all_protocols(torch_server, "script", {"INPUT__0": rows}, expected)


def test_exported_program_completes_its_config(torch_server: ServerProcess) -> None:
    meta = httpx.get(f"{torch_server.http_url}/v2/models/exported", timeout=60).json()
    assert meta["platform"] == "pytorch_libtorch"
    assert meta["inputs"] == [
        {"name": "x", "datatype": "FP32", "shape": [-1, 3]},
        {"name": "scale", "datatype": "FP32", "shape": [-1, 3]},
    ]
    assert meta["outputs"] == [{"name": "OUTPUT__0", "datatype": "FP32", "shape": [-1, 3]}]
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 3)).astype(np.float32)
    scale = rng.standard_normal((4, 3)).astype(np.float32)
    check_all_protocols(
        torch_server, "exported", {"x": x, "scale": scale}, {"OUTPUT__0": x * scale + 1.0}
    )


def test_dynamic_batching(torch_server: ServerProcess, mlp: Mlp) -> None:
    rows = np.random.default_rng(2).standard_normal((6, 16)).astype(np.float32)
    with torch.inference_mode():
        scores, _ = mlp(torch.from_numpy(rows))
    check_batching(torch_server, "script_batched", "INPUT__0", rows, "OUTPUT__0", scores.numpy())


def test_torchscript_needs_a_config(torch_server: ServerProcess) -> None:
    reason = unavailable_reason(torch_server, "script_no_config")
    assert "list every input and output in config.pbtxt" in reason
    assert "torch.export" in reason


def test_missing_extra_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from inferd.backends.base import InstancePlacement
    from inferd.backends.torch import TorchBackend
    from inferd.config.text import parse_config_text
    from inferd.core.errors import ModelLoadError

    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(ModelLoadError, match=r"pip install .*\[torch\]"):
        TorchBackend().load(
            tmp_path, parse_config_text(SCRIPT_CONFIG), InstancePlacement("CPU", 0, 1)
        )
