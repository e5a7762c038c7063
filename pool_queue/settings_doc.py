"""The settings reference in docs/deployment.md, made from `Settings.model_fields` so that the page cannot drift
from the code: `python -m pool_queue.settings_doc docs/deployment.md` (`make docs`) rewrites the table between
the page's two markers, and a unit test fails while the page is not current.

Each row: the variables that set a field, the flags that set it, its default and what it does. A secret's
default is never written, whatever it is: the page is public and secrets never appear in print.
"""

from __future__ import annotations

import argparse
import functools
import sys
import types
import typing
from pathlib import Path
from typing import Any, Literal

import annotated_types
from pydantic import SecretStr
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings

from .cli import Parser, parser, reports_errors
from .errors import InputError
from .settings import Settings, env_names

BEGIN = "<!-- settings:begin (made by `make docs` from pool_queue/settings.py: edit the descriptions there) -->"
END = "<!-- settings:end -->"
HEADER = "| Variable | Flag | Default | Values | What it does |\n|---|---|---|---|---|\n"


@functools.cache
def shared_flags() -> dict[str, str]:
    """The flags every command that reads the settings takes (`cli.parser`), by the field each sets."""
    p = parser("pool-*", "")
    return {a.dest: a.option_strings[0] for a in p._actions if a.option_strings and a.dest in Settings.model_fields}


def flags(field: str, info: FieldInfo) -> list[str]:
    """The flags that set `field`: a shared one bare, a command's own as `pool-worker --wait-redis` (declared
    in the field's `flags`, checked against that command's --help by a unit test)."""
    own = info.json_schema_extra.get("flags") if isinstance(info.json_schema_extra, dict) else None
    shared = shared_flags().get(field)
    return ([shared] if shared else []) + ([str(f) for f in own] if isinstance(own, list) else [])


def is_secret(info: FieldInfo) -> bool:
    return SecretStr in _leaves(info.annotation)


def default(info: FieldInfo) -> str:
    """The default as a user would write it; a computed one says so (the description tells the rule)."""
    if is_secret(info):
        return "never shown"
    if info.default_factory is not None:
        made = info.get_default(call_default_factory=True, validated_data={})
        return "none" if isinstance(made, list | frozenset | set) and not made else "computed"
    value = info.default
    if value is None:
        return "none"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    return f"`{value:g}`" if isinstance(value, float) else f"`{value}`"


def values(info: FieldInfo) -> str:
    """The kind of value and its bounds: `int ≥ 1`, `adjacent \\| serial`."""
    kinds = [_kind(t) for t in _leaves(info.annotation) if t is not type(None)]
    bounds = []
    for m in [*info.metadata, *_bounds(info.annotation)]:
        for attr, sign in (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<")):
            if isinstance(m, getattr(annotated_types, attr.capitalize())):
                bounds.append(f"{sign} {getattr(m, attr):g}")
    return " \\| ".join(dict.fromkeys(kinds)) + (" " + ", ".join(bounds) if bounds else "")


def _bounds(annotation: Any) -> list[Any]:
    """The constraints on a union's own members (`Annotated[int, Field(ge=1)] | ...`), the field's metadata aside."""
    if typing.get_origin(annotation) is typing.Annotated:
        own = [m for f in annotation.__metadata__ for m in (f.metadata if isinstance(f, FieldInfo) else [f])]
        return [*_bounds(typing.get_args(annotation)[0]), *own]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return [m for a in typing.get_args(annotation) for m in _bounds(a)]
    return []


def _leaves(annotation: Any) -> list[Any]:
    """The types a union (or Annotated, or Literal) is made of; a Literal's values as strings."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _leaves(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return [leaf for a in typing.get_args(annotation) for leaf in _leaves(a)]
    if origin is Literal:
        return [str(v) for v in typing.get_args(annotation)]
    return [annotation]


def _kind(t: Any) -> str:
    if isinstance(t, str):  # a Literal's value
        return f"`{t}`"
    if t is SecretStr:
        return "secret"
    origin = typing.get_origin(t)
    if origin in (list, frozenset):
        return "comma-separated list"
    if origin is dict:
        return "per step (`3:64`)"
    return {Path: "path", bool: "bool", int: "int", float: "float", str: "text"}.get(t, str(t))


def undescribed(model: type[BaseSettings] = Settings) -> list[str]:
    """The fields without a description: each must say what it does."""
    return [name for name, info in model.model_fields.items() if not (info.description or "").strip()]


def reference_markdown(model: type[BaseSettings] = Settings) -> str:
    """The table between the markers, one row per field in the class's order."""
    rows = []
    for name, info in model.model_fields.items():
        cells = [
            ", ".join(f"`{v}`" for v in env_names(name, model)),
            ", ".join(f"`{f}`" for f in flags(name, info)),
            default(info),
            values(info),
            (info.description or "").replace("|", "\\|"),
        ]
        rows.append("| " + " | ".join(cells) + " |\n")
    return HEADER + "".join(rows)


def block(page: str, path: Path) -> tuple[int, int]:
    """Where the generated table lies in `page`: from after the begin marker's line to the end marker."""
    start, end = page.find(BEGIN), page.find(END)
    if start < 0 or end < start:
        raise InputError(f"{path}: no settings reference to rewrite (it needs the lines {BEGIN} and {END})")
    return page.index("\n", start) + 1, end


def current(page: str, path: Path) -> str:
    """`page` with its settings reference made from the code as it is now."""
    start, end = block(page, path)
    return page[:start] + reference_markdown() + page[end:]


@reports_errors
def main(argv: list[str] | None = None) -> None:
    p: argparse.ArgumentParser = Parser(prog="python -m pool_queue.settings_doc", description=__doc__)
    p.add_argument("page", type=Path, help="the Markdown page holding the markers (docs/deployment.md)")
    p.add_argument("--check", action="store_true", help="rewrite nothing; exit 1 when the page is not current")
    args = p.parse_args(argv)
    page = args.page.read_text(encoding="utf-8")
    made = current(page, args.page)
    if made == page:
        return
    if args.check:
        print(f"{args.page}: the settings reference is not current; run `make docs`", file=sys.stderr)
        raise SystemExit(1)
    args.page.write_text(made, encoding="utf-8")
    print(f"{args.page}: settings reference rewritten")


if __name__ == "__main__":
    main()
