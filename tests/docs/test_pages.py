"""The docs and the README hold together: the generated reference covers the code, the README
stays short and its links lead somewhere, every page is in the site's navigation, and no file
speaks of work sessions."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import yaml
from inferd_docs import cli, config, endpoints

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
