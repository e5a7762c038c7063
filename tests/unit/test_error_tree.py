"""errors.py's docstring draws the whole exception tree: a class added anywhere in the project, or moved to
another module, fails here until the picture shows it where it lives."""

from __future__ import annotations

import ast
import builtins

from test_import_graph import modules

import pool_queue.errors


def exception_classes() -> dict[str, str]:
    """Every public exception class the project defines, by name, with the module that defines it: a class
    whose base is a builtin exception or another such class (read from the source, nothing imported)."""
    defined = {
        node.name: (name, [b.id for b in node.bases if isinstance(b, ast.Name)])
        for name, path in modules().items()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ClassDef)
    }
    found: dict[str, str] = {}
    grew = True
    while grew:
        grew = False
        for cls, (module, bases) in defined.items():
            if cls not in found and any(b in found or _builtin_exception(b) for b in bases):
                found[cls] = module
                grew = True
    return {cls: module for cls, module in found.items() if not cls.startswith("_")}


def _builtin_exception(name: str) -> bool:
    t = getattr(builtins, name, None)
    return isinstance(t, type) and issubclass(t, BaseException)


def test_the_picture_shows_every_exception_class_in_its_module():
    branches = [
        line.replace("└──", "├──").partition("├── ")[2] for line in (pool_queue.errors.__doc__ or "").splitlines()
    ]
    picture = {b.split("(")[0].split()[0]: b for b in branches if b}
    found = exception_classes()
    assert {"PoolError", "ItemFailure", "Stopped", "SimError"} <= found.keys()  # both packages were read
    missing = sorted(cls for cls in found if cls not in picture)
    assert missing == [], f"add to errors.py's tree: {missing}"
    for cls, module in found.items():
        short = module.removeprefix("pool_queue.")
        assert f" {short} " in f"{picture[cls]} ", f"{cls} lives in {module}, the picture says otherwise"
