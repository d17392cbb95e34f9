"""CodePolicy: what each --allow-* setting grants by a model's origin."""

from __future__ import annotations

from pathlib import Path

import pytest

from inferd.core.errors import ConfigError
from inferd.security.trust import (
    Capability,
    CodeNotAllowed,
    CodePolicy,
    Grant,
    Grants,
    Origin,
    granted,
    require,
)

PICKLE = Capability.PICKLE


@pytest.mark.parametrize(
    ("grant", "admin_token", "expected"),
    [
        (Grant.NEVER, True, {Origin.STARTUP: False, Origin.REPOSITORY: False, Origin.API: False}),
        (Grant.STARTUP, True, {Origin.STARTUP: True, Origin.REPOSITORY: False, Origin.API: False}),
        (Grant.ALWAYS, False, {Origin.STARTUP: True, Origin.REPOSITORY: True, Origin.API: False}),
        (Grant.ALWAYS, True, {Origin.STARTUP: True, Origin.REPOSITORY: True, Origin.API: True}),
    ],
)
def test_grants_by_origin(grant: Grant, admin_token: bool, expected: dict[Origin, bool]) -> None:
    policy = CodePolicy(pickle=grant, admin_token=admin_token)
    assert {o: policy.allows(PICKLE, o) for o in Origin} == expected


def test_require_names_the_flag_and_why() -> None:
    with pytest.raises(CodeNotAllowed, match="no server granted --allow-pickle"):
        require(PICKLE, "model.joblib is a pickle")
    with granted(CodePolicy().grants(Origin.API)), pytest.raises(CodeNotAllowed) as info:
        require(PICKLE, "model.joblib is a pickle")
    assert "sent through the repository API" in info.value.message
    assert "--allow-pickle always" in info.value.message
    with granted(CodePolicy().grants(Origin.STARTUP)):
        require(PICKLE, "model.joblib is a pickle")  # allowed: nothing raised


def test_grant_parsing() -> None:
    assert Grant.parse("true", "--allow-pickle") is Grant.ALWAYS
    assert Grant.parse("off", "--allow-pickle") is Grant.NEVER
    assert Grant.parse("startup", "--allow-pickle") is Grant.STARTUP
    with pytest.raises(ConfigError, match="never, startup or always"):
        Grant.parse("maybe", "--allow-pickle")


def test_grants_travel_to_a_worker_process_as_plain_values() -> None:
    import pickle

    policy = CodePolicy(pickle=Grant.ALWAYS, python_models=Grant.NEVER, admin_token=True)
    grants = policy.grants(Origin.API)
    plain = grants.plain()
    assert pickle.loads(pickle.dumps(plain)) == plain  # builtins only: no class to import
    assert Grants.from_plain(plain) == grants
    with granted(Grants.from_plain(plain)):
        require(PICKLE, "x.joblib is a pickle")
        with pytest.raises(CodeNotAllowed, match="--allow-python-models never"):
            require(Capability.PYTHON_MODELS, "model.py is a Python model")


def test_a_framework_recipe_carries_the_grants_where_it_is_made() -> None:
    from inferd.backends import get_backend
    from inferd.backends.base import InstancePlacement
    from inferd.config.model_config_pb2 import ModelConfig
    from inferd.scheduling.recipe import backend_recipe

    backend, placement = get_backend("echo"), InstancePlacement("CPU", 0, 1, 0)
    config = ModelConfig(name="m")
    assert backend_recipe(backend, Path("/m/1"), config, placement, "m/1").args[-1] is None
    grants = CodePolicy().grants(Origin.STARTUP)
    with granted(grants):
        recipe = backend_recipe(backend, Path("/m/1"), config, placement, "m/1")
    assert recipe.args[-1] == grants.plain()


def test_a_python_model_needs_the_grant_before_its_code_runs(tmp_path: Path) -> None:
    from inferd.backends.python.backend import PythonBackend
    from inferd.config.model_config_pb2 import ModelConfig

    marker = tmp_path / "ran"
    version = tmp_path / "m" / "1"
    version.mkdir(parents=True)
    (version / "model.py").write_text(f"open({str(marker)!r}, 'w')\n")
    config = ModelConfig(name="m", backend="python")  # completing it would import model.py
    with pytest.raises(CodeNotAllowed, match=r"model\.py is a Python model"):
        PythonBackend().complete_config(version, config, 8)
    with (
        granted(CodePolicy().grants(Origin.REPOSITORY)),
        pytest.raises(CodeNotAllowed, match="--allow-python-models is 'startup'"),
    ):
        PythonBackend().complete_config(version, config, 8)
    assert not marker.exists()
