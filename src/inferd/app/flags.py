"""Where Settings come from: command-line flags (Triton's names), ``INFERD_*`` environment
variables, and keyword arguments in Python (``inferd.Server(model_repository=...)``).

Precedence: a flag given on the command line, then the environment, then the default. Every
field's flag is ``--field-name`` and its variable ``INFERD_FIELD_NAME``.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import os
from collections.abc import Mapping, Sequence
from typing import Any

from inferd.app.settings import Settings
from inferd.core.errors import ConfigError

_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}


def parse_size(text: str, flag: str) -> int:
    """A size in bytes: a number, or one with a unit as Kubernetes writes them (K, M, G, T:
    powers of 1000; Ki, Mi, Gi, Ti: powers of 1024; a trailing B is allowed): ``8Gi``."""
    raw = text.strip()
    body = raw[:-1] if raw[-1:] in ("B", "b") else raw
    binary = body[-1:] in ("i", "I")
    if binary:
        body = body[:-1]
    unit = body[-1:].lower() if body[-1:].isalpha() else ""
    number = body[: len(body) - len(unit)].strip()
    if unit not in _UNITS or (binary and not unit):
        raise ConfigError(f"{flag}: '{text}' is not a size (bytes, or 8Gi, 10G...)")
    try:
        value = float(number)
    except ValueError:
        raise ConfigError(f"{flag}: '{text}' is not a size (bytes, or 8Gi, 10G...)") from None
    scale = 1024 ** " kmgt".index(unit or " ") if binary else _UNITS[unit]
    if not 0 <= value < 2**63 / scale:  # also NaN and infinity
        raise ConfigError(f"{flag}: '{text}' is not a size of 0 bytes or more")
    return int(value * scale)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _env(name: str) -> str:
    return "INFERD_" + name.upper()


def _parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"not a boolean: '{text}'")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    for f in dataclasses.fields(Settings):
        meta = f.metadata
        env = _env(f.name)
        help_text = f"{meta['help']} (env {env})"
        if f.type == "bool":
            parser.add_argument(
                _flag(f.name),
                dest=f.name,
                nargs="?",
                const="true",
                default=None,
                metavar="BOOL",
                help=help_text,
            )
        elif "const" in meta:  # a value, or the bare flag meaning ``const``
            parser.add_argument(
                _flag(f.name),
                dest=f.name,
                nargs="?",
                const=meta["const"],
                default=None,
                help=help_text,
            )
        elif meta.get("many"):  # several values after one flag, as TorchServe's --models
            parser.add_argument(
                _flag(f.name), dest=f.name, action="extend", nargs="+", default=None, help=help_text
            )
        elif meta.get("repeat"):
            parser.add_argument(
                _flag(f.name), dest=f.name, action="append", default=None, help=help_text
            )
        else:
            parser.add_argument(_flag(f.name), dest=f.name, default=None, help=help_text)


def from_sources(args: argparse.Namespace | None, environ: Mapping[str, str]) -> Settings:
    """Build Settings from parsed flags and an environment mapping."""
    values: dict[str, Any] = {}
    for f in dataclasses.fields(Settings):
        raw: Any = getattr(args, f.name, None) if args is not None else None
        if raw is None and _env(f.name) in environ:
            text = environ[_env(f.name)]
            raw = [p for p in text.split(",") if p] if f.metadata.get("repeat") else text
        if raw is None:
            continue
        values[f.name] = _convert(f, raw)
    return Settings(**values)


def _convert(f: dataclasses.Field[Any], raw: Any) -> Any:
    try:
        if f.type == "bool":
            return _parse_bool(str(raw))
        if f.type == "int":
            return int(raw)
        if f.type == "float":
            return float(raw)
    except ValueError as exc:
        raise ConfigError(f"invalid value for {_flag(f.name)}: {exc}") from None
    if f.metadata.get("repeat"):
        return list(raw)
    return str(raw)


def parse(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> Settings:
    parser = argparse.ArgumentParser(prog="inferd serve")
    add_arguments(parser)
    return from_sources(parser.parse_args(list(argv)), os.environ if environ is None else environ)


def from_keywords(options: Mapping[str, Any], base: Settings | None = None) -> Settings:
    """Settings from Python keyword arguments (``inferd.Server(model_repository=..., ...)``):
    each name a field (a flag's name with underscores), each value of the field's type or its
    text as the flag takes it; a folder may be a ``Path``, a repeated setting one value or a
    list. Fields not named keep ``base``'s values (else the defaults); the environment is not
    read."""
    names = {f.name: f for f in dataclasses.fields(Settings)}
    values: dict[str, Any] = {}
    for name, value in options.items():
        f = names.get(name)
        if f is None:
            close = difflib.get_close_matches(name, list(names), n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            raise ConfigError(f"unknown setting '{name}'{hint}")
        values[name] = _keyword_value(f, value)
    return dataclasses.replace(base if base is not None else Settings(), **values)


def _keyword_value(f: dataclasses.Field[Any], value: Any) -> Any:
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if f.metadata.get("repeat"):
        items = [value] if isinstance(value, str | os.PathLike) else value
        if not isinstance(items, list | tuple) or not all(
            isinstance(i, str | os.PathLike) for i in items
        ):
            raise ConfigError(f"setting '{f.name}' takes a string or a list of strings")
        return [os.fspath(i) for i in items]
    if isinstance(value, str):
        return _convert(f, value)
    wanted = {"bool": (bool,), "int": (int,), "float": (int, float), "str": (str,)}[str(f.type)]
    if not isinstance(value, wanted) or (f.type != "bool" and isinstance(value, bool)):
        raise ConfigError(
            f"setting '{f.name}' must be {f.type}, got {type(value).__name__} {value!r}"
        )
    return float(value) if f.type == "float" and isinstance(value, int | float) else value
