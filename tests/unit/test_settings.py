"""Settings: flags named like Triton's, INFERD_* variables, flag over environment."""

from __future__ import annotations

import gc
import sys
from pathlib import Path

import pytest

from inferd.app import flags, settings
from inferd.app.repository import model_manager
from inferd.app.server import set_gc_threshold, set_gil_switch_interval
from inferd.core.errors import ConfigError
from inferd.plane.registry import Registry


def test_defaults() -> None:
    s = flags.parse([], environ={})
    assert s.http_port == 8080
    assert s.model_repository == []
    assert s.models_to_load() is None


def test_flags_and_environment() -> None:
    env = {
        "INFERD_HTTP_PORT": "9000",
        "INFERD_MODEL_REPOSITORY": "/a,/b",
        "INFERD_LOG_VERBOSE": "1",
    }
    s = flags.parse(["--http-port", "9100", "--load-model", "digits"], environ=env)
    assert s.http_port == 9100  # the flag wins
    assert s.model_repository == ["/a", "/b"]
    assert s.log_verbose == 1
    assert s.models_to_load() == ["digits"]
    s = flags.parse(["--disable-auto-complete-config"], environ={})
    assert s.disable_auto_complete_config is True
    s = flags.parse(["--disable-auto-complete-config=false"], environ={})
    assert s.disable_auto_complete_config is False


def test_repository_fault_and_readiness_flags() -> None:
    s = flags.parse([], environ={})
    assert (s.strict_readiness, s.repository_unload_max_fraction) == (True, 0.5)
    assert s.repository_unload_grace_s == 60
    env = {"INFERD_REPOSITORY_UNLOAD_MAX_FRACTION": "0.25"}
    s = flags.parse(["--strict-readiness=false", "--repository-unload-grace-s", "5"], env)
    assert (s.strict_readiness, s.repository_unload_max_fraction) == (False, 0.25)
    assert s.repository_unload_grace_s == 5
    with pytest.raises(ConfigError, match="invalid value for --repository-unload-max-fraction"):
        flags.parse(["--repository-unload-max-fraction", "half"], environ={})
    for flag, value, message in (
        ("--repository-unload-max-fraction", "1.5", "above 0 and at most 1"),
        ("--repository-unload-grace-s", "-1", "must be 0 or more"),
    ):
        bad = flags.parse(["--model-repository", "/tmp", flag, value], environ={})
        with pytest.raises(ConfigError, match=message):
            model_manager(bad, Registry(), None)


def test_gc_threshold() -> None:
    assert flags.parse([], environ={}).gc_threshold == 10_000
    s = flags.parse([], environ={"INFERD_GC_THRESHOLD": "5000"})
    assert s.gc_threshold == 5000
    before = gc.get_threshold()
    try:
        set_gc_threshold(s.gc_threshold)
        assert gc.get_threshold() == (5000, before[1], before[2])
        set_gc_threshold(0)  # 0: the current thresholds stay
        assert gc.get_threshold() == (5000, before[1], before[2])
    finally:
        gc.set_threshold(*before)


def test_gil_switch_interval() -> None:
    assert flags.parse([], environ={}).gil_switch_interval_us == 500
    s = flags.parse(["--gil-switch-interval-us", "200"], environ={})
    assert s.gil_switch_interval_us == 200
    before = sys.getswitchinterval()
    try:
        set_gil_switch_interval(s.gil_switch_interval_us)
        assert sys.getswitchinterval() == pytest.approx(200e-6, rel=0.01)
        set_gil_switch_interval(0)  # 0: Python's own stays
        assert sys.getswitchinterval() == pytest.approx(200e-6, rel=0.01)
    finally:
        sys.setswitchinterval(before)


def test_keywords_are_the_same_settings() -> None:
    s = flags.from_keywords(
        {
            "model_repository": Path("/m"),
            "http_port": 9000,
            "strict_readiness": False,
            "repository_unload_max_fraction": 1,
            "load_model": "digits",
            "log_verbose": "2",  # a flag's text is taken too
            "allow_grpc": "false",
        }
    )
    assert s.model_repository == ["/m"] and s.load_model == ["digits"]
    assert (s.http_port, s.strict_readiness, s.log_verbose, s.allow_grpc) == (9000, False, 2, False)
    assert s.repository_unload_max_fraction == 1.0
    assert isinstance(s.repository_unload_max_fraction, float)
    base = settings.Settings(server_name="a", http_port=1)
    assert flags.from_keywords({"http_port": 2}, base) == settings.Settings(
        server_name="a", http_port=2
    )
    assert flags.from_keywords({}) == settings.Settings()


def test_keywords_are_checked() -> None:
    with pytest.raises(ConfigError, match="unknown setting 'http_prot'; did you mean 'http_port'"):
        flags.from_keywords({"http_prot": 1})
    with pytest.raises(ConfigError, match=r"setting 'http_port' must be int, got float 1\.5"):
        flags.from_keywords({"http_port": 1.5})
    with pytest.raises(ConfigError, match="setting 'http_port' must be int, got bool"):
        flags.from_keywords({"http_port": True})
    with pytest.raises(ConfigError, match="invalid value for --http-port"):
        flags.from_keywords({"http_port": "eighty"})
    with pytest.raises(ConfigError, match="'load_model' takes a string or a list of strings"):
        flags.from_keywords({"load_model": [1]})
