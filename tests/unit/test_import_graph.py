"""The project's modules import one another without a circle (imports under TYPE_CHECKING count too): a
circle hides which module holds what, and breaks as soon as one of its imports runs at load time. The library
is in layers along the data's path (LAYERS): none imports a layer above its own, the library never imports the
worker, and no command imports another (what two commands share lives in the library)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("pool_queue", "workers")


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for f in (ROOT / package).rglob("*.py"):
            parts = f.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The project's modules that `name` imports: `from . import x` names module x, `from .x import y` x."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            targets = [module, *(f"{module}.{a.name}" for a in node.names)]
        else:
            continue
        for t in targets:
            while t and t not in known:
                t = t.rpartition(".")[0]
            if t and t != name:
                out.add(t)
    return out


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = [stack.pop()]
            while group[-1] != v:
                group.append(stack.pop())
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_module_of_the_project_imports_itself_through_others():
    known = modules()
    graph = {name: imports(name, path, known) for name, path in known.items()}
    assert len(graph) > 50 and sum(map(len, graph.values())) > 150  # the graph was read, not found empty
    assert circles(graph) == []


def test_a_circle_is_found():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def outside_imports(path: Path) -> set[str]:
    """The top-level names of the absolute imports in one file (`import a.b` and `from a.b import c` give a)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name.partition(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            out.add(node.module.partition(".")[0])
    return out


def harness_names() -> set[str]:
    """What a product module must never import: the test tree, the benchmarks, and the modules that the test
    harness and the benchmarks put on the path under their bare names (`stack`, `reference`, `_util`, ...)."""
    scripts = [*(ROOT / "tests" / "harness").glob("*.py"), *(ROOT / "benchmarks").glob("*.py")]
    return {"tests", "benchmarks", *(f.stem for f in scripts)}


def test_no_product_module_imports_the_tests_or_the_benchmarks():
    banned = harness_names()
    assert {"stack", "reference", "chaos_run", "_util"} <= banned  # the harness and benchmarks were read
    found = {name: sorted(outside_imports(path) & banned) for name, path in modules().items()}
    assert {name: hits for name, hits in found.items() if hits} == {}


def test_a_product_module_importing_the_harness_is_found(tmp_path):
    planted = tmp_path / "m.py"
    planted.write_text("import os\nfrom reference import expected\nimport tests.harness.stack\nfrom . import x\n")
    assert outside_imports(planted) & harness_names() == {"reference", "tests"}


# The layers of the library, lowest first: a module may import its own layer and those below, never one above.
# Within a layer its packages may import one another (the test above keeps them free of circles). The top
# modules are two layers: `settings` asks `proc.hostlock` whether a demo still runs, so proc sits between them.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("pool_queue", "pool_queue.protocol", "pool_queue.rows", "pool_queue.errors", "pool_queue.text"),
    ("pool_queue.proc",),
    ("pool_queue.settings", "pool_queue.settings_doc", "pool_queue.cli", "pool_queue.rq_config"),
    ("pool_queue.inputs",),
    ("pool_queue.store",),
    ("pool_queue.jobs",),
    ("pool_queue.observe",),
    # the simulator stands where vLLM does: launch starts it, the demo's pool answers as its model does
    ("pool_queue.launch", "pool_queue.demo", "pool_queue.hub", "pool_queue.sim"),
    ("pool_queue.commands",),
    ("workers",),  # the worker process uses the library; the library never imports it
)


def layer(name: str) -> int | None:
    """The index in LAYERS of the longest entry that names `name` or a package holding it (`pool_queue` names
    only the package's own `__init__`); None for none: a module added outside the layers is placed by hand."""
    best: tuple[int, int] | None = None
    for i, members in enumerate(LAYERS):
        for m in members:
            inside = name.startswith(m + ".") and m != "pool_queue"
            if (name == m or inside) and (best is None or len(m) > best[0]):
                best = (len(m), i)
    return None if best is None else best[1]


def upward(graph: dict[str, set[str]]) -> list[str]:
    """Every import of a module in a higher layer than the importer's, as `importer -> imported`."""
    return sorted(
        f"{a} -> {b}"
        for a, targets in graph.items()
        for b in targets
        if (la := layer(a)) is not None and (lb := layer(b)) is not None and lb > la
    )


def test_every_module_has_a_layer():
    assert [name for name in modules() if layer(name) is None] == []


def test_no_module_imports_a_higher_layer():
    known = modules()
    graph = {name: imports(name, path, known) for name, path in known.items()}
    assert {layer(n) for n in graph} == set(range(len(LAYERS)))  # every layer holds a module
    assert upward(graph) == []


def test_an_import_of_a_higher_layer_is_found():
    graph = {"pool_queue.jobs.plan": {"pool_queue.observe.status", "pool_queue.store.store"},
             "pool_queue.store.store": {"workers.runtime"}, "workers.runtime": {"pool_queue.jobs.lease"}}  # fmt: skip
    assert upward(graph) == ["pool_queue.jobs.plan -> pool_queue.observe.status",
                             "pool_queue.store.store -> workers.runtime"]  # fmt: skip


def test_no_command_imports_another():
    known = modules()
    commands = {name for name in known if name.startswith("pool_queue.commands.")}
    assert len(commands) >= 13  # the commands were read
    found = {name: sorted(imports(name, known[name], known) & commands) for name in commands}
    assert {name: hits for name, hits in found.items() if hits} == {}
