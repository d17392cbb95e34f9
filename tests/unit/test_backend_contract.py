"""The backend contract: every hook's default, and backends found through entry points (a
built-in wins over a same-named one; one that fails to load fails only its models)."""

from __future__ import annotations

import ast
import logging
import textwrap
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pytest

import inferd.backends as backends
from inferd.backends import entry_points, get_backend, select_backend
from inferd.backends.base import Backend, InstancePlacement
from inferd.backends.work import BatchExecutor, Runtime, Work
from inferd.config.model_config_pb2 import ModelConfig
from inferd.config.text import parse_config_text
from inferd.core.errors import ConfigError, InvalidInput
from inferd.core.stats import ModelStats
from inferd.core.types import Tensors


class Plus(Runtime):
    def execute(self, inputs: Tensors, output_names: Sequence[str]) -> Tensors:
        return {"y": inputs["x"] + 1}


class Minimal(Backend):
    name = "minimal"

    def load(self, version_dir: Path, config: ModelConfig, placement: InstancePlacement) -> Plus:
        return Plus()


def test_every_hook_has_its_default() -> None:
    backend, config, where = Minimal(), ModelConfig(name="m"), InstancePlacement("CPU", 0, 1)
    assert backend.platforms == () and backend.default_filename == ""
    assert backend.processes_only is False and backend.gpu_available() is False
    assert backend.prime() is False and tuple(backend.dependencies(config)) == ()
    assert backend.signatures(Path("."), config) == {}
    assert backend.load_executor(Path("."), config, where) is None
    assert backend.process_recipe(Path("."), config, where) is None
    assert backend.load_scheduler(config, None, ModelStats()) is None
    with pytest.raises(ConfigError, match="minimal backend reads no inputs and outputs"):
        backend.complete_config(Path("."), config, 8)
    runtime = backend.load(Path("."), config, where)
    assert runtime.inline is False
    runtime.close()
    with pytest.raises(InvalidInput, match="no signature 'other'"):
        runtime.execute_signature("other", {}, ["y"])
    work = Work({"x": np.array([[1.0]], np.float32)}, 1, ("y",))
    (result,) = BatchExecutor("m", runtime).execute([work]).results
    assert isinstance(result, dict) and result["y"].tolist() == [[2.0]]


def test_a_backend_must_say_how_it_loads() -> None:
    class NoLoad(Backend):
        name = "noload"

    with pytest.raises(TypeError, match="load"):
        NoLoad()  # type: ignore[abstract]


_MODULE = """
from inferd.backends.base import Backend
from inferd.backends.work import Runtime


class Twice(Runtime):
    def execute(self, inputs, output_names):
        return {"y": inputs["x"] * 2}


class TwiceBackend(Backend):
    name = "{name}"
    platforms = ("twice_platform",)

    def load(self, version_dir, config, placement):
        return Twice()


class NotABackend:
    name = "{name}"
"""


def _distribution(site: Path, dist: str, entries: dict[str, str], module: str = "") -> None:
    """A distribution as pip leaves it: a module and a .dist-info with its entry points."""
    info = site / f"{dist}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
    lines = "".join(f"{name} = {target}\n" for name, target in entries.items())
    (info / "entry_points.txt").write_text(f"[inferd.backends]\n{lines}")
    if module:
        (site / f"{dist.replace('-', '_')}.py").write_text(module)


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(backends, "_cache", {})
    monkeypatch.setattr(entry_points, "_reported", set())
    yield tmp_path


def _config(text: str) -> ModelConfig:
    return parse_config_text(textwrap.dedent(text))


def test_an_entry_point_backend_is_found_by_name_and_by_platform(site: Path) -> None:
    _distribution(
        site,
        "twice-backend",
        {"twice": "twice_backend:TwiceBackend"},
        _MODULE.replace("{name}", "twice"),
    )
    assert "twice" in backends.available()
    by_name = select_backend(_config('name: "m"\nbackend: "twice"'), [])
    assert by_name is get_backend("twice") and by_name.name == "twice"
    by_platform = select_backend(_config('name: "m"\nplatform: "twice_platform"'), [])
    assert by_platform is by_name
    runtime = by_name.load(site, ModelConfig(), InstancePlacement("CPU", 0, 1))
    assert runtime.execute({"x": np.array([3])}, ["y"])["y"].tolist() == [6]


def test_an_entry_point_that_fails_to_import_names_its_distribution(site: Path) -> None:
    _distribution(
        site,
        "broken-backend",
        {"broken": "broken_backend:Missing"},
        "raise ImportError('no libfoo')\n",
    )
    with pytest.raises(ConfigError) as caught:
        select_backend(_config('name: "m"\nbackend: "broken"'), [])
    message = caught.value.message
    assert "backend 'broken'" in message and "broken-backend 1.0" in message
    assert "ImportError: no libfoo" in message
    # asked for a platform nobody lists, the failure is named too; built-ins still load
    with pytest.raises(ConfigError, match=r"unsupported platform 'nope'.*broken-backend 1.0"):
        select_backend(_config('name: "m"\nplatform: "nope"'), [])
    assert get_backend("echo").name == "echo"


def test_an_entry_point_that_is_not_a_backend_is_refused(site: Path) -> None:
    _distribution(
        site, "odd-backend", {"odd": "odd_backend:NotABackend"}, _MODULE.replace("{name}", "odd")
    )
    with pytest.raises(ConfigError, match=r"odd-backend 1.0\) is not a subclass of inferd"):
        get_backend("odd")


def test_a_built_in_wins_over_a_same_named_entry_point(
    site: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _distribution(
        site,
        "shadow-backend",
        {"echo": "shadow_backend:TwiceBackend"},
        _MODULE.replace("{name}", "echo"),
    )
    with caplog.at_level(logging.WARNING, logger="inferd.backends"):
        assert backends.available().count("echo") == 1
    assert type(get_backend("echo")).__module__ == "inferd.backends.echo"
    assert "backend 'echo' of the distribution shadow-backend 1.0 is ignored" in caplog.text


def test_two_distributions_with_one_name_select_neither(site: Path) -> None:
    module = _MODULE.replace("{name}", "same")
    _distribution(site, "one-backend", {"same": "one_backend:TwiceBackend"}, module)
    _distribution(site, "two-backend", {"same": "two_backend:TwiceBackend"}, module)
    with pytest.raises(
        ConfigError, match=r"several distributions \(one-backend 1.0, two-backend 1.0\)"
    ):
        get_backend("same")


# Packages above the backends: they use backends, never the other way round.
_ABOVE = {"scheduling", "repository", "workers", "app", "protocols", "dashboard", "cli"}


def test_backends_import_nothing_from_the_layers_above_them() -> None:
    root = Path(backends.__file__).parent
    upward: list[str] = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            else:
                continue
            for name in names:
                parts = name.split(".")
                if parts[0] == "inferd" and len(parts) > 1 and parts[1] in _ABOVE:
                    upward.append(f"{path.relative_to(root)}: {name}")
    assert upward == []
