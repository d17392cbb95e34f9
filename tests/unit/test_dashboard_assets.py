"""The dashboard's files as the package ships them."""

from __future__ import annotations

import re

from inferd.dashboard.assets import load_assets


def test_every_file_the_page_imports_is_shipped() -> None:
    assets = load_assets()
    assert assets["index.html"].content_type == "text/html; charset=utf-8"
    imports: set[str] = set()
    for name, asset in assets.items():
        if not name.endswith(".js"):
            continue
        folder = name.rsplit("/", 1)[0] + "/" if "/" in name else ""
        for target in re.findall(r"from '(\.[^']+)'", asset.body.decode()):
            parts = (folder + target).split("/")
            resolved: list[str] = []
            for part in parts:
                if part == "..":
                    resolved.pop()
                elif part != ".":
                    resolved.append(part)
            imports.add("/".join(resolved))
    assert imports and imports <= set(assets), imports - set(assets)
    assert len({a.etag for a in assets.values()}) == len(assets)
