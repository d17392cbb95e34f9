"""Install hints name what works without a package index that has inferd: the checkout's
folder for an editable install, else the packages of the extra from the installed metadata."""

from __future__ import annotations

import platform
import sys
from pathlib import Path

import pytest

from inferd import install
from inferd.install import install_hint

ROOT = Path(__file__).resolve().parents[2]


def test_from_a_checkout_the_hint_installs_the_checkout() -> None:
    assert install.checkout() == ROOT
    assert install_hint("demo") == f"pip install -e '{ROOT}[demo]'"


def test_from_a_wheel_the_hint_names_the_extras_packages(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(install, "checkout", lambda: None)
    assert install_hint("bench") == "pip install 'matplotlib>=3.8' 'tqdm>=4.66'"
    assert install_hint("demo").startswith("pip install 'scikit-learn>=1.4' 'pillow>=10'")
    tensorflow = install_hint("tensorflow")  # one of the two platform-marked requirements
    if sys.platform == "linux" and platform.machine() == "x86_64":
        assert tensorflow == "pip install 'tensorflow-cpu>=2.16'"
    else:
        assert tensorflow == "pip install 'tensorflow>=2.16'"
    everything = install_hint("all")  # inferd[...] within an extra is expanded
    assert "inferd" not in everything and "'torch==2.13.0'" in everything
    assert "'pyyaml>=6'" in everything and "'lightgbm>=4.0'" in everything
