"""Keeps the server's file system out of answers: absolute paths become ``…/<file name>``.

Applied to what clients see of internal errors, load and upload failures and index reasons,
where messages carry text from frameworks (which name the files they read); the engine log
keeps the full text.
"""

from __future__ import annotations

import re

# An absolute POSIX path of two or more parts that is not one of the API's own routes.
_PATH = re.compile(r"(?<![\w.:/-])/(?!v1/|v2/)(?:[\w.@+~-]+/)+([\w.@+~-]*)")


def redact(message: str) -> str:
    return _PATH.sub(lambda m: f"…/{m.group(1)}", message) if "/" in message else message
