"""The dashboard as ./scripts/serve-demo serves it (its own flags, read from the script, and the
demo models), in headless Chromium at a desktop's and a phone's width: every panel works (the
admin API is open on loopback), the header names the server once, the tabs keep one row, an
error in Try it replaces the previous answer, and the access log shows the server's traffic
without the page's own polling, a 304 not red.

Screenshots are saved under $INFERD_TEST_ARTIFACTS (else a pytest temp folder) and printed.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from inferd.app import edge
from inferd.app.settings import Settings
from inferd.version import __version__
from tests.e2e.dashboard_support import (
    CHROMIUM,
    WAIT_MS,
    chromium_browser,
    shot,
    shots_folder,
    tab,
)
from tests.support import ServerProcess

ROOT = Path(__file__).resolve().parents[2]
HPT = "half_plus_two"
DIGITS = "digits"
WIDTHS = {"desktop": (1280, 900), "phone": (390, 844)}
HTTP = httpx.Client(timeout=30)

sync_api = pytest.importorskip("playwright.sync_api")
if not Path(CHROMIUM).exists():
    pytest.skip("Debian's chromium is missing (apt-get install chromium)", allow_module_level=True)


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return shots_folder(tmp_path_factory.mktemp("dashboard-shots"))


def demo_args() -> list[str]:
    """The flags ./scripts/serve-demo gives `inferd serve` (its DEMO_ARGS)."""
    found = re.search(r"^DEMO_ARGS=\((.*)\)$", (ROOT / "scripts" / "serve-demo").read_text(), re.M)
    assert found, "scripts/serve-demo has no DEMO_ARGS=(...) line"
    return shlex.split(found.group(1))


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    from inferd.demo.models import write_demo_repository

    root = tmp_path_factory.mktemp("demo") / "demo-models"
    write_demo_repository(root, models=(HPT, DIGITS))
    # The default layout: a model host and frontends.
    proc = ServerProcess(root, extra_args=[*demo_args(), "--http-workers", "3"])
    proc.start()
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def logged(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """The demo's flags and the access log, in the default layout: the Logs panel tails the
    server's log, whichever serving process answers it."""
    from inferd.demo.models import write_demo_repository

    root = tmp_path_factory.mktemp("logged") / "demo-models"
    write_demo_repository(root, models=(HPT,))
    args = [*demo_args(), "--access-log"]
    proc = ServerProcess(root, extra_args=args)
    proc.start()
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    yield from chromium_browser()


def open_page(browser: Any, url: str, width: str) -> tuple[Any, Any, list[str]]:
    w, h = WIDTHS[width]
    context = browser.new_context(viewport={"width": w, "height": h}, color_scheme="light")
    page = context.new_page()
    page.set_default_timeout(WAIT_MS)
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(f"{url}/dashboard/")
    page.locator(f"tr[data-model={HPT}] .badge.ready").first.wait_for()
    return context, page, errors


def test_the_demo_opens_the_admin_api_on_loopback_only(demo: ServerProcess) -> None:
    server = HTTP.get(f"{demo.http_url}/v2/dashboard/models").json()["server"]
    assert server["admin"] == "open" and server["control_mode"] == "explicit"
    models = HTTP.get(f"{demo.http_url}/v2/dashboard/models").json()["models"]
    assert sorted(m["name"] for m in models) == [DIGITS, HPT]
    # The same flags on a non-loopback address, or a server started by hand: admin API off.
    settings = Settings(model_control_mode="explicit", load_model=["*"])
    tokens = edge.token_store(settings)
    assert not edge.access_policy(settings, tokens, "127.0.0.1").admin_off()
    assert edge.access_policy(settings, tokens, "0.0.0.0").admin_off()
    assert edge.access_policy(Settings(), tokens, "127.0.0.1").admin_off()


@pytest.mark.parametrize("width", list(WIDTHS))
def test_every_panel_works_in_the_demo(
    browser: Any, demo: ServerProcess, shots: Path, width: str
) -> None:
    context, page, errors = open_page(browser, demo.http_url, width)
    try:
        assert page.inner_text(".brand .name") == "inferd"
        name = page.inner_text("#server-name")
        assert name.startswith(f"{__version__} · node "), name
        assert "inferd" not in name
        # Every tab on one row, inside the screen.
        boxes = [t.bounding_box() for t in page.locator("[role=tab]").all()]
        assert len(boxes) == 7
        assert {round(b["y"]) for b in boxes} == {round(boxes[0]["y"])}, boxes
        assert max(b["x"] + b["width"] for b in boxes) <= WIDTHS[width][0], boxes
        shot(page, shots, f"20-demo-{width}-models")
        nowhere = "needs the server's admin API"
        tab(page, "logs")
        page.click("#panel-logs button:text-is('Engine log')")
        # The lines of the worker that answers: each has the demo's models.
        page.wait_for_function(
            "() => document.querySelector('.log').textContent.includes(\"model 'digits'\")"
        )
        shot(page, shots, f"21-demo-{width}-logs")
        tab(page, "files")
        page.select_option("#files-model", DIGITS)
        page.locator("table.files td.mono:text-is('sample.json')").wait_for()
        assert page.locator("table.files td.mono:text-is('1/model.onnx')").count() == 1
        shot(page, shots, f"22-demo-{width}-files")
        tab(page, "try")
        page.select_option("#try-model", DIGITS)
        page.locator("#try-sample:not([disabled])").wait_for()
        page.locator("#panel-try .msg:has-text('Filled from sample.json')").wait_for()
        page.click("#try-send")
        page.locator("tr[data-output=label] td.values").wait_for()
        shot(page, shots, f"23-demo-{width}-try-it")
        tab(page, "deploy")
        page.locator("#deploy-drop").wait_for()
        page.select_option("#manage-model", HPT)
        assert page.locator("#manage-unload").is_enabled()
        shot(page, shots, f"24-demo-{width}-deploy")
        for panel in ("logs", "files", "try", "deploy"):
            assert nowhere not in page.inner_text(f"#panel-{panel}"), panel
        assert page.locator("#banner").is_hidden()
        width_px = page.evaluate("document.documentElement.scrollWidth")
        assert width_px <= WIDTHS[width][0], width_px
    finally:
        context.close()
    assert errors == [], errors


def test_an_error_in_try_it_clears_the_previous_answer(
    browser: Any, demo: ServerProcess, shots: Path
) -> None:
    context, page, errors = open_page(browser, demo.http_url, "desktop")
    try:
        tab(page, "try")
        page.select_option("#try-model", HPT)
        page.locator("fieldset[data-input=x] textarea").wait_for()
        page.fill("fieldset[data-input=x] input[type=text]", "1, 1")
        page.fill("fieldset[data-input=x] textarea", "[1.0]")
        page.click("#try-send")
        page.wait_for_function(
            "() => document.querySelector('tr[data-output=y] td.values')?.textContent === '[2.5]'"
        )
        page.fill("fieldset[data-input=x] textarea", "[1.0, 2.0]")  # two values for shape [1, 1]
        page.click("#try-send")
        page.locator("#panel-try .msg.error:has-text('needs 1 values')").wait_for()
        assert page.locator("tr[data-output=y]").count() == 0
        assert page.inner_text("#panel-try .result") == ""
        shot(page, shots, "25-demo-try-it-error")
        page.fill("fieldset[data-input=x] textarea", "[3.0]")
        page.click("#try-send")
        page.wait_for_function(
            "() => document.querySelector('tr[data-output=y] td.values')?.textContent === '[3.5]'"
        )
        assert page.locator("#panel-try .msg.error").count() == 0
    finally:
        context.close()
    assert errors == [], errors


def test_the_access_log_shows_traffic_not_the_page_polling(
    browser: Any, logged: ServerProcess, shots: Path
) -> None:
    demo = logged
    context, page, errors = open_page(browser, demo.http_url, "desktop")
    try:
        tab(page, "logs")
        asset = HTTP.get(f"{demo.http_url}/dashboard/app.js")
        again = HTTP.get(
            f"{demo.http_url}/dashboard/app.js", headers={"if-none-match": asset.headers["etag"]}
        )
        assert again.status_code == 304
        assert HTTP.get(f"{demo.http_url}/v2/models/no_such_model").status_code == 404
        # The page has polled the logs (lines of its own reached the access log meanwhile):
        # wait for both lines above, then for a line of the page's own polling to be kept.
        page.locator(".log .line:has-text('GET /v2/models/no_such_model')").wait_for()
        page.wait_for_function(
            "() => document.querySelector('#panel-logs .muted[aria-live]')"
            ".textContent.match(/^(\\d+) of (\\d+)/).slice(1).map(Number)"
            ".reduce((shown, all) => all > shown + 1)"
        )
        lines = page.locator(".log .line").all_inner_texts()
        assert not [ln for ln in lines if "/v2/logs" in ln or "/v2/dashboard/" in ln], lines
        not_modified = page.locator(".log .line:has-text('GET /dashboard/app.js') .status")
        codes = not_modified.all_inner_texts()
        assert "304" in codes, codes
        for status in not_modified.all():
            if status.inner_text() == "304":
                assert "bad" not in (status.get_attribute("class") or "")
                color = status.evaluate("(e) => getComputedStyle(e).color")
                assert color != page.evaluate(
                    "getComputedStyle(document.documentElement).getPropertyValue('--bad')"
                )
        missing = page.locator(".log .line:has-text('no_such_model') .status").first
        assert missing.inner_text() == "404" and "warn" in (missing.get_attribute("class") or "")
        shot(page, shots, "26-demo-access-log")
        page.check("#logs-polling")  # asked for, the page's own requests show
        page.locator(".log .line:has-text('GET /v2/logs')").first.wait_for()
    finally:
        context.close()
    assert errors == [], errors
