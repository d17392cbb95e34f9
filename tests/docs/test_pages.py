"""The docs and the README hold together: the generated reference covers the code, the README
stays short and its links lead somewhere, every page is in the site's navigation, and no file
speaks of work sessions."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import yaml
from inferd_docs import cli, config, endpoints
from inferd_docs.examples import blocks

from tests.docs.extras import hiding_folder, missing_modules

ROOT = Path(__file__).resolve().parents[2]
README_MAX_LINES = 200


def test_every_config_field_route_and_rpc_has_a_description() -> None:
    assert config.missing() == []
    assert endpoints.missing() == []


def test_the_reference_pages_are_generated_from_the_code() -> None:
    flags = cli.reference()
    assert "## `inferd serve`" in flags and "| `--model-repository VALUE` |" in flags
    assert "| `--grpc-max-message-bytes N` | `134217728` (128 MiB) |" in flags
    assert "## `inferd repo push`" in flags
    serve = flags.split("## `inferd serve`", 1)[1].split("\n## ", 1)[0]
    http = serve.split("\n### HTTP\n", 1)[1].split("\n### ", 1)[0]  # the flags by topic
    assert "| `--http-port N` | `8080` | HTTP port" in http
    fields = config.reference()
    assert "| `max_queue_delay_microseconds` | uint64 |" in fields
    routes = endpoints.reference()
    assert "| POST | `/v2/repository/models/{model}/load` | admin |" in routes
    assert "| `inference.GRPCInferenceService` | `ModelInfer` | inference |" in routes


def test_the_readme_is_short_and_its_links_exist() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= README_MAX_LINES
    assert text.startswith("# inferd\n\n```bash\n./scripts/serve-demo")
    assert "./scripts/test" in text.split("\n```\n", 1)[0]
    assert "http://localhost:8080/dashboard/" in text
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text)
    local = [link for link in links if "://" not in link]
    assert local and all((ROOT / link).exists() for link in local), local


def _nav_pages(items: list[object]) -> list[str]:
    pages: list[str] = []
    for item in items:
        if isinstance(item, str):
            pages.append(item)
        elif isinstance(item, dict):
            for value in item.values():
                pages += _nav_pages(value) if isinstance(value, list) else [str(value)]
    return pages


def test_every_page_is_in_the_navigation() -> None:
    site = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    nav = set(_nav_pages(site["nav"]))
    docs = ROOT / "docs"
    pages = {str(p.relative_to(docs)) for p in docs.rglob("*.md") if "hooks" not in p.parts}
    assert pages - nav == set()
    generated = {"reference/cli.md", "reference/config.md", "reference/endpoints.md"}
    assert nav - pages == generated
    assert len(nav) >= 15


def test_no_file_speaks_of_work_sessions() -> None:
    found = subprocess.run(
        ["git", "grep", "-nE", "stop [0-9]+|[Ii]ssue [0-9]+"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert found.returncode == 1, found.stdout  # 1: nothing found


def test_the_docs_extra_builds_the_site(tmp_path: Path) -> None:
    """`pip install -e '.[docs]' && mkdocs serve`, as the README says: the site builds, strict,
    reference pages included, with only inferd and its docs extra importable."""
    hidden = missing_modules(("docs",))
    assert "tensorflow" in hidden or "httpx" in hidden  # the check hides the dev set
    assert "mkdocs" not in hidden and "material" not in hidden and "pymdownx" not in hidden
    hide = hiding_folder(("docs",), tmp_path / "env")
    paths = (str(hide), str(ROOT / "src"), os.environ.get("PYTHONPATH", ""))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
    site = tmp_path / "site"
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(site)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert built.returncode == 0, built.stderr[-4000:]
    assert "inferd serve" in (site / "reference" / "cli" / "index.html").read_text()


def test_every_install_command_works_from_the_checkout() -> None:
    """No package index has inferd: the docs install from the checkout (`pip install -e
    '.[EXTRA]'`), the messages by ``inferd.install.install_hint``; every extra named exists."""
    from_index = subprocess.run(
        [
            "git",
            "grep",
            "-nE",
            r"pip install +(-[-a-zA-Z]+ +)*[\"']?inferd\b",
            "--",
            "docs",
            "README.md",
            "src",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert from_index.returncode == 1, from_index.stdout  # 1: nothing found
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    texts = [(ROOT / "README.md").read_text()]
    texts += [p.read_text() for p in (ROOT / "docs").rglob("*.md")]
    named = {
        e
        for text in texts
        for m in re.findall(r"pip install -e '\.\[([\w,]+)\]'", text)
        for e in m.split(",")
    }
    assert named and named <= set(extras), named - set(extras)


def test_getting_started_reaches_every_protocol_of_the_readme() -> None:
    """Each protocol the README shows an example of, Getting started runs an example of too,
    in the demo's environment."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## One example per protocol", 1)[1].split("\n## ", 1)[0]
    shown = {h.split(",")[0] for h in re.findall(r"^\*\*([^*]+)\*\*", section, re.M)}
    what_runs = {
        "KServe v2 HTTP": "/v2/models/half_plus_two/infer",
        "KServe v2 gRPC": "tritonclient.grpc",
        "TF Serving REST": ":predict",
        "TF Serving gRPC": "PredictionServiceStub",
    }
    assert shown - {"Shared memory"} == set(what_runs)
    runs = [b for b in blocks(ROOT / "docs" / "getting-started.md") if b.kind == "run"]
    for protocol, text in what_runs.items():
        found = [b for b in runs if text in b.body]
        assert found, f"Getting started runs no {protocol} example"
        assert all(b.lang == "bash" or b.options.get("env") == "demo" for b in found), protocol
