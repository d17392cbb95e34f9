"""The image and the wheel: the Dockerfile installs with the documented commands, a built wheel
serves the demo from a fresh venv, and ./scripts/serve-demo installs only the light set.

No Docker engine runs here, so the Dockerfile's install steps are compared with those of
docs/scale-out/image.md and then run (cheaply: ``--no-isolation`` for the build, ``--no-deps``
for the install, the dependencies seen through a ``.pth`` file onto this interpreter's
site-packages).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

import httpx

from tests.support import ServerProcess

ROOT = Path(__file__).parents[2]
HEAVY = ("tensorflow", "torch", "openvino")


def _dockerfile_steps() -> list[str]:
    """The install commands of the Dockerfile's RUN instructions, in order."""
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    steps = []
    for line in text.splitlines():
        if line.startswith("RUN "):
            for command in line[4:].split("&&"):
                command = " ".join(command.split())
                if command.startswith(("python ", "/opt/inferd/")):
                    steps.append(command)
    return steps


def _documented_steps() -> list[str]:
    page = (ROOT / "docs" / "scale-out" / "image.md").read_text()
    found = re.search(r"<!-- image install steps -->\n```bash\n(.*?)```", page, re.S)
    assert found, "docs/scale-out/image.md: no image install steps block"
    return [line for line in found.group(1).splitlines() if line and not line.startswith("#")]


def test_the_dockerfile_installs_with_the_documented_commands() -> None:
    steps = _dockerfile_steps()
    assert steps == _documented_steps()
    assert steps == [
        'python -m pip install "build>=1.2"',
        "python -m build --wheel --outdir dist .",
        "python -m venv /opt/inferd",
        '/opt/inferd/bin/pip install "$(ls dist/inferd-*.whl)${EXTRAS:+[$EXTRAS]}"',
    ]
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert re.search(r"^FROM python:\$\{PYTHON_VERSION\}-slim AS build$", dockerfile, re.M)
    assert re.search(r"^USER 10001:10001$", dockerfile, re.M)
    assert re.search(r'^ENTRYPOINT \["inferd", "serve"\]$', dockerfile, re.M)
    assert "HEALTHCHECK" in dockerfile and "/v2/health/ready" in dockerfile


def test_serve_demo_installs_the_light_set_and_test_everything() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    demo = " ".join(extras["optional-dependencies"]["demo"] + extras["dependencies"])
    assert not [name for name in HEAVY if name in demo]
    serve_demo = (ROOT / "scripts" / "serve-demo").read_text()
    assert "VENV=.venv-demo SETUP_EXTRAS=demo scripts/setup" in serve_demo
    setup = (ROOT / "scripts" / "setup").read_text()
    assert "EXTRAS=${SETUP_EXTRAS:-dev,all}" in setup  # ./scripts/test: everything
    assert "scripts/setup\n" in (ROOT / "scripts" / "test").read_text()


def _copy_source(target: Path) -> None:
    target.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, target / name)
    shutil.copytree(
        ROOT / "src", target / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info")
    )


def _run_step(step: str, old: str, new: str, cwd: Path, env: dict[str, str]) -> None:
    """One documented install step, run by bash with ``old`` (its start) replaced by ``new``."""
    assert step.startswith(old), step
    done = subprocess.run(
        ["bash", "-c", new + step[len(old) :]], cwd=cwd, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, f"{step}:\n{done.stdout[-2000:]}{done.stderr[-2000:]}"


def test_a_built_wheel_serves_the_demo_from_a_fresh_venv(tmp_path: Path) -> None:
    """The documented image install steps, made cheap: the build without an isolated
    environment, the venv without its own pip, the install of inferd alone."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"EXTRAS": ""}
    source = tmp_path / "source"
    _copy_source(source)
    venv = tmp_path / "venv"
    python = venv / "bin" / "python"
    _, build, make_venv, install = _documented_steps()
    _run_step(build, "python -m build", f"{sys.executable} -m build --no-isolation", source, env)
    _run_step(
        make_venv,
        "python -m venv /opt/inferd",
        f"{sys.executable} -m venv --without-pip {venv}",
        source,
        env,
    )
    pip = f"{sys.executable} -m pip --python {python} install -q --no-deps"
    _run_step(install, "/opt/inferd/bin/pip install", pip, source, env)
    (wheel,) = (source / "dist").glob("inferd-*.whl")
    for extras, expected in (
        ("", wheel.name),
        ("sklearn,xgboost", f"{wheel.name}[sklearn,xgboost]"),
    ):
        argument = install.split(" install ", 1)[1]  # what the step hands pip, once expanded
        shown = subprocess.run(
            ["bash", "-c", f"echo {argument}"],
            cwd=source,
            env=env | {"EXTRAS": extras},
            capture_output=True,
            text=True,
        )
        assert shown.stdout.strip() == f"dist/{expected}"
    names = zipfile.ZipFile(wheel).namelist()
    assert "inferd/py.typed" in names and "inferd/config/model_config.proto" in names
    assert "inferd/protocols/grpc_service_pb2.pyi" in names
    assert not [n for n in names if n.startswith("tests/")]

    # The dependencies, not inferd: a .pth line adds a folder but not the .pth files in it
    # (so not this checkout's editable install).
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    (Path(purelib) / "shared-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    where = subprocess.run(
        [str(python), "-c", "import inferd; print(inferd.__file__)"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert where.startswith(str(venv)), where
    version = subprocess.run(
        [str(venv / "bin" / "inferd"), "--version"], env=env, capture_output=True, text=True
    )
    assert version.stdout.strip() == "inferd 0.1.0"
    models = tmp_path / "models"
    subprocess.run(
        [str(venv / "bin" / "inferd"), "demo-models", str(models), "--model", "half_plus_two"],
        env=env,
        check=True,
        capture_output=True,
    )
    server = ServerProcess(models, python=str(python), env={"PYTHONPATH": ""})
    server.start()
    try:
        body = {"instances": [1.0, 2.0, 5.0]}
        r = httpx.post(f"{server.http_url}/v1/models/half_plus_two:predict", json=body, timeout=60)
        assert r.json() == {"predictions": [2.5, 3.0, 4.5]}
    finally:
        server.stop()
