"""``--http-workers``: a number, or auto by the stated rule (the models' size does not count:
they load once, in the model host)."""

from __future__ import annotations

from pathlib import Path

import pytest

from inferd.app.settings import Settings
from inferd.core.errors import ConfigError
from inferd.workers import sizing


def _count(settings: Settings) -> tuple[int, str]:
    """The count ``inferd serve`` runs with these settings."""
    return sizing.worker_count(settings.http_workers, settings.lazy_serving())


def _repo(tmp_path: Path, sizes: dict[str, int]) -> Path:
    for name, size in sizes.items():
        (tmp_path / name / "1").mkdir(parents=True)
        (tmp_path / name / "1" / "model.onnx").write_bytes(b"\0" * size)
    return tmp_path


def test_a_number_is_taken_as_given(tmp_path: Path) -> None:
    settings = Settings(model_repository=[str(tmp_path)], http_workers="3")
    assert _count(settings) == (3, "--http-workers")


@pytest.mark.parametrize("text", ["0", "-1", "two", ""])
def test_a_bad_count_is_refused(tmp_path: Path, text: str) -> None:
    with pytest.raises(ConfigError, match="--http-workers must be a positive number or auto"):
        _count(Settings(model_repository=[str(tmp_path)], http_workers=text))


def test_auto_is_the_cores_whatever_the_models_weigh(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sizing, "usable_cores", lambda: 4)
    monkeypatch.setattr(sizing, "available_memory_bytes", lambda: 8 << 30)
    settings = Settings(model_repository=[str(_repo(tmp_path, {"a": 1000, "big": 300 << 20}))])
    count, why = _count(settings)
    assert count == 4 and "load once" in why
    # A store that is not a local folder does not matter either.
    assert _count(Settings(model_repository=["s3://bucket/models"]))[0] == 4


def test_auto_runs_as_many_frontends_as_fit_in_half_the_memory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sizing, "usable_cores", lambda: 8)
    monkeypatch.setattr(sizing, "available_memory_bytes", lambda: 2 * 3 * sizing.FRONTEND_BYTES)
    count, why = _count(Settings(model_repository=["models"]))
    assert count == 4 and "3 frontend(s)" in why  # the host and 3 frontends
    monkeypatch.setattr(sizing, "available_memory_bytes", lambda: sizing.FRONTEND_BYTES)
    assert _count(Settings(model_repository=["models"]))[0] == 1
    monkeypatch.setattr(sizing, "available_memory_bytes", lambda: None)
    assert _count(Settings(model_repository=["models"]))[0] == 1


def test_auto_is_one_on_one_core(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sizing, "usable_cores", lambda: 1)
    monkeypatch.setattr(sizing, "available_memory_bytes", lambda: 64 << 30)
    assert _count(Settings(model_repository=[str(tmp_path)]))[0] == 1


def test_auto_is_one_process_on_two_cores_and_frontends_from_three(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sizing, "available_memory_bytes", lambda: 64 << 30)
    settings = Settings(model_repository=[str(tmp_path)])
    monkeypatch.setattr(sizing, "usable_cores", lambda: 2)
    count, why = _count(settings)
    assert count == 1 and "2 usable CPU cores: one process" in why
    monkeypatch.setattr(sizing, "usable_cores", lambda: 3)
    assert _count(settings) == (
        3,
        "3 usable CPU cores; the models load once, in worker 0",
    )


def test_lazy_serving_auto_is_one_and_a_number_is_taken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Auto: one process (a warm hit skips the hop); a number: that many, sharing one budget.
    monkeypatch.setattr(sizing, "usable_cores", lambda: 4)
    monkeypatch.setattr(sizing, "available_memory_bytes", lambda: 8 << 30)
    repo = [str(tmp_path)]
    by_memory = Settings(model_repository=repo, model_memory_budget="1Gi")
    by_count = Settings(model_repository=repo, max_loaded_models=2, http_workers="3")
    assert by_memory.lazy_serving() and by_count.lazy_serving()
    count, reason = _count(by_memory)
    assert count == 1 and "lazy serving" in reason
    assert _count(by_count) == (3, "--http-workers")
