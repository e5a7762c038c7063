"""The export of a results root: one row per item and step (the store's winners), as merged JSONL in the run
package's layout and as Parquet with the row schema, written `BATCH` rows at a time (pool-export)."""

from __future__ import annotations

import contextlib
from pathlib import Path

import orjson
import pyarrow.parquet as pq

from ..errors import SetupError
from ..rows import ROW_SCHEMA, to_arrow
from .store import Store

PARQUET = "parquet"  # <out>/parquet/step{N}.parquet: the Parquet files alone, one dataset
BATCH = 5000  # rows in memory at once


def export(store: Store, steps: list[int], out: Path) -> dict[int, tuple[int, int | None]]:
    """Per step: its rows, and the rows of the export it replaced (None: none was there). Streamed `BATCH`
    winners at a time, so memory stays flat whatever the pool's size (each row holds every forward's top-20:
    a step's rows at once took 1.5 GB at 30,000 items). Each file is written under a private name and
    renamed over the old one, so a file is the earlier export's or this one's, never half of one; an export
    cut short says which steps it replaced."""
    counts: dict[int, tuple[int, int | None]] = {}
    (out / PARQUET).mkdir(parents=True, exist_ok=True)
    for step in steps:
        winners = store.winners(step)
        d = out / "results" / "pool" / f"step{step}"
        d.mkdir(parents=True, exist_ok=True)
        jsonl, parquet = d / f"step{step}.jsonl", out / PARQUET / f"step{step}.parquet"
        before = _rows_in(parquet)
        part_j, part_p = (p.with_name(f".{p.name}.part") for p in (jsonl, parquet))
        try:
            with part_j.open("wb") as f, pq.ParquetWriter(part_p, ROW_SCHEMA) as pw:  # an empty step: its schema
                for start in range(0, winners.num_rows, BATCH):
                    rows = store.read_rows(step, winners.slice(start, BATCH))
                    f.write(b"".join(orjson.dumps(r) + b"\n" for r in rows))
                    pw.write_table(to_arrow(rows))
            part_j.replace(jsonl)
            part_p.replace(parquet)
        except OSError as e:  # a full disk: pyarrow's errors name no file
            done = ", ".join(map(str, counts))
            kept = f"; step(s) {done} were replaced, the rest keep the earlier export" if counts else ""
            raise SetupError(f"cannot write the export under {out}: {e.strerror or e}{kept}") from None
        finally:
            for part in (part_j, part_p):
                with contextlib.suppress(OSError):  # a read-only folder refuses even the unlink of what is not there
                    part.unlink(missing_ok=True)
        counts[step] = (winners.num_rows, before)
    return counts


def _rows_in(parquet: Path) -> int | None:
    """The rows of an earlier export's file (its footer alone is read); None where there is none to read."""
    try:
        return int(pq.ParquetFile(parquet).metadata.num_rows)
    except (OSError, ValueError):  # none, or not a Parquet file: nothing of ours to count
        return None
