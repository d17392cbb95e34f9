"""The dashboard driven in headless Chromium (Playwright, Debian's chromium): a model goes
READY after a drag-and-drop upload, try-it answers half_plus_two with 2.5, the charts move
after traffic, a request's access-log line appears, an unload confirms and the model leaves.

Screenshots are saved under $INFERD_TEST_ARTIFACTS (else a pytest temp folder) and printed.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.dashboard_support import (
    CHROMIUM,
    ECHO_BYTES,
    HPT,
    WAIT_MS,
    chromium_browser,
    envoy_clusters,
    fake_envoy_admin,
    model_archive,
    shot,
    shots_folder,
    tab,
    write_repository,
)
from tests.e2e.lifecycle_support import HALF_PLUS_THREE
from tests.support import ServerProcess, free_port

sync_api = pytest.importorskip("playwright.sync_api")
if not Path(CHROMIUM).exists():
    pytest.skip("Debian's chromium is missing (apt-get install chromium)", allow_module_level=True)

HTTP = httpx.Client(timeout=30)
X = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 1], "data": [1.0]}]}
# A 1x1 PNG: what the image picker sends as one BYTES element.
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
)


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return shots_folder(tmp_path_factory.mktemp("dashboard-shots"))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = write_repository(tmp_path_factory.mktemp("page") / "models")
    port = free_port()
    with fake_envoy_admin(envoy_clusters(port)) as admin:
        args = ["--model-control-mode", "explicit", "--load-model", "*", "--access-log"]
        proc = ServerProcess(root, extra_args=[*args, "--envoy-admin", admin], http_port=port)
        proc.start()
        yield proc
        proc.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    yield from chromium_browser()


@pytest.fixture(scope="module")
def page(browser: Any, server: ServerProcess) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1280, "height": 900}, color_scheme="light")
    found = context.new_page()
    errors: list[str] = []
    found.on("pageerror", lambda error: errors.append(str(error)))
    found.goto(f"{server.http_url}/dashboard/")
    found.set_default_timeout(WAIT_MS)
    yield found
    context.close()
    assert errors == [], errors


def test_models_panel_lists_every_model(page: Any, shots: Path) -> None:
    row = page.locator(f"tr[data-model={HPT}]")
    row.locator(".badge.ready").first.wait_for()
    assert "onnxruntime" in row.inner_text()
    assert "max 8" in row.inner_text() and "dynamic" in row.inner_text()
    assert page.locator(f"tr[data-model={ECHO_BYTES}]").count() == 1
    page.fill("#models-filter", "echo")
    page.wait_for_function(f"() => !document.querySelector('tr[data-model={HPT}]')")
    page.fill("#models-filter", "")
    row.wait_for()
    shot(page, shots, "01-models")


def test_tabs_follow_the_keyboard(page: Any) -> None:
    page.focus("[role=tab][data-panel=models]")
    page.keyboard.press("ArrowRight")
    page.wait_for_selector("#panel-traffic:not([hidden])")
    assert page.evaluate("document.activeElement.dataset.panel") == "traffic"
    page.keyboard.press("ArrowLeft")
    page.wait_for_selector("#panel-models:not([hidden])")


def test_try_it_answers_half_plus_two(page: Any, shots: Path) -> None:
    tab(page, "try")
    page.select_option("#try-model", HPT)
    data = page.locator("fieldset[data-input=x] textarea")
    data.wait_for()
    page.wait_for_function(
        "() => document.querySelector('fieldset[data-input=x] textarea').value !== ''"
    )
    page.fill("fieldset[data-input=x] input[type=text]", "1, 1")
    data.fill("[1.0]")
    page.click("#try-send")
    values = page.locator("tr[data-output=y] td.values")
    values.wait_for()
    assert values.inner_text() == "[2.5]"
    assert "round trip" in page.locator(".latency").inner_text()
    shot(page, shots, "02-try-it")


def test_try_it_fills_from_sample_json(page: Any) -> None:
    page.click("#try-sample")
    page.wait_for_function(
        "() => document.querySelector('fieldset[data-input=x] textarea').value === '[1,3]'"
    )
    assert page.input_value("fieldset[data-input=x] input[type=text]") == "2, 1"
    page.click("#try-send")
    page.wait_for_function(
        "() => document.querySelector('tr[data-output=y] td.values')?.textContent === '[2.5, 3.5]'"
    )


def test_try_it_sends_a_picked_image_as_bytes(page: Any, shots: Path) -> None:
    page.select_option("#try-model", ECHO_BYTES)
    picker = page.locator("fieldset[data-input=INPUT0] input[type=file]")
    picker.wait_for(state="attached")
    picker.set_input_files({"name": "dot.png", "mimeType": "image/png", "buffer": PNG})
    page.locator("fieldset[data-input=INPUT0] .preview img").wait_for()
    page.fill("fieldset[data-input=INPUT0] input[type=text]", "1")
    page.click("#try-send")
    values = page.locator("tr[data-output=OUTPUT0] td.values")
    values.wait_for()
    assert values.inner_text() == f'["<{len(PNG)} bytes>"]'
    shot(page, shots, "03-try-it-image")


def test_charts_move_after_traffic(page: Any, server: ServerProcess, shots: Path) -> None:
    tab(page, "traffic")
    page.select_option("#traffic-target", HPT)
    path = page.locator(".chart .line.s1").first
    before = path.get_attribute("d")
    for _ in range(60):
        HTTP.post(f"{server.http_url}/v2/models/{HPT}/infer", json=X)
    # The burst lifts the requests/s line: the chart's y axis (its top label) grows to hold it.
    page.wait_for_function(
        """() => {
            const chart = document.querySelector('#panel-traffic .chart');
            const labels = chart.querySelectorAll('.grid text');
            return Number(labels[2].textContent.replace(/,/g, '')) >= 10;
        }"""
    )
    assert path.get_attribute("d") != before
    bars = page.locator(".chart rect.bar")
    bars.first.wait_for()
    assert "batch size 1" in bars.first.inner_html()
    shot(page, shots, "04-traffic")


def test_a_request_shows_in_the_access_log(page: Any, server: ServerProcess, shots: Path) -> None:
    tab(page, "logs")
    request_id = "page-request-42"
    r = HTTP.post(
        f"{server.http_url}/v2/models/{HPT}/infer", json=X, headers={"x-request-id": request_id}
    )
    assert r.status_code == 200
    button = page.locator(f".log button:text-is('{request_id}')")
    button.wait_for()
    button.click()
    assert page.input_value("#logs-text") == request_id
    page.wait_for_function("() => document.querySelectorAll('.log .line').length === 1")
    line = page.locator(".log .line").inner_text()
    assert f"POST /v2/models/{HPT}/infer" in line and "200" in line
    shot(page, shots, "05-logs")
    page.fill("#logs-text", "")
    page.click("#panel-logs button:text-is('Engine log')")
    page.wait_for_function("() => document.querySelector('.log').textContent.includes('listening')")


def test_model_files_are_browsed(page: Any, shots: Path) -> None:
    tab(page, "files")
    page.select_option("#files-model", HPT)
    page.locator("table.files td.mono:text-is('sample.json')").wait_for()
    assert page.locator("table.files td.mono:text-is('1/model.onnx')").count() == 1
    config = page.locator("pre.code").first.inner_text()
    assert 'name: "half_plus_two"' in config and "max_queue_delay_microseconds: 100" in config
    shot(page, shots, "06-files")


def test_a_dropped_archive_goes_ready(page: Any, server: ServerProcess, shots: Path) -> None:
    tab(page, "deploy")
    archive = base64.b64encode(model_archive()).decode()
    transfer = page.evaluate_handle(
        """(data) => {
            const bytes = Uint8Array.from(atob(data), (c) => c.charCodeAt(0));
            const transfer = new DataTransfer();
            const file = new File([bytes], 'half_plus_three.tar.gz', {type: 'application/gzip'});
            transfer.items.add(file);
            return transfer;
        }""",
        archive,
    )
    page.dispatch_event("#deploy-drop", "drop", {"dataTransfer": transfer})
    assert page.input_value("#deploy-name") == "half_plus_three"
    page.click("#deploy-go")
    result = page.locator("#deploy-result")
    result.wait_for()
    assert "half_plus_three is READY" in result.inner_text()
    shot(page, shots, "07-deploy")
    answer = HTTP.post(f"{server.http_url}/v2/models/half_plus_three/infer", json=X).json()
    assert answer["outputs"][0]["data"] == [3.5]


def test_a_picked_folder_goes_ready(page: Any, server: ServerProcess, tmp_path: Path) -> None:
    folder = tmp_path / "folder_model"
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "model.onnx").write_bytes(HALF_PLUS_THREE)
    page.set_input_files("#deploy-folder", str(folder))
    assert page.input_value("#deploy-name") == "folder_model"
    page.click("#deploy-go")
    page.locator("#deploy-result:text('folder_model is READY')").wait_for()
    answer = HTTP.post(f"{server.http_url}/v2/models/folder_model/infer", json=X).json()
    assert answer["outputs"][0]["data"] == [3.5]


def test_an_unload_confirms_and_the_model_leaves(
    page: Any, server: ServerProcess, shots: Path
) -> None:
    page.select_option("#manage-model", "half_plus_three")
    page.click("#manage-unload")
    dialog = page.locator("dialog.confirm")
    dialog.wait_for()
    shot(page, shots, "08-unload-confirm")
    dialog.locator("button:text-is('Cancel')").click()
    assert HTTP.get(f"{server.http_url}/v2/models/half_plus_three/ready").status_code == 200
    page.click("#manage-unload")
    dialog.locator("button:text-is('Unload')").click()
    page.locator("#manage .msg.ok").wait_for()
    assert HTTP.get(f"{server.http_url}/v2/models/half_plus_three/ready").status_code == 400
    tab(page, "try")
    page.wait_for_function(
        "() => ![...document.querySelectorAll('#try-model option')]"
        ".some((o) => o.value === 'half_plus_three')"
    )
    tab(page, "models")
    page.select_option("#models-state", "READY")
    page.wait_for_function("() => !document.querySelector('tr[data-model=half_plus_three]')")
    page.select_option("#models-state", "")


def test_a_refused_write_is_shown(page: Any, shots: Path) -> None:
    tab(page, "deploy")
    page.select_option("#manage-model", HPT)
    page.click("#manage button:text-is('Add a target')")
    pair = page.locator("#manage .pairs .pair").first
    pair.locator("input").nth(0).fill("1")
    pair.locator("input").nth(1).fill("-1")
    page.click("#manage-routing")
    page.locator("dialog.confirm button:text-is('Apply')").click()
    error = page.locator("#manage .msg.error")
    error.wait_for()
    assert "400 Bad Request" in error.inner_text()
    assert "traffic_split: weight of '1' must be a number >= 0" in error.inner_text()
    shot(page, shots, "09-refused")


def test_a_token_is_sent_and_a_403_is_shown(page: Any) -> None:
    # The server's auth comes from another change; here the browser answers for it, to check
    # the page sends the pasted token and shows the refusal in its banner.
    seen: list[str] = []

    def refuse(route: Any) -> None:
        seen.append(route.request.headers.get("authorization", ""))
        route.fulfill(
            status=403,
            content_type="application/json",
            body='{"error": "this token has no admin scope"}',
        )

    page.route("**/v2/repository/models/*/unload", refuse)
    page.click("#token-button")
    page.fill("dialog input[type=password]", "secret-token")
    page.click("dialog button:text-is('Use token')")
    page.click("#manage-unload")
    page.locator("dialog.confirm button:text-is('Unload')").click()
    banner = page.locator("#banner")
    banner.wait_for()
    assert "403 Forbidden" in banner.inner_text()
    assert "this token has no admin scope" in banner.inner_text()
    assert seen == ["Bearer secret-token"]
    page.unroute("**/v2/repository/models/*/unload")
    page.click("#banner button")
    page.click("#token-button")
    page.click("dialog button:text-is('Forget token')")
    assert page.evaluate("sessionStorage.getItem('inferd.token')") is None


def test_cluster_panel_shows_envoys_nodes(page: Any, shots: Path) -> None:
    tab(page, "cluster")
    page.locator("table.hosts tbody tr").nth(1).wait_for()
    rows = page.locator("table.hosts tbody tr")
    assert "healthy" in rows.nth(0).inner_text()
    assert "unhealthy" in rows.nth(1).inner_text()
    assert "failed_active_health_check" in rows.nth(1).inner_text()
    shot(page, shots, "10-cluster")


@pytest.fixture(scope="module")
def default_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """As a server started by hand with the defaults: no token, --model-control-mode none, so
    the admin API is off (./scripts/serve-demo opens it: test_dashboard_demo.py)."""
    proc = ServerProcess(write_repository(tmp_path_factory.mktemp("default") / "models"))
    proc.start()
    yield proc
    proc.stop()


def test_the_default_server_greets_without_refusals(
    browser: Any, default_server: ServerProcess, shots: Path
) -> None:
    """Panels that need the admin API say calmly what is off and the flag that turns it on;
    the page asks for nothing it would be refused, and everything else works as usual."""
    context = browser.new_context(viewport={"width": 1280, "height": 900}, color_scheme="light")
    page = context.new_page()
    page.set_default_timeout(WAIT_MS)
    refused: list[str] = []
    console: list[str] = []

    def on_response(response: Any) -> None:
        if response.status >= 400:
            refused.append(f"{response.status} {response.url}")

    def on_console(message: Any) -> None:
        if message.type in ("error", "warning"):
            console.append(message.text)

    page.on("response", on_response)
    page.on("console", on_console)
    page.on("pageerror", lambda error: console.append(str(error)))
    try:
        page.goto(f"{default_server.http_url}/dashboard/")
        page.locator(f"tr[data-model={HPT}] .badge.ready").first.wait_for()
        flag = "--admin-token TOKEN"
        for name, note in (("logs", "#panel-logs .msg"), ("files", "#panel-files .msg")):
            tab(page, name)
            page.locator(f"{note}:has-text('{flag}')").wait_for()
            assert page.locator(f"{note}.error").count() == 0
        shot(page, shots, "12-default-files")
        tab(page, "try")
        page.select_option("#try-model", HPT)
        page.locator("#try-sample-why").wait_for()
        assert page.locator("#try-sample").is_disabled()
        why = page.inner_text("#try-sample-why")
        assert "sample.json" in why and "admin API, which is off" in why and flag in why
        page.fill("fieldset[data-input=x] input[type=text]", "1, 1")
        page.fill("fieldset[data-input=x] textarea", "[1.0]")
        page.click("#try-send")  # inference itself is not disturbed
        page.wait_for_function(
            "() => document.querySelector('tr[data-output=y] td.values')?.textContent === '[2.5]'"
        )
        shot(page, shots, "13-default-try-it")
        tab(page, "deploy")
        page.locator(f"#deploy-admin-note .msg:has-text('{flag}')").wait_for()
        assert page.locator("#manage-unload").is_disabled()
        tab(page, "cluster")
        page.locator("#panel-cluster .msg:has-text('--envoy-admin')").wait_for()
        page.wait_for_timeout(1500)  # a few refresh ticks of the visible panel
        assert page.locator("#banner").is_hidden()
        assert refused == [] and console == [], (refused, console)
    finally:
        context.close()
    assert "dashboard: http://127.0.0.1:" in default_server.log()


def test_dark_theme_on_a_phone(browser: Any, server: ServerProcess, shots: Path) -> None:
    context = browser.new_context(
        viewport={"width": 390, "height": 844}, color_scheme="dark", device_scale_factor=2
    )
    phone = context.new_page()
    phone.set_default_timeout(WAIT_MS)
    try:
        for name in ("models", "traffic", "deploy"):
            phone.goto(f"{server.http_url}/dashboard/#{name}")
            phone.wait_for_selector(f"#panel-{name}:not([hidden]) h1")
            phone.wait_for_timeout(1200)
            width = phone.evaluate("document.documentElement.scrollWidth")
            assert width <= 390, f"{name} overflows the phone's width: {width}px"
            shot(phone, shots, f"11-phone-dark-{name}")
        background = phone.evaluate("getComputedStyle(document.body).backgroundColor")
        assert background == "rgb(15, 20, 26)"
    finally:
        context.close()
