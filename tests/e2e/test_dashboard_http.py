"""The dashboard over HTTP: the page's files, the redirect, its port, and the JSON it reads
(/v2/dashboard/models, /series, /cluster, a model's files, /v2/logs?after=N)."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from inferd.dashboard.assets import load_assets
from tests.e2e.dashboard_support import (
    ECHO_BYTES,
    HPT,
    HPT_CONFIG,
    SAMPLE,
    envoy_clusters,
    fake_envoy_admin,
    write_repository,
)
from tests.support import ServerProcess, free_port, wait_for

HTTP = httpx.Client(timeout=30)
X = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 1], "data": [1.0]}]}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = write_repository(tmp_path_factory.mktemp("dash") / "models")
    port = free_port()
    with fake_envoy_admin(envoy_clusters(port)) as admin:
        args = ["--model-control-mode", "explicit", "--load-model", "*", "--access-log"]
        proc = ServerProcess(root, extra_args=[*args, "--envoy-admin", admin], http_port=port)
        proc.start()
        yield proc
        proc.stop()


BROWSER = {"accept": "text/html,application/xhtml+xml,*/*;q=0.8"}


def test_root_redirects_to_the_page(server: ServerProcess) -> None:
    r = HTTP.get(f"{server.http_url}/", headers=BROWSER)
    assert r.status_code == 302
    assert r.headers["location"] == "/dashboard/"
    # an API client gets KServe v1's liveness there instead
    assert HTTP.get(f"{server.http_url}/").json() == {"status": "alive"}
    r = HTTP.get(f"{server.http_url}/dashboard", follow_redirects=True)
    assert r.status_code == 200
    assert "<title>inferd dashboard</title>" in r.text


def test_page_files_carry_types_etags_and_a_strict_policy(server: ServerProcess) -> None:
    page = HTTP.get(f"{server.http_url}/dashboard/")
    assert page.headers["content-type"] == "text/html; charset=utf-8"
    policy = page.headers["content-security-policy"]
    assert "default-src 'self'" in policy and "connect-src 'self'" in policy
    script = HTTP.get(f"{server.http_url}/dashboard/app.js")
    assert script.status_code == 200
    assert script.headers["content-type"] == "text/javascript; charset=utf-8"
    again = HTTP.get(
        f"{server.http_url}/dashboard/app.js", headers={"if-none-match": script.headers["etag"]}
    )
    assert again.status_code == 304 and again.content == b""
    missing = HTTP.get(f"{server.http_url}/dashboard/nothing.js")
    assert missing.status_code == 404
    assert missing.json() == {"error": "the dashboard has no file 'nothing.js'"}


def test_the_page_loads_nothing_from_elsewhere_and_weighs_under_300_kb(
    server: ServerProcess,
) -> None:
    assets = load_assets()
    total = 0
    for name, asset in assets.items():
        text = asset.body.decode()
        assert "http://" not in text.replace("http://www.w3.org/2000/svg", "")
        assert "https://" not in text
        r = HTTP.get(f"{server.http_url}/dashboard/{name}", headers={"accept-encoding": "gzip"})
        assert r.status_code == 200
        total += r.num_bytes_downloaded
    assert {"index.html", "app.js", "charts.js", "panels/deploy.js"} <= set(assets)
    print(f"dashboard page weight: {total} bytes gzipped, {len(assets)} files")
    assert total < 300_000


def test_models_document(server: ServerProcess) -> None:
    doc = HTTP.get(f"{server.http_url}/v2/dashboard/models").json()
    assert doc["server"]["control_mode"] == "explicit"
    assert doc["server"]["access_log"] is True and doc["server"]["envoy_admin"] is True
    assert doc["server"]["writable"] is True
    # Explicit mode on loopback: the admin API answers without a token.
    assert doc["server"]["admin"] == "open" and doc["server"]["admin_hint"] == ""
    assert f"dashboard: http://127.0.0.1:{server.http_port}/dashboard/" in server.log()
    models = {m["name"]: m for m in doc["models"]}
    assert set(models) == {HPT, ECHO_BYTES}
    hpt = models[HPT]
    assert hpt["state"] == "READY" and hpt["backend"] == "onnxruntime"
    assert hpt["batching"] == {
        "max_batch_size": 8,
        "dynamic": {"preferred_batch_size": [], "max_queue_delay_us": 100},
    }
    (version,) = hpt["versions"]
    assert version["version"] == "1" and version["state"] == "READY"
    assert version["instances"] == 1 and version["load_s"] > 0
    assert hpt["routing"]["labels"] == {} and hpt["in_repository"] is True
    assert models[ECHO_BYTES]["backend"] == "echo"


def test_series_follow_traffic(server: ServerProcess) -> None:
    for _ in range(20):
        assert HTTP.post(f"{server.http_url}/v2/models/{HPT}/infer", json=X).status_code == 200

    def busy() -> dict[str, Any] | None:
        doc = HTTP.get(f"{server.http_url}/v2/dashboard/series").json()
        model = doc["models"].get(HPT)
        if not model or int(model["batch_sizes"].get("1", 0)) < 20:
            return None
        # With several workers a second's row comes once every worker has sampled it.
        rate = doc["fields"].index("requests_per_s")
        return doc if sum(r[rate] for r in model["rows"]) >= 1 else None

    doc = wait_for(busy, "the 20 requests in half_plus_two's traffic rows")
    fields = doc["fields"]
    rate, batch = fields.index("requests_per_s"), fields.index("batch_size")
    rows = doc["models"][HPT]["rows"]
    assert all(len(r) == len(fields) for r in rows)
    assert {r[batch] for r in rows if r[rate]} >= {1.0}
    assert doc["window_s"] == 900.0 and doc["interval_s"] == 1.0
    newest = doc["server"]["rows"][-1][0]
    later = HTTP.get(f"{server.http_url}/v2/dashboard/series", params={"after": newest}).json()
    assert all(r[0] > newest for r in later["server"]["rows"])
    only = HTTP.get(f"{server.http_url}/v2/dashboard/series", params={"model": ECHO_BYTES}).json()
    assert set(only["models"]) <= {ECHO_BYTES}
    bad = HTTP.get(f"{server.http_url}/v2/dashboard/series", params={"after": "soon"})
    assert bad.status_code == 400
    assert bad.json() == {"error": "after must be a number of seconds, got 'soon'"}
    for text in ("", "nan", "inf"):  # not numbers to the API description either
        bad = HTTP.get(f"{server.http_url}/v2/dashboard/series", params={"after": text})
        assert bad.status_code == 400
        assert bad.json() == {"error": f"after must be a number of seconds, got '{text}'"}


def test_model_files_listing_and_download(server: ServerProcess) -> None:
    doc = HTTP.get(f"{server.http_url}/v2/repository/models/{HPT}/files").json()
    assert doc["local"] is True and doc["has_sample"] is True
    assert doc["config_pbtxt"] == HPT_CONFIG
    paths = {f["path"]: f for f in doc["files"]}
    assert set(paths) == {"1/model.onnx", "config.pbtxt", "sample.json"}
    assert paths["1/model.onnx"]["version"] == 1 and paths["config.pbtxt"]["version"] is None
    assert doc["versions"] == [{"version": 1, "files": 1, "bytes": paths["1/model.onnx"]["bytes"]}]
    assert doc["total_bytes"] == sum(f["bytes"] for f in doc["files"])
    config = HTTP.get(f"{server.http_url}/v2/repository/models/{HPT}/files/config.pbtxt")
    assert config.status_code == 200 and config.text == HPT_CONFIG
    assert config.headers["content-disposition"] == 'attachment; filename="config.pbtxt"'
    sample = HTTP.get(f"{server.http_url}/v2/repository/models/{HPT}/files/sample.json")
    assert json.loads(sample.content) == SAMPLE
    echo = HTTP.get(f"{server.http_url}/v2/repository/models/{ECHO_BYTES}/files").json()
    assert echo["has_sample"] is False and echo["files"][0]["path"] == "config.pbtxt"


def test_model_files_refuse_what_is_not_listed(server: ServerProcess) -> None:
    base = f"{server.http_url}/v2/repository/models"
    r = HTTP.get(f"{base}/{HPT}/files/1/nothing.onnx")
    assert r.status_code == 404
    assert r.json() == {"error": "model 'half_plus_two' has no file '1/nothing.onnx'"}
    r = HTTP.get(f"{base}/{HPT}/files/1/..%2F..%2Fetc%2Fpasswd")
    assert r.status_code in (400, 404)
    r = HTTP.get(f"{base}/{HPT}/files/../config.pbtxt")
    assert r.status_code in (400, 404)
    r = HTTP.get(f"{base}/nobody/files")
    assert r.status_code == 404
    assert "unknown model 'nobody'" in r.json()["error"]


def test_logs_after_a_sequence_number(server: ServerProcess) -> None:
    first = HTTP.get(f"{server.http_url}/v2/logs", params={"kind": "access", "after": 0}).json()
    start = first["next"]
    assert start >= 1
    headers = {"x-request-id": "dash-log-1"}
    HTTP.post(f"{server.http_url}/v2/models/{HPT}/infer", json=X, headers=headers)
    later = HTTP.get(f"{server.http_url}/v2/logs", params={"kind": "access", "after": start}).json()
    assert later["next"] >= start + 1
    assert any("request_id=dash-log-1" in line and "status=200" in line for line in later["lines"])
    assert not any(line in first["lines"] for line in later["lines"])
    bad = HTTP.get(f"{server.http_url}/v2/logs", params={"kind": "access", "after": "x"})
    assert bad.status_code == 400
    assert bad.json() == {"error": "after must be a non-negative integer, got 'x'"}
    for name, why in (("kind", "kind must be engine or access"), ("lines", "lines must be a ")):
        bad = HTTP.get(f"{server.http_url}/v2/logs", params={name: ""})  # blank: no default
        assert bad.status_code == 400 and bad.json()["error"].startswith(why)
    assert HTTP.get(f"{server.http_url}/v2/logs", params={"after": ""}).status_code == 400


def test_cluster_from_the_envoy_admin(server: ServerProcess) -> None:
    doc = HTTP.get(f"{server.http_url}/v2/dashboard/cluster").json()
    assert doc["enabled"] is True
    (cluster,) = doc["clusters"]
    assert cluster["name"] == "inferd"
    first, second = cluster["hosts"]
    assert first["address"] == f"127.0.0.1:{server.http_port}"
    assert first["healthy"] is True and first["rq_total"] == 120 and first["cx_active"] == 2
    assert first["rq_error"] == 1 and first["rq_active"] == 0
    assert second["healthy"] is False
    assert second["health"] == ["failed_active_health_check"]


def test_a_dashboard_port_of_its_own(tmp_path: Path) -> None:
    root = write_repository(tmp_path / "models")
    port = free_port()
    proc = ServerProcess(root, extra_args=["--dashboard-port", str(port)]).start()
    try:
        own = f"http://127.0.0.1:{port}"
        r = HTTP.get(f"{own}/", headers=BROWSER)
        assert r.status_code == 302 and r.headers["location"] == "/dashboard/"
        assert "inferd dashboard" in HTTP.get(f"{own}/dashboard/").text
        # The page's APIs answer on its port too, under the same rules as on the HTTP port.
        facts = HTTP.get(f"{own}/v2/dashboard/models").json()["server"]
        assert facts["control_mode"] == "none"
        # ... and the page, told so, says how to turn the admin API on instead of asking.
        assert facts["admin"] == "off" and "--admin-token TOKEN" in facts["admin_hint"]
        answer = HTTP.post(f"{own}/v2/models/{HPT}/infer", json=X).json()
        assert answer["outputs"][0]["data"] == [2.5]
        # The HTTP port no longer serves the page.
        # Whichever serving process answers (fresh connections reach each of them).
        pages = {
            httpx.get(f"{proc.http_url}/dashboard/", timeout=60).status_code for _ in range(12)
        }
        assert pages == {404}
        assert {httpx.get(f"{own}/dashboard/", timeout=60).status_code for _ in range(12)} == {200}
        # ... and answers GET / as KServe v1 does, browsers included.
        for headers in ({}, BROWSER):
            assert HTTP.get(f"{proc.http_url}/", headers=headers).json() == {"status": "alive"}
        cluster = HTTP.get(f"{proc.http_url}/v2/dashboard/cluster").json()
        assert cluster["enabled"] is False and "--envoy-admin" in cluster["hint"]
        # Mode none, no admin token: the admin API is off on the dashboard's port as well.
        refused = HTTP.post(f"{own}/v2/repository/models/{HPT}/unload")
        assert refused.status_code == 403 and "admin API is off" in refused.json()["error"]
    finally:
        proc.stop()
    assert f"listening: dashboard on http://127.0.0.1:{port}/dashboard/" in proc.log()


def test_the_dashboard_can_be_turned_off(tmp_path: Path) -> None:
    root = write_repository(tmp_path / "models")
    proc = ServerProcess(root, extra_args=["--allow-dashboard=false"]).start()
    try:
        for path in ("/dashboard/", "/v2/dashboard/models", "/v2/dashboard/series"):
            assert HTTP.get(f"{proc.http_url}{path}").status_code == 404, path
        # GET / stays KServe v1's liveness, for browsers too: there is no page to go to.
        for headers in ({}, BROWSER):
            assert HTTP.get(f"{proc.http_url}/", headers=headers).json() == {"status": "alive"}
        assert HTTP.get(f"{proc.http_url}/v2/health/ready").status_code == 200
    finally:
        proc.stop()


def test_gzip_is_used_for_the_page(server: ServerProcess) -> None:
    r = HTTP.get(f"{server.http_url}/dashboard/style.css", headers={"accept-encoding": "gzip"})
    assert r.headers["content-encoding"] == "gzip"
    assert r.num_bytes_downloaded < len(load_assets()["style.css"].body)
    assert gzip.compress(b"x")  # the stdlib codec the server uses
