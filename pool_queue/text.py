"""Text that is always valid UTF-8, whatever the filesystem or an exception handed us.

Python keeps the bytes of a file name that is not valid UTF-8 as lone surrogates; such a string
cannot be encoded, so a row, a JSON message or Redis would refuse it. Every message that may hold a
name goes through `printable`, and the store's writer through `printable_tree` as a last guard.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def steps_label(steps: Iterable[int]) -> str:
    """ "step 3" or "steps 1,2": how a line names the steps a server or a model group serves."""
    shown = [str(s) for s in steps]
    return f"step {shown[0]}" if len(shown) == 1 else f"steps {','.join(shown)}"


def counted(n: int, noun: str) -> str:
    """ "1 job", "47 jobs": a count with its noun in the number it needs (nouns that take an s)."""
    return f"{n:,} {noun}" if n == 1 else f"{n:,} {noun}s"


def printable(text: str) -> str:
    """`text` itself when it is valid UTF-8, else with its undecodable bytes as backslash escapes."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    return text


def is_utf8(text: str) -> bool:
    return printable(text) is text


def printable_tree(value: Any) -> Any:
    """`printable` over every string of a JSON-like value (dict keys included)."""
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, dict):
        return {printable_tree(k): printable_tree(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [printable_tree(v) for v in value]
    return value
