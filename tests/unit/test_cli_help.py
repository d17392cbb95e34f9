"""``inferd serve --help`` a person can scan: the flags by topic, each with its default; a flag
is taken only by its whole name, and an unknown one is an error that names it."""

from __future__ import annotations

import argparse
import dataclasses
import os
import subprocess
import sys

import pytest

from inferd.app import flags
from inferd.app.settings import Settings
from inferd.cli import build_parser


def _inferd(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "inferd", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "200"},  # one line a flag: what the assertions read
    )


def _line(help_text: str, flag: str) -> str:
    return next(line for line in help_text.splitlines() if line.strip().startswith(flag + " "))


def test_serve_help_lists_the_flags_by_topic_with_their_defaults() -> None:
    done = _inferd("serve", "--help")
    assert done.returncode == 0, done.stderr
    text = done.stdout
    headings = [line[:-1] for line in text.splitlines() if line and not line[0].isspace()]
    assert headings[1:] == ["options"] + [title for title, _ in flags.TOPICS]
    assert "models and repository" in headings and "gRPC connection limits" in headings
    assert "(default: 8080; env INFERD_HTTP_PORT)" in _line(text, "--http-port")
    assert "(default: 8081; env INFERD_GRPC_PORT)" in _line(text, "--grpc-port")
    assert "(default: 0.0.0.0; env INFERD_HTTP_ADDRESS)" in _line(text, "--http-address")
    assert "(default: 0.0.0.0; env INFERD_GRPC_ADDRESS)" in _line(text, "--grpc-address")
    assert "(default: true; env INFERD_ALLOW_GRPC)" in _line(text, "--allow-grpc")
    assert "(default: false; env INFERD_AUTH_HEALTH)" in _line(text, "--auth-health")
    assert "(default: 134217728 (128 MiB);" in _line(text, "--grpc-max-message-bytes")
    # no default to show: an empty one is not printed, one the help tells is not doubled
    assert "default" not in _line(text, "--model-repository")
    assert _line(text, "--node-name").count("default") == 1
    # the HTTP port is under its topic's heading
    http = text.index("\nHTTP:\n")
    assert http < text.index("--http-port ") < text.index("\ngRPC:\n")
    # every flag is listed once
    for f in dataclasses.fields(Settings):
        assert text.count("  --" + f.name.replace("_", "-") + " ") == 1, f.name


def test_every_setting_has_one_topic() -> None:
    named = [name for _, names in flags.TOPICS for name in names]
    assert sorted(named) == sorted(f.name for f in dataclasses.fields(Settings))


def test_an_abbreviated_flag_is_an_error_naming_it() -> None:
    done = _inferd("serve", "--model-repo", "x")
    assert done.returncode == 2
    last = done.stderr.strip().splitlines()[-1]
    assert last == (
        "inferd serve: error: unknown flag --model-repo (did you mean --model-repository?)"
    )
    done = _inferd("serve", "--http-portt=9000")
    assert done.returncode == 2
    assert "unknown flag --http-portt (did you mean --http-port?)" in done.stderr


@pytest.mark.parametrize(
    "argv",
    [
        ["bench", "-m", "m", "--model-ver", "1"],  # --model-version
        ["repo", "index", "--ur", "http://x"],
        ["envoy-config", "--upstr", "h:1:2"],
    ],
)
def test_no_subcommand_takes_an_abbreviation(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stopped:
        build_parser().parse_args(argv)
    assert stopped.value.code == 2
    assert f"unknown flag {argv[-2]}" in capsys.readouterr().err


def _value(f: dataclasses.Field[object]) -> str:
    return {"bool": "false", "int": "7", "float": "0.5"}.get(str(f.type), "value-" + f.name)


def test_every_serve_flag_still_parses() -> None:
    argv = ["serve"]
    for f in dataclasses.fields(Settings):
        argv += ["--" + f.name.replace("_", "-"), _value(f)]
    args = build_parser().parse_args(argv)
    for f in dataclasses.fields(Settings):
        raw = getattr(args, f.name)
        assert (raw if isinstance(raw, str) else raw[0]) == _value(f), f.name
    alone = build_parser().parse_args(["serve", "--access-log", "--allow-pickle"])
    assert (alone.access_log, alone.allow_pickle) == ("true", "always")
    assert isinstance(alone, argparse.Namespace)


def test_flags_parse_takes_whole_names_only() -> None:
    assert flags.parse(["--http-port", "9000"], environ={}).http_port == 9000
    with pytest.raises(SystemExit):
        flags.parse(["--http-po", "9000"], environ={})
