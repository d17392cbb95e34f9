"""``inferd repo``: push a model folder to a running server, load, unload, list.

``push`` packs the folder as .tar.gz in memory and PUTs it to
``/v2/repository/models/NAME``; the server writes it into its repository atomically and loads
it. The other commands call Triton's repository API. Only the standard library is used.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import tarfile
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

DEFAULT_URL = "http://localhost:8080"
TIMEOUT_S = 600.0  # a push waits for the model to load and warm up


def pack(folder: Path) -> bytes:
    """The folder's contents as .tar.gz (links followed, hidden entries skipped)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=1, dereference=True) as tar:
        for path in sorted(folder.rglob("*")):
            rel = path.relative_to(folder)
            if any(part.startswith(".") for part in rel.parts) or not path.is_file():
                continue
            tar.add(path, arcname=rel.as_posix(), recursive=False)
    return buffer.getvalue()


def _check_folder(folder: Path) -> str | None:
    if not folder.is_dir():
        return f"'{folder}' is not a folder"
    if not any(p.is_dir() and p.name.isdigit() and int(p.name) > 0 for p in folder.iterdir()):
        return f"'{folder}' has no version folder (expected {folder.name}/1/<model file>)"
    return None


def _call(
    method: str, url: str, body: bytes | None, content_type: str, token: str = ""
) -> tuple[int, Any]:
    request = urllib.request.Request(url, data=body, method=method)
    if body is not None:
        request.add_header("Content-Type", content_type)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read()
    try:
        return status, json.loads(raw) if raw else None
    except ValueError:
        return status, raw.decode("utf-8", errors="replace")


def _report(status: int, doc: Any, ok_message: str) -> int:
    if 200 <= status < 300:
        print(ok_message if doc is None else json.dumps(doc, indent=2))
        return 0
    reason = doc.get("error", doc) if isinstance(doc, dict) else doc
    print(f"inferd repo: HTTP {status}: {reason}", file=sys.stderr)
    return 1


def _push(args: argparse.Namespace) -> int:
    folder = Path(args.folder)
    problem = _check_folder(folder)
    if problem is not None:
        print(f"inferd repo push: {problem}", file=sys.stderr)
        return 2
    name = args.name or folder.resolve().name
    body = pack(folder)
    url = f"{args.url.rstrip('/')}/v2/repository/models/{name}"
    try:
        status, doc = _call("PUT", url, body, "application/gzip", args.token)
    except (urllib.error.URLError, OSError) as exc:
        print(f"inferd repo push: cannot reach {args.url}: {exc}", file=sys.stderr)
        return 2
    return _report(status, doc, f"pushed model '{name}'")


def _simple(args: argparse.Namespace) -> int:
    base = args.url.rstrip("/")
    path = {
        "index": "/v2/repository/index",
        "load": f"/v2/repository/models/{getattr(args, 'name', '')}/load",
        "unload": f"/v2/repository/models/{getattr(args, 'name', '')}/unload",
    }[args.repo_command]
    try:
        status, doc = _call("POST", base + path, b"{}", "application/json", args.token)
    except (urllib.error.URLError, OSError) as exc:
        print(f"inferd repo {args.repo_command}: cannot reach {args.url}: {exc}", file=sys.stderr)
        return 2
    return _report(status, doc, f"{args.repo_command}ed model '{getattr(args, 'name', '')}'")


def add_parser(commands: Any) -> None:
    """Add ``repo`` and its subcommands to the ``inferd`` command line."""
    repo = commands.add_parser("repo", help="push, load, unload or list models on a server")
    sub = repo.add_subparsers(dest="repo_command", required=True)
    push = sub.add_parser("push", help="upload a model folder (packed as .tar.gz) and load it")
    push.add_argument("folder", help="the model folder: config.pbtxt (optional), 1/model...")
    push.add_argument("--name", help="model name on the server (default: the folder's name)")
    push.set_defaults(func=_push)
    for command, text in (
        ("load", "load (or reload) a model of the server's repository"),
        ("unload", "unload a model"),
    ):
        one = sub.add_parser(command, help=text)
        one.add_argument("name", help="model name")
        one.set_defaults(func=_simple)
    index = sub.add_parser("index", help="list the repository's models and their states")
    index.set_defaults(func=_simple)
    for parser in sub.choices.values():
        parser.add_argument(
            "--url", default=DEFAULT_URL, help=f"server's HTTP address (default {DEFAULT_URL})"
        )
        parser.add_argument(
            "--token",
            default=os.environ.get("INFERD_ADMIN_TOKEN", ""),
            help="admin token sent as Authorization: Bearer (default: $INFERD_ADMIN_TOKEN)",
        )
