"""The ``inferd`` command line: serve, demo-models, bench, repo, envoy-config, optimize, tune."""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import difflib
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from inferd.app import flags
from inferd.app.envoy_config import add_parser as add_envoy_parser
from inferd.app.repo_cli import add_parser as add_repo_parser
from inferd.bench.options import add_arguments as add_bench_arguments
from inferd.core.errors import ConfigError
from inferd.optimize.command import add_parser as add_optimize_parser
from inferd.tune.command import add_parser as add_tune_parser
from inferd.version import __version__


class _Parser(argparse.ArgumentParser):
    """Help as a terminal shows it: the reST double backticks of docstrings and help texts
    (``x``) print as `x` (its subcommands' parsers are of this class too). A flag is taken only
    by its whole name (``--model-repo`` is not ``--model-repository``): an unknown one is an
    error that names it and the closest flag."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        parsed, extras = super().parse_known_args(args, namespace)
        for extra in extras:
            flag = extra.split("=", 1)[0]
            if flag.startswith("--") and flag not in self._option_string_actions:
                self.error(f"unknown flag {flag}{self._closest(flag)}")
        return parsed, extras

    def _closest(self, flag: str) -> str:
        """`` (did you mean --model-repository?)``: the flags it begins (what it abbreviates),
        else the one it most resembles; empty when none is close."""
        known = [o for o in self._option_string_actions if o.startswith("--")]
        close = [o for o in known if o.startswith(flag)][:3]
        close = close or difflib.get_close_matches(flag, known, n=1, cutoff=0.6)
        return f" (did you mean {' or '.join(close)}?)" if close else ""

    def format_help(self) -> str:
        return super().format_help().replace("``", "`")

    def format_usage(self) -> str:
        return super().format_usage().replace("``", "`")


def _setup_logging(verbose: int) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose > 0 else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


_M_MMAP_THRESHOLD = -3  # mallopt's parameter (glibc's malloc.h)
MMAP_THRESHOLD_BYTES = 256 << 10


def _large_blocks_mapped() -> None:
    """glibc: every block of 256 KiB or more gets pages of its own, given back when it is
    freed. By default the threshold rises to each large block freed, so that request bodies
    and a model's working buffers soon come from the heap, which a burst leaves large; the
    serving and worker processes, forked from this one, keep the setting. A threshold the
    operator set (glibc's environment) stays; without glibc, nothing changes."""
    if "MALLOC_MMAP_THRESHOLD_" in os.environ or "mmap_threshold" in os.environ.get(
        "GLIBC_TUNABLES", ""
    ):
        return  # the operator's choice
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)


# granian's allocator (jemalloc, read from this variable): freed pages go back at once.
GRANIAN_MALLOC_CONF = "dirty_decay_ms:0,muzzy_decay_ms:0"


def _granian_gives_back() -> None:
    """granian's jemalloc hands freed pages back as they are freed, unless the operator
    configured it. By default it keeps them for 10 s of its own activity and purges only when
    it allocates again, so an idle serving process kept what a storm of requests took (tens of
    MiB each); the background threads that purge while idle do not survive the fork into the
    serving processes. Set before granian is imported (jemalloc reads it once)."""
    os.environ.setdefault("_RJEM_MALLOC_CONF", GRANIAN_MALLOC_CONF)


def _serve(args: argparse.Namespace) -> int:
    try:
        config = flags.from_sources(args, os.environ)
    except ConfigError as exc:
        print(f"inferd: {exc.message}", file=sys.stderr)
        return 2
    _large_blocks_mapped()
    _granian_gives_back()
    from inferd.app.server import serve

    return serve(config)


def _demo_models(args: argparse.Namespace) -> int:
    """Named models must all be written (exit 2 otherwise); by default, every model this install
    can serve is, and the others are named with the extra that brings them (exit 0)."""
    from inferd.demo.models import default_models, write_available, write_demo_repository

    _setup_logging(0)
    skipped: dict[str, str] = {}
    try:
        if args.models:
            written = write_demo_repository(Path(args.directory), models=args.models)
        else:
            written, skipped = write_available(Path(args.directory), default_models())
    except (ValueError, ImportError) as exc:
        print(f"inferd demo-models: {exc}", file=sys.stderr)
        return 2
    print(f"demo repository {args.directory}: {', '.join(written)}")
    for need in dict.fromkeys(skipped.values()):
        names = ", ".join(name for name, why in skipped.items() if why == need)
        print(f"inferd demo-models: not written: {names} (needs {need})", file=sys.stderr)
    return 0


def _bench(args: argparse.Namespace) -> int:
    from inferd.bench.runner import run

    return run(args)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="inferd", description=__doc__)
    parser.add_argument("--version", action="version", version=f"inferd {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser(
        "serve",
        help="serve the models of a model repository",
        usage="%(prog)s [--model-repository DIR] [FLAG VALUE ...]",
        formatter_class=flags.HelpFormatter,
    )
    flags.add_arguments(serve)
    serve.set_defaults(func=_serve)

    demo = commands.add_parser(
        "demo-models",
        help="write the demo model repository (models whose extra is missing are named, not "
        "written: the demo extra brings digits and the resnet pipeline)",
    )
    demo.add_argument("directory", help="folder to write the repository into")
    demo.add_argument(
        "--model", dest="models", action="append", help="only this model (repeat); default all"
    )
    demo.set_defaults(func=_demo_models)

    bench = commands.add_parser(
        "bench", help="measure a KServe v2 or TF Serving server (perf_analyzer style)"
    )
    add_bench_arguments(bench)
    bench.set_defaults(func=_bench)
    add_repo_parser(commands)
    add_envoy_parser(commands)
    add_optimize_parser(commands)
    add_tune_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    code: int = args.func(args)
    return code
