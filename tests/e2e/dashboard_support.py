"""Helpers for the dashboard tests: a small repository, model archives, a stand-in Envoy admin.

Envoy itself is not installed where these tests run, so a tiny HTTP server answers its admin
API's ``/clusters?format=json`` with a document of Envoy's own shape (as Envoy 1.3x prints it).
"""

from __future__ import annotations

import io
import json
import os
import shutil
import tarfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tests.e2e.lifecycle_support import HALF_PLUS_THREE, HALF_PLUS_TWO

CHROMIUM = os.environ.get("INFERD_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
LAUNCH_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
WAIT_MS = 60_000  # a bound for what the page waits for, never a timing


def shots_folder(fallback: Path) -> Path:
    """Where screenshots go: $INFERD_TEST_ARTIFACTS/dashboard, else ``fallback``."""
    folder = os.environ.get("INFERD_TEST_ARTIFACTS")
    path = Path(folder) / "dashboard" if folder else fallback
    path.mkdir(parents=True, exist_ok=True)
    return path


def shot(page: Any, folder: Path, name: str) -> None:
    path = folder / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    print(f"screenshot: {path}")


def tab(page: Any, name: str) -> None:
    page.click(f"[role=tab][data-panel={name}]")
    page.wait_for_selector(f"#panel-{name}:not([hidden])")


HPT = "half_plus_two"
ECHO_BYTES = "echo_bytes"
HPT_CONFIG = (
    'name: "half_plus_two"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
    "dynamic_batching { max_queue_delay_microseconds: 100 }\n"
)
ECHO_BYTES_CONFIG = (
    'name: "echo_bytes"\nbackend: "echo"\nmax_batch_size: 0\n'
    'input [{ name: "INPUT0" data_type: TYPE_STRING dims: [1] }]\n'
)
SAMPLE = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 1], "data": [1.0, 3.0]}]}


def write_repository(root: Path) -> Path:
    """half_plus_two (config.pbtxt, sample.json, version 1) and an echo model with BYTES."""
    model = root / HPT
    (model / "1").mkdir(parents=True)
    (model / "1" / "model.onnx").write_bytes(HALF_PLUS_TWO)
    (model / "config.pbtxt").write_text(HPT_CONFIG)
    (model / "sample.json").write_text(json.dumps(SAMPLE))
    echo = root / ECHO_BYTES
    (echo / "1").mkdir(parents=True)
    (echo / "config.pbtxt").write_text(ECHO_BYTES_CONFIG)
    return root


def model_archive(prefix: str = "") -> bytes:
    """A .tar.gz of a half_plus_three model folder (y = 0.5 x + 3)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        info = tarfile.TarInfo(f"{prefix}1/model.onnx")
        info.size = len(HALF_PLUS_THREE)
        tar.addfile(info, io.BytesIO(HALF_PLUS_THREE))
    return buffer.getvalue()


def envoy_clusters(inferd_port: int) -> dict[str, object]:
    """Two replicas behind Envoy, one failing its active health check."""

    def host(address: str, port: int, rq_total: int, failed: bool) -> dict[str, object]:
        health: dict[str, object] = {"eds_health_status": "HEALTHY"}
        if failed:
            health["failed_active_health_check"] = True
        return {
            "address": {"socket_address": {"address": address, "port_value": port}},
            "stats": [
                {"name": "cx_connect_fail"},
                {"value": "3", "name": "cx_total"},
                {"value": "1", "name": "rq_error"},
                {"value": str(rq_total - 1), "name": "rq_success"},
                {"name": "rq_timeout"},
                {"value": str(rq_total), "name": "rq_total"},
                {"type": "GAUGE", "value": "2", "name": "cx_active"},
                {"type": "GAUGE", "name": "rq_active"},
            ],
            "health_status": health,
            "weight": 1,
            "locality": {},
        }

    return {
        "cluster_statuses": [
            {
                "name": "inferd",
                "added_via_api": False,
                "host_statuses": [
                    host("127.0.0.1", inferd_port, 120, failed=False),
                    host("127.0.0.2", 8080, 7, failed=True),
                ],
            }
        ]
    }


@contextmanager
def fake_envoy_admin(document: dict[str, object]) -> Iterator[str]:
    """An HTTP server on a free loopback port answering ``/clusters?format=json``."""
    body = json.dumps(document).encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path != "/clusters?format=json":
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def chromium_browser() -> Iterator[Any]:
    """Debian's chromium, driven by Playwright, for one module's page tests (its fixture)."""
    from playwright import sync_api

    with sync_api.sync_playwright() as playwright:
        found = playwright.chromium.launch(executable_path=CHROMIUM, args=LAUNCH_ARGS)
        yield found
        found.close()
