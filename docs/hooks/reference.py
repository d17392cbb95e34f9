"""MkDocs hook: adds the generated reference pages (command line, config.pbtxt, endpoints)
to the site at build time, from the code itself (``inferd_docs``), so they cannot drift."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from inferd_docs import cli, endpoints
from inferd_docs import config as config_pages

PAGES = {
    "reference/cli.md": cli.reference,
    "reference/config.md": config_pages.reference,
    "reference/endpoints.md": endpoints.reference,
}


def on_files(files: Any, config: Any, **kwargs: Any) -> Any:
    from mkdocs.structure.files import File

    for path, generate in PAGES.items():
        files.append(File.generated(config, path, content=generate()))
    return files
