"""Completing a Python model's config from its code, in a short-lived process of its own.

The server never imports ``model.py`` itself. When a config needs the model's help (Triton's
``auto_complete_config``, or a native model's type hints), ``describe`` runs ``main`` in a new
process with the model's interpreter: it imports the file, completes the config (a dict in
Triton's JSON form) and writes the result back through a pipe, then exits.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from inferd.core.errors import ConfigError, InferdError, ModelLoadError

DESCRIBE_TIMEOUT_S = 120.0


def describe(
    interpreter: str, path: Path, config: dict[str, Any], default_max_batch_size: int
) -> dict[str, Any]:
    """The config completed by the model's code (ModelLoadError naming the problem)."""
    from inferd.backends.spawn import describe_exit, start_python

    request = json.dumps(
        {"path": str(path), "config": config, "default_max_batch_size": default_max_batch_size}
    ).encode()
    to_child_r, to_child_w = os.pipe()
    from_child_r, from_child_w = os.pipe()
    try:
        proc = start_python(
            interpreter,
            __name__,
            (to_child_r, from_child_w),
            {"INFERD_DESCRIBE_FDS": f"{to_child_r},{from_child_w}"},
        )
    finally:
        os.close(to_child_r)
        os.close(from_child_w)
    with os.fdopen(to_child_w, "wb") as out:
        out.write(request)
    with os.fdopen(from_child_r, "rb") as answer:
        data = answer.read()
    try:
        returncode = proc.wait(DESCRIBE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise ModelLoadError(
            f"{path}: completing its config took over {DESCRIBE_TIMEOUT_S} s"
        ) from None
    if not data:
        raise ModelLoadError(
            f"{path}: the process completing its config {describe_exit(returncode)}"
        )
    result = json.loads(data)
    if "error" in result:
        raise ModelLoadError(result["error"])
    completed: dict[str, Any] = result["config"]
    return completed


def _complete(path: Path, config: dict[str, Any], default_max_batch_size: int) -> dict[str, Any]:
    from inferd.backends.python import pb_utils
    from inferd.backends.python.modelfile import import_model, model_class, where
    from inferd.backends.python.native import complete_native

    form, cls = model_class(import_model(path), path)
    if form == "native":
        return complete_native(cls, config, default_max_batch_size)
    auto_complete = getattr(cls, "auto_complete_config", None)
    if auto_complete is None:
        return config
    try:
        returned = auto_complete(pb_utils.ModelConfig(config))
    except Exception as exc:
        raise ConfigError(f"{path}: auto_complete_config raised {where(exc, path)}") from None
    if not isinstance(returned, pb_utils.ModelConfig):
        raise ConfigError(f"{path}: auto_complete_config must return its ModelConfig argument")
    return returned.as_dict()


def main() -> None:
    """The describing process: request in, ``{"config": ...}`` or ``{"error": ...}`` out."""
    read_fd, write_fd = (int(fd) for fd in os.environ.pop("INFERD_DESCRIBE_FDS").split(","))
    with os.fdopen(read_fd, "rb") as incoming:
        request = json.loads(incoming.read())
    try:
        config = _complete(
            Path(request["path"]), request["config"], int(request["default_max_batch_size"])
        )
        result: dict[str, Any] = {"config": config}
    except InferdError as exc:
        result = {"error": exc.message}
    except Exception as exc:
        result = {"error": f"{request['path']}: {type(exc).__name__}: {exc}"}
    with os.fdopen(write_fd, "wb") as out:
        out.write(json.dumps(result).encode())
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # a thread the model started must not keep this process alive
