"""CodePolicy: what each --allow-* setting grants by a model's origin."""

from __future__ import annotations

import pytest

from inferd.errors import ConfigError
from inferd.trust import Capability, CodeNotAllowed, CodePolicy, Grant, Origin, granted, require

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
