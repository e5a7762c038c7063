"""Shared command-line plumbing for the commands and the worker: the settings flags, the settings and
protocol in force, and one place where a `PoolError` becomes one line on stderr and exit 2."""

from __future__ import annotations

import argparse
import functools
import math
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn, ParamSpec, TypeVar

import redis
from pydantic import ValidationError

from .errors import PoolError, SetupError, folder_trouble
from .protocol import Protocol
from .settings import Settings, load_settings, source

P = ParamSpec("P")
N = TypeVar("N", int, float)


class Parser(argparse.ArgumentParser):
    """Every command's parser: a flag it cannot take is one line and exit 2, as every other mistake is
    (argparse's usage block would bury it), before anything is read or written."""

    def error(self, message: str) -> NoReturn:
        fail(f"{self.prog}: {message} ({self.prog} --help lists the options)")


def number(kind: Callable[[str], N], low: N, *, above: bool = False, high: N | None = None) -> Callable[[str], N]:
    """An argparse `type=` for a finite number in range: at least `low` (above it with `above`), at most `high`.
    A size of 0 or a speed of -3 is refused by the parser, naming the flag, before the command creates anything."""
    bound = (f"above {low:g}" if above else f"{low:g} or more") + (f" and at most {high:g}" if high is not None else "")

    def parse(text: str) -> N:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a {'whole ' if kind is int else ''}number") from None
        if not math.isfinite(value) or value < low or (above and value == low) or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"{text}: must be {bound}")
        return value

    return parse


def parser(prog: str, description: str) -> argparse.ArgumentParser:
    p = Parser(prog=prog, description=description)
    p.add_argument("--root", type=Path, help="package root (items/, frames/, results/, logs/); env POOL_ROOT")
    p.add_argument("--results", type=Path, help="results root; default <root>/results/pool; env POOL_RESULTS")
    p.add_argument("--redis-url", help="Redis URL; env REDIS_URL (password: REDIS_PASSWORD)")
    p.add_argument("--protocol-file", type=Path, help="protocol JSON replacing the built-in v1")
    return p


def settings(args: argparse.Namespace, **extra: object) -> Settings:
    """The settings in force; a bad value (flag, environment or .env) is one line naming it, exit 2."""
    flags = {k: getattr(args, k) for k in ("root", "results", "redis_url", "protocol_file")}
    try:
        return load_settings(**flags, **extra)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(x) for x in first["loc"])
        src = source(where, {**flags, **extra})  # named as given: the flag, the variable, and its .env file
        named = (f"{src.name} from {src.file}" if src.file else src.name) if src else where or "settings"
        fail(f"setting {named}: {first['msg'].removeprefix('Value error, ')}")


def fail(msg: str, code: int = 2) -> NoReturn:
    print(f"error: {msg}", file=sys.stderr)
    raise SystemExit(code)


def output_dir(path: Path, flag: str = "--out") -> Path:
    """A folder a command may write into, made if absent; else one line naming it (SetupError, exit 2):
    a file where the folder should be, a path that cannot be made, a folder that takes no file."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as e:
        raise SetupError(f"{flag} {path} {folder_trouble(path, e)}; choose another {flag}") from None
    return path


def exe(name: str) -> str:
    """How to call one of our console scripts (or the venv's rq, duckdb) from here, as a printed line is
    run: its bare name where this shell finds ours (an activated venv), else its path (a fresh shell)."""
    ours = Path(sys.executable).parent / name
    if shutil.which(name) == str(ours):
        return name
    return str(ours.relative_to(Path.cwd())) if ours.is_relative_to(Path.cwd()) else str(ours)


def load_protocol(settings: Settings) -> Protocol:
    """The protocol in force (built-in v1 or --protocol-file); a broken file raises ProtocolError."""
    return Protocol.load(settings.protocol_file)


def reports_errors(main: Callable[P, None]) -> Callable[P, None]:
    """A command's entry point: a PoolError, or Redis refusing our password, becomes one line on stderr
    and exit 2, never a traceback. A refused password is never waited out: no wait would help."""

    @functools.wraps(main)
    def run(*args: P.args, **kwargs: P.kwargs) -> None:
        try:
            main(*args, **kwargs)
        except PoolError as e:
            fail(str(e))
        except OSError as e:  # a disk that filled up or turned read-only under us: name it, not a traceback
            if e.errno is None or isinstance(e, ConnectionError | TimeoutError):
                raise
            fail(f"{e.strerror or e}" + (f": {e.filename}" if e.filename else ""))
        except redis.AuthenticationError as e:
            fail(f"Redis refused the password ({e}); check REDIS_PASSWORD or the URL")
        except redis.OutOfMemoryError:
            fail("Redis is at its maxmemory and refuses writes (OOM): raise its maxmemory (docs/scale.md, Redis, "
                 "says how much a pool needs) or free memory, then run the same command again")  # fmt: skip

    return run


def add_allow_missing_frames(p: argparse.ArgumentParser) -> None:
    """The flag that says videos without frames are meant to be missing (pool-enqueue, pool-launch, pool-audit)."""
    p.add_argument("--allow-missing-frames", action="store_true",
                   help="videos that are not `k:` and have no frame folder are meant to be missing: steps 2-3 run, "
                   "and pool-audit --complete passes, without them (POOL_ALLOW_MISSING_FRAMES=1)")  # fmt: skip
