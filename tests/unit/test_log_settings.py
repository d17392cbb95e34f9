"""Log settings: Triton's typed keys over the engine log, applied to the next line."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from inferd.core.errors import InvalidInput
from inferd.observability.log_settings import LogSettings
from inferd.observability.logging import Logs


def test_switches_format_and_file_apply_at_once(tmp_path: Path) -> None:
    settings = LogSettings(Logs(log_file=str(tmp_path / "a.log")))
    log = logging.getLogger("inferd.test_log_settings")
    settings.update({"log_warning": False})
    log.warning("hidden")
    log.error("shown")
    settings.update({"log_file": str(tmp_path / "b.log"), "log_format": "ISO8601"})
    log.error("moved")
    settings.update({"log_verbose_level": 2})
    log.debug("detail")
    a = (tmp_path / "a.log").read_text()
    b = (tmp_path / "b.log").read_text().splitlines()
    assert "shown" in a and "hidden" not in a and "moved" not in a
    assert b[0].endswith("Z ERROR inferd.test_log_settings: moved")
    assert b[0][10] == "T"  # 2024-05-01T12:00:00Z
    assert b[1].endswith("DEBUG inferd.test_log_settings: detail")
    assert settings.get() == {
        "log_file": str(tmp_path / "b.log"),
        "log_info": True,
        "log_warning": False,
        "log_error": True,
        "log_verbose_level": 2,
        "log_format": "ISO8601",
    }
    settings.update({"log_file": "", "log_verbose_level": 0, "log_warning": True})


def test_bad_settings_change_nothing(tmp_path: Path) -> None:
    settings = LogSettings(Logs())
    before = settings.get()
    for changes, fragment in (
        ({"log_info": 1}, "must be of type bool"),
        ({"log_verbose_level": True}, "must be of type int"),
        ({"log_level": "x"}, "unknown log setting"),
        ({"log_info": False, "log_file": str(tmp_path / "no" / "x.log")}, "cannot open"),
    ):
        with pytest.raises(InvalidInput, match=fragment):
            settings.update(changes)
        assert settings.get() == before
