"""The command-line reference, generated from the argument parser ``inferd.cli`` builds."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from inferd.app import settings
from inferd.cli import build_parser

_SUPPRESSED = {"-h", "--help", "--version"}
_MIB = 1 << 20
_DEFAULT_GROUPS = {"positional arguments", "options", "optional arguments"}


def _subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.ArgumentParser]]:
    """(``inferd serve``, its parser) for every (sub)command, depth first, in parser order."""
    found: list[tuple[str, argparse.ArgumentParser]] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found.append((sub.prog, sub))
                found.extend(_subcommands(sub))
    return found


def _help_of(parser: argparse.ArgumentParser) -> dict[str, str]:
    helps: dict[str, str] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for choice in action._choices_actions:
                helps[choice.dest] = choice.help or ""
    return helps


def _settings_defaults() -> dict[str, Any]:
    """``inferd serve`` leaves its parser defaults unset (a flag beats INFERD_*, which beats
    the default): the defaults are the Settings fields'. A default computed where the server
    runs (the host name) is left to the help text."""
    return {
        f.name: f.default
        for f in dataclasses.fields(settings.Settings)
        if f.default is not dataclasses.MISSING
    }


def _default(action: argparse.Action, fallback: dict[str, Any]) -> str:
    value = action.default
    if value is None and action.dest in fallback:
        value = fallback[action.dest]
    if value in (None, [], "", argparse.SUPPRESS) or isinstance(action, argparse._HelpAction):
        return ""
    if isinstance(value, bool):
        return "`true`" if value else "`false`"
    if isinstance(value, list):
        return ", ".join(f"`{v}`" for v in value)
    if isinstance(value, int) and value >= _MIB and value % _MIB == 0:
        return f"`{value}` ({value // _MIB} MiB)"
    return f"`{value}`"


def _usage(action: argparse.Action) -> str:
    if not action.option_strings:
        return f"`{action.metavar or action.dest.upper()}`"
    names = ", ".join(action.option_strings)
    if action.nargs == 0:
        return f"`{names}`"
    if action.choices:
        value = "|".join(str(c) for c in action.choices)
    else:
        value = str(action.metavar or action.dest.upper())
    if action.nargs == "?":
        value = f"[{value}]"
    return f"`{names} {value}`"


def _cell(text: str) -> str:
    return " ".join(text.replace("|", "\\|").split())


def _sections(parser: argparse.ArgumentParser) -> list[tuple[str, list[argparse.Action]]]:
    """The arguments by group, as ``--help`` lists them: the positional ones and the options
    in one untitled section, then each titled group (``inferd serve``'s topics)."""
    plain = [
        a for g in parser._action_groups if g.title in _DEFAULT_GROUPS for a in g._group_actions
    ]
    titled = [(g.title or "", g._group_actions) for g in parser._action_groups]
    return [("", plain)] + [(t, a) for t, a in titled if t not in _DEFAULT_GROUPS]


def _heading(title: str) -> str:
    """``models and repository``: ``Models and repository``; ``gRPC`` stays."""
    return title[:1].upper() + title[1:] if title[1:2].islower() else title


def _rows(actions: list[argparse.Action], fallback: dict[str, Any]) -> list[tuple[str, str, str]]:
    rows = []
    for action in actions:
        if set(action.option_strings) & _SUPPRESSED:
            continue
        if isinstance(action, argparse._SubParsersAction):
            rows.append(("`COMMAND`", "", "one of " + ", ".join(f"`{c}`" for c in action.choices)))
            continue
        rows.append((_usage(action), _default(action, fallback), _cell(action.help or "")))
    return rows


def reference() -> str:
    """The whole page: every command, then a table of its arguments."""
    root = build_parser()
    helps = _help_of(root)
    lines = [
        "# Command line",
        "",
        "Generated from the argument parser of `inferd` (`inferd.cli.build_parser`) each time the",
        "site is built, so it always matches `inferd COMMAND --help`. Every `inferd serve` flag is",
        "also an environment variable `INFERD_<NAME>` (for instance `INFERD_HTTP_PORT=9000`; lists",
        "are comma-separated): a flag beats the variable, which beats the default. A `BOOL` flag",
        "alone means `true`; write `--flag=false` to turn it off. The `inferd serve` flags are",
        "grouped by topic as `inferd serve --help` lists them. A flag is written whole: an",
        "abbreviation (`--model-repo`) is an error that names the flag it may mean.",
        "",
    ]
    serve_defaults = _settings_defaults()
    for prog, parser in _subcommands(root):
        name = prog.split(" ", 1)[1]
        sub_helps = helps
        parent = name.rsplit(" ", 1)[0] if " " in name else ""
        if parent:
            sub_helps = _help_of(dict(_subcommands(root))[f"inferd {parent}"])
        lines += [f"## `{prog}`", "", _cell(sub_helps.get(name.split(" ")[-1], "")), ""]
        fallback = serve_defaults if name == "serve" else {}
        for title, actions in _sections(parser):
            rows = _rows(actions, fallback)
            if not rows:
                continue
            if title:
                lines += [f"### {_heading(title)}", ""]
            lines += ["| argument | default | meaning |", "|---|---|---|"]
            lines += [f"| {u} | {d} | {h} |" for u, d, h in rows]
            lines.append("")
    return "\n".join(lines)
