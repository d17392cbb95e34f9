"""Importing a model's ``model.py`` and finding its class, with errors naming file and line.

``model.py`` is imported as the module ``model`` with its version folder on ``sys.path`` (its
sibling files import as they would under Triton), after ``triton_python_backend_utils`` is
made importable. The class is ``TritonPythonModel`` (Triton's form), else the native form: the
class named ``Model``, or the one class of the file with an ``infer`` method.
"""

from __future__ import annotations

import importlib.util
import inspect
import sys
import traceback
from pathlib import Path
from types import ModuleType
from typing import Any

from inferd.backends.python import pb_utils
from inferd.core.errors import ModelLoadError

TRITON_CLASS = "TritonPythonModel"
NATIVE_CLASS = "Model"
MODULE_NAME = "model"


def where(exc: BaseException, path: Path) -> str:
    """``TypeError: ... (model.py line 12)``: the error and the last line of ``path`` it
    passed through."""
    line = None
    target = path.resolve()  # a relative --model-repository gives a relative ``path``
    for frame in traceback.extract_tb(exc.__traceback__):
        if Path(frame.filename).resolve() == target:
            line = frame.lineno
    text = f"{type(exc).__name__}: {exc}"
    return f"{text} ({path.name} line {line})" if line is not None else text


def import_model(path: Path) -> ModuleType:
    """Import ``model.py`` (ModelLoadError naming the file and the error)."""
    if not path.is_file():
        raise ModelLoadError(f"{path} does not exist")
    sys.modules.setdefault("triton_python_backend_utils", pb_utils)
    folder = str(path.parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    spec = importlib.util.spec_from_file_location(MODULE_NAME, path)
    if spec is None or spec.loader is None:
        raise ModelLoadError(f"{path} cannot be imported as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[MODULE_NAME] = module
    try:
        spec.loader.exec_module(module)
    except BaseException as exc:
        sys.modules.pop(MODULE_NAME, None)
        raise ModelLoadError(f"{path} does not import: {where(exc, path)}") from None
    return module


def model_class(module: ModuleType, path: Path) -> tuple[str, type[Any]]:
    """("triton", TritonPythonModel) or ("native", the native model class)."""
    found = getattr(module, TRITON_CLASS, None)
    if inspect.isclass(found):
        return "triton", found
    found = getattr(module, NATIVE_CLASS, None)
    if inspect.isclass(found) and callable(getattr(found, "infer", None)):
        return "native", found
    candidates = [
        cls
        for _, cls in inspect.getmembers(module, inspect.isclass)
        if cls.__module__ == module.__name__ and callable(getattr(cls, "infer", None))
    ]
    if len(candidates) == 1:
        return "native", candidates[0]
    if candidates:
        names = ", ".join(sorted(c.__name__ for c in candidates))
        raise ModelLoadError(
            f"{path} has several classes with infer() ({names}): name the one to serve "
            f"'{NATIVE_CLASS}'"
        )
    raise ModelLoadError(
        f"{path} defines no class {TRITON_CLASS} (Triton's form) and no class with "
        "load() and infer() (the native form)"
    )
