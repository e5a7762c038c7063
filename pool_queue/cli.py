"""Shared command-line plumbing for the commands and the worker: the settings flags, the settings and
protocol in force, and one place where a `PoolError` becomes one line on stderr and exit 2."""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn, ParamSpec

from pydantic import ValidationError

from .errors import PoolError
from .protocol import Protocol
from .settings import Settings, load_settings

P = ParamSpec("P")


def parser(prog: str, description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=description)
    p.add_argument("--root", type=Path, help="package root (items/, frames/, results/, logs/); env POOL_ROOT")
    p.add_argument("--results", type=Path, help="results root; default <root>/results/pool; env POOL_RESULTS")
    p.add_argument("--redis-url", help="Redis URL; env REDIS_URL (password: REDIS_PASSWORD)")
    p.add_argument("--protocol-file", type=Path, help="protocol JSON replacing the built-in v1")
    return p


def settings(args: argparse.Namespace, **extra: object) -> Settings:
    """The settings in force; a bad value (flag, environment or .env) is one line naming it, exit 2."""
    try:
        return load_settings(
            root=args.root, results=args.results, redis_url=args.redis_url, protocol_file=args.protocol_file, **extra
        )
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(x) for x in first["loc"]) or "settings"
        fail(f"setting {where}: {first['msg'].removeprefix('Value error, ')}")


def fail(msg: str, code: int = 2) -> NoReturn:
    print(f"error: {msg}", file=sys.stderr)
    raise SystemExit(code)


def load_protocol(s: Settings) -> Protocol:
    """The protocol in force (built-in v1 or --protocol-file); a broken file raises ProtocolError."""
    return Protocol.load(s.protocol_file)


def reports_errors(main: Callable[P, None]) -> Callable[P, None]:
    """A command's entry point: a PoolError becomes one line on stderr and exit 2, never a traceback."""

    @functools.wraps(main)
    def run(*args: P.args, **kwargs: P.kwargs) -> None:
        try:
            main(*args, **kwargs)
        except PoolError as e:
            fail(str(e))

    return run
