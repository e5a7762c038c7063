"""Data written by an older release is read and screened on: a results root and queued jobs that an older
commit left after step 1 (tests/data/compat-<commit>: 665f234, and 8052db7, the last commit before the package
was arranged in subpackages) are finished by today's workers and read by today's readers, with no row lost or
repeated."""

from __future__ import annotations

import base64
import json
import shutil
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from rq.job import Job
from rq.serializers import JSONSerializer
from stack import Stack, cli, expected

from pool_queue.jobs.queue import JOB_FUNC, ChunkJob

pytestmark = pytest.mark.slow  # Redis, simulators and workers over an older release's data

DATA = Path(__file__).resolve().parents[1] / "data"
FIXTURES = ("compat-665f234", "compat-8052db7")


def restore(stack: Stack, data: Path) -> None:
    """The fixture's keys into the stack's Redis, byte for byte."""
    for key, entry in json.loads((data / "redis.json").read_text()).items():
        raw = entry["value"]
        if entry["type"] == "hash":
            stack.conn.hset(key, mapping={f: base64.b64decode(v) for f, v in raw.items()})
        elif entry["type"] == "list":
            stack.conn.rpush(key, *(base64.b64decode(v) for v in raw))
        elif entry["type"] == "set":
            stack.conn.sadd(key, *(base64.b64decode(v) for v in raw))
        else:
            raise AssertionError(f"{key}: a type the fixture does not hold ({entry['type']})")


@pytest.mark.parametrize("fixture", FIXTURES)
def test_a_root_and_queue_of_an_older_release_are_screened_and_read(procs, tmp_path, fixture):
    root = tmp_path / "root"
    shutil.copytree(DATA / fixture / "root", root)
    stack = Stack(root, procs)
    restore(stack, DATA / fixture)
    step1 = stack.winners(1)  # the older segment and its index, read by today's store
    assert len(step1) == 30 and stack.raw_count(1) == 30
    ids = [i.decode() for i in stack.conn.lrange(stack.screen.queue(2).key, 0, -1)]
    queued = Job.fetch_many(ids, connection=stack.conn, serializer=JSONSerializer)
    assert len(queued) == 2 and all(j is not None and j.func_name == JOB_FUNC for j in queued)
    payloads = [ChunkJob.model_validate(j.kwargs) for j in queued if j is not None]
    assert all(p.screen == stack.screen.id and p.step == 2 for p in payloads)

    s8, s2 = stack.sim("sim8", "qwen3-vl-8b", "--speed", "20"), stack.sim("sim2", "qwen3-vl-2b", "--speed", "50")
    stack.worker("w8", s8, "--burst")
    stack.worker("w2", s2, "--burst")
    stack.wait_workers(["w8", "w2"])
    if stack.queued():  # step 3 follow-ups made after the 2B worker found its queue empty
        stack.worker("w2-late", s2, "--burst")
        stack.wait_workers(["w2-late"])

    want = expected(root)
    for step in (1, 2, 3):
        got = stack.winners(step)
        assert set(got) == set(want[step]), f"step {step}"
        assert {k: (r["status"], r["removed"]) for k, r in got.items()} == {
            k: ("ok", v[0]) for k, v in want[step].items()
        }
        assert stack.raw_count(step) == len(got), f"step {step}: a row repeated"
    assert sum(len(p.items) for p in payloads) == len(want[2])  # the queued jobs were all of step 2's work
    bin_ = Path(sys.executable).parent
    audit = cli(stack, str(bin_ / "pool-audit"), "--complete")
    assert audit.returncode == 0, audit.stdout + audit.stderr
    export = cli(stack, str(bin_ / "pool-export"), "--out", str(tmp_path / "export"))
    assert export.returncode == 0, export.stderr
    exported = pq.read_table(tmp_path / "export" / "parquet" / "step1.parquet")
    assert exported.num_rows == 30 and set(exported.column("item_id").to_pylist()) == set(step1)
