"""Shared command-line plumbing for the commands and the worker: the settings flags, the settings and
protocol in force, and one place where a `PoolError` becomes one line on stderr and exit 2."""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn, ParamSpec

import redis
from dotenv import dotenv_values
from pydantic import ValidationError

from .errors import PoolError, SetupError
from .protocol import Protocol
from .settings import Settings, env_file, load_settings

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
    flags = {k: getattr(args, k) for k in ("root", "results", "redis_url", "protocol_file")}
    try:
        return load_settings(**flags, **extra)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(x) for x in first["loc"])
        fail(f"setting {_as_given(where, {k for k, v in {**flags, **extra}.items() if v is not None})}: "
             f"{first['msg'].removeprefix('Value error, ')}")  # fmt: skip


def _as_given(loc: str, flags: set[str]) -> str:
    """A bad setting by the name its user gave it: the flag, else the variable set in the environment, else
    the one in the env file (REDIS_URL rather than its alias POOL_REDIS_URL), else the field's first name."""
    for name, field in Settings.model_fields.items():
        choices = getattr(field.validation_alias, "choices", None) or [f"POOL_{name.upper()}"]
        if loc != name and loc not in choices:
            continue
        if name in flags:
            return "--" + name.replace("_", "-")
        path = env_file()
        in_file = dotenv_values(path) if path and os.path.isfile(path) else {}
        names = [c for c in choices if isinstance(c, str)]
        return next((c for c in names if c in os.environ), next((c for c in names if c in in_file), loc))
    return loc or "settings"


def fail(msg: str, code: int = 2) -> NoReturn:
    print(f"error: {msg}", file=sys.stderr)
    raise SystemExit(code)


def output_dir(path: Path, flag: str = "--out") -> Path:
    """A folder a command may write into, made if absent; else one line naming it (SetupError, exit 2):
    a file where the folder should be, a path that cannot be made, a folder that takes no file."""
    if path.exists() and not path.is_dir():
        raise SetupError(f"{flag} {path}: a file is there, not a folder; choose another {flag}")
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as e:
        raise SetupError(f"{flag} {path}: cannot write there ({e.strerror or e})") from None
    return path


def exe(name: str) -> str:
    """How to call one of our console scripts (or the venv's rq, duckdb) from here, as a printed line is
    run: its bare name where this shell finds ours (an activated venv), else its path (a fresh shell)."""
    ours = Path(sys.executable).parent / name
    if shutil.which(name) == str(ours):
        return name
    return str(ours.relative_to(Path.cwd())) if ours.is_relative_to(Path.cwd()) else str(ours)


def load_protocol(s: Settings) -> Protocol:
    """The protocol in force (built-in v1 or --protocol-file); a broken file raises ProtocolError."""
    return Protocol.load(s.protocol_file)


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
