"""Settings: flags named like Triton's, INFERD_* variables, flag over environment."""

from __future__ import annotations

from inferd import settings


def test_defaults() -> None:
    s = settings.parse([], environ={})
    assert s.http_port == 8080
    assert s.model_repository == []
    assert s.models_to_load() is None


def test_flags_and_environment() -> None:
    env = {
        "INFERD_HTTP_PORT": "9000",
        "INFERD_MODEL_REPOSITORY": "/a,/b",
        "INFERD_LOG_VERBOSE": "1",
    }
    s = settings.parse(["--http-port", "9100", "--load-model", "digits"], environ=env)
    assert s.http_port == 9100  # the flag wins
    assert s.model_repository == ["/a", "/b"]
    assert s.log_verbose == 1
    assert s.models_to_load() == ["digits"]
    s = settings.parse(["--disable-auto-complete-config"], environ={})
    assert s.disable_auto_complete_config is True
    s = settings.parse(["--disable-auto-complete-config=false"], environ={})
    assert s.disable_auto_complete_config is False
