"""docs/contributing.md's map and the tree tell the same story: every product module is named there, every
module it names exists, and the three places a first change most often starts are named where they are; the
package's `__all__` lists its folders and top modules."""

from __future__ import annotations

import re
from pathlib import Path

import pool_queue

REPO = Path(__file__).resolve().parents[2]
MAP = (REPO / "docs" / "contributing.md").read_text()


def modules() -> list[Path]:
    found = [*(REPO / "pool_queue").rglob("*.py"), *(REPO / "workers").glob("*.py")]
    return [p.relative_to(REPO) for p in found if p.name not in ("__init__.py", "__main__.py")]


def named(path: Path) -> bool:
    """By its path, its dotted name, or its file name in a row of its folder."""
    dotted = ".".join(path.with_suffix("").parts)
    return f"`{path}`" in MAP or re.search(rf"\b{re.escape(dotted)}\b", MAP) is not None or f"`{path.name}`" in MAP


def test_every_module_is_on_the_map():
    assert [str(p) for p in modules() if not named(p)] == []


def test_every_module_the_map_names_exists():
    paths = re.findall(r"`((?:pool_queue|workers)/[\w/]+\.py)`", MAP)
    files = {p.name for p in modules()} | {"__main__.py"}
    bare = [b for b in re.findall(r"`(\w+\.py)`", MAP) if b not in files]
    assert [p for p in paths if not (REPO / p).exists()] == [] and bare == []


def test_where_a_request_is_built_a_row_is_written_and_a_batch_falls_back():
    row = next(line for line in MAP.splitlines() if line.startswith("| `workers/`"))
    assert "`screen.py`, where a failed batch is sent again item by item" in row
    assert "`runtime.py`: a job's rows through `store.SegmentWriter`" in row
    assert "`workers/screen.py`" in MAP and "`pool_queue/protocol.py` (the request body)" in MAP
    assert (REPO / "pool_queue" / "store" / "store.py").read_text().count("class SegmentWriter") == 1


def test_the_package_lists_its_folders_and_top_modules():
    top = {p.stem for p in (REPO / "pool_queue").iterdir() if p.suffix == ".py" and p.name != "__init__.py"}
    folders = {p.name for p in (REPO / "pool_queue").iterdir() if (p / "__init__.py").is_file()}
    assert len(folders) >= 10 and "rq_config" in top  # the tree was read
    assert sorted(pool_queue.__all__) == sorted(top | folders)
