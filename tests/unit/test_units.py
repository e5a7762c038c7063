"""Unit tests of the pieces the end-to-end tests only reach through a whole run: the chain rule, the step
graph, the rate window, a launcher's view of its workers' holds, the error tree and the one place a command
turns an error into one line."""

from __future__ import annotations

import os
import socket
import time

import pyarrow as pa
import pytest
from craft import P, items_of, row, write
from redis import Redis

from pool_queue.cli import reports_errors
from pool_queue.demo.synth import SynthConfig, generate
from pool_queue.errors import (
    ForwardError,
    InputError,
    ItemFailure,
    ItemsError,
    PoolError,
    ProtocolError,
    RedisGone,
    RetriesExhausted,
    ServerMisconfigured,
    ServerUnreachable,
    SetupError,
    StoreError,
)
from pool_queue.inputs.frames import frame_videos, prepare_jpeg
from pool_queue.inputs.items import load_items
from pool_queue.jobs.plan import eligible, next_step_ids
from pool_queue.observe.presence import HoldNews, RateWindow, WorkerSnapshot, publish
from pool_queue.proc.progress import busy_time, duration
from pool_queue.store.store import Store
from pool_queue.text import counted, steps_label


def _rows(*spec: tuple[str, str, str, bool | None]) -> pa.Table:
    ids, videos, status, removed = zip(*spec, strict=True)
    return pa.table({"item_id": list(ids), "video_id": list(videos), "status": list(status),
                     "removed": pa.array(removed, pa.bool_())})  # fmt: skip


def test_lines_name_one_step_and_one_job_in_the_singular():
    assert [steps_label((3,)), steps_label((1, 2)), steps_label([1, 2, 3])] == ["step 3", "steps 1,2", "steps 1,2,3"]
    assert [counted(1, "job"), counted(0, "job"), counted(2011, "item")] == ["1 job", "0 jobs", "2,011 items"]


def test_the_chain_rule():
    rows = _rows(
        ("b1", "vb", "ok", False),
        ("a1", "va", "ok", False),
        ("a2", "va", "ok", True),  # removed: stops here
        ("c1", "vc", "error", None),  # an error row never chains
        ("a3", "va", "ok", False),
        ("d1", "vd", "ok", False),  # no frames for vd
    )
    frames = pa.array(["va", "vb", "vc"], pa.string())
    assert next_step_ids(P, 1, rows, frames) == ["a1", "a3", "b1"]  # step 2 sends a frame: vd is left out, by video
    assert next_step_ids(P, 2, rows, frames) == ["a1", "a3", "b1"]
    assert next_step_ids(P, 3, rows, frames) == []  # the last step chains nowhere
    blind = P.model_copy(update={"steps": {**P.steps, 2: P.steps[2].model_copy(update={"frames": "none"})}})
    assert next_step_ids(blind, 1, rows, frames) == ["a1", "a3", "b1", "d1"]  # a step without frames needs none


def test_the_step_graph():
    assert [P.next_step(s) for s in (1, 2, 3)] == [2, 3, None]
    assert [P.prev_step(s) for s in (1, 2, 3)] == [None, 1, 2]
    assert P.model_groups() == [(1, 2), (3,)]  # the 8B answers steps 1-2, the 2B step 3: two server types
    assert [P.model_group(s) for s in (1, 2, 3)] == [(1, 2), (1, 2), (3,)]
    one = P.model_copy(update={"steps": {**P.steps, 3: P.steps[3].model_copy(update={"model": P.steps[1].model,
                       "revision": P.steps[1].revision, "served_name": P.steps[1].served_name})}})  # fmt: skip
    assert one.model_groups() == [(1, 2, 3)]  # one model for every step: one server type


def test_eligible_is_the_chain_rule_over_the_store(pool_root):
    items = items_of(pool_root)
    write(pool_root, 1, [row(it, 1, removed=i % 3 == 0) for i, it in enumerate(items)])
    store = Store(pool_root / "results" / "pool", P.fingerprint)
    table = load_items(pool_root / "items").items
    frames_dir = pool_root / "frames" / "pool_frames"
    with_frames = set(frame_videos(frames_dir).to_pylist())
    want = {it["item_id"] for i, it in enumerate(items) if i % 3 and it["video_id"] in with_frames}
    assert set(eligible(P, 2, table, store, frames_dir).column("item_id").to_pylist()) == want
    assert eligible(P, 1, table, store, frames_dir).num_rows == len(items)
    assert eligible(P, 3, table, store, frames_dir).num_rows == 0  # nothing passed step 2 yet


def test_rate_window_follows_the_last_minute():
    w = RateWindow(60.0)
    assert w.rates(0.0, 0, 0) == (0.0, 0.0)
    assert w.rates(10.0, 100, 400) == (10.0, 40.0)
    w.rates(70.0, 700, 2800)
    assert w.rates(100.0, 700, 2800) == pytest.approx((0.0, 0.0))  # idle for the last 30 s, samples 60 s back
    assert w.rates(130.0, 1000, 4000) == pytest.approx((300 / 60, 1200 / 60))


def test_the_error_tree():
    for e in (ProtocolError, ItemsError, StoreError):
        assert issubclass(e, InputError) and issubclass(e, PoolError)
    for e in (ServerMisconfigured, ServerUnreachable, RedisGone):
        assert issubclass(e, SetupError)
    assert issubclass(ForwardError, ItemFailure) and ForwardError.kind == "permanent"
    assert issubclass(RetriesExhausted, ItemFailure) and RetriesExhausted.kind == "transient"
    assert not issubclass(RetriesExhausted, ForwardError)  # transient: a later run re-attempts it
    assert not issubclass(ItemFailure, PoolError)  # an item's error is its row, never a command's


def test_a_command_turns_a_pool_error_into_one_line(capsys):
    @reports_errors
    def main(argv: list[str] | None = None) -> None:
        raise SetupError("cannot reach Redis at 127.0.0.1:9")

    with pytest.raises(SystemExit) as out:
        main([])
    assert out.value.code == 2 and capsys.readouterr().err == "error: cannot reach Redis at 127.0.0.1:9\n"

    @reports_errors
    def buggy(argv: list[str] | None = None) -> None:
        raise KeyError("x")  # a bug is not the user's to fix: it keeps its traceback

    with pytest.raises(KeyError):
        buggy([])


def test_an_items_verdict_from_its_forwards():
    """The model always says the first letter: one of four cyclic orders shows the gold option there."""
    top = [(" A", -0.1), (" B", -3.0), (" C", -4.0), (" D", -5.0)]
    orders = P.orders(1, "x", 4)
    fws = [P.judge_forward(top, 4, o.index(0)) for o in orders]  # the gold is option 0
    v = P.judge_item(1, orders, fws)
    assert (v.n_perm, v.n_hits, v.removed) == (4, 1, False)
    assert v.pred == "ABCD"[orders[0][0]] and v.margin == pytest.approx(sum(f.margin for f in fws) / 4)
    always_right = [P.judge_forward(top, 4, 0) for _ in orders]
    assert P.judge_item(1, orders, always_right).removed  # 4/4 with a margin above ln 2


def test_real_like_synthetic_frames_pass_the_encoder_untouched(tmp_path):
    """What `throughput.py --real-frames` measures: frames like the real pool's, which the workers send as
    they are (no decode-and-re-encode CPU)."""
    root = tmp_path / "pool"
    cfg = SynthConfig(n_items=6, n_videos=3, frames=(2, 3), k_fraction=0.0, missing_fraction=0.0,
                      frame_formats=(("jpeg448", 1.0),))  # fmt: skip
    generate(root, cfg)
    frames = [p for p in (root / "frames" / "pool_frames").rglob("*") if p.suffix in (".jpg", ".png")]
    assert frames and all(p.suffix == ".jpg" and prepare_jpeg(p) == p.read_bytes() for p in frames)


def test_a_launcher_says_each_hold_line_once_in_order_even_those_said_between_two_looks(redis_url):
    """Through a real Redis: the lines a worker's presence carries are said once each, those of a hold that
    began and ended between two looks too, and a worker that exits while held is said to have done so."""
    conn, heard = Redis.from_url(redis_url), []
    news = HoldNews(conn, heard.append)
    lines: list[str] = []

    def worker_says(*said: str, held: str | None) -> None:
        lines.extend(said)
        publish(conn, WorkerSnapshot(name="w.host.1", screen="s", server="http://x", steps=[1],
                                     host=socket.gethostname(), pid=os.getpid(), max_inflight=1, inflight=0,
                                     active_jobs=0, items=0, forwards=0, errors=0, removed=0, retries=0,
                                     items_per_s=0, forwards_per_s=0, outage_s=0, server_up=True, held=held,
                                     hold_lines=lines[-8:], hold_said=len(lines), started_at=time.time(),
                                     updated_at=time.time()))  # fmt: skip

    worker_says(held=None)
    news.look([os.getpid()])
    worker_says("disk full: held", held="disk full")
    news.look([os.getpid()])
    news.look([os.getpid()])  # nothing new: nothing said again
    worker_says("disk back: taking work again", "server silent: held", "server back: taking work again", held=None)
    news.look([os.getpid()])
    worker_says("disk full: held", held="disk full")
    news.look([os.getpid()])
    news.look([])  # the worker process is gone
    assert heard == [
        "w.host.1: disk full: held",
        "w.host.1: disk back: taking work again",
        "w.host.1: server silent: held",
        "w.host.1: server back: taking work again",
        "w.host.1: disk full: held",
        "w.host.1: exited; it was held when last seen (disk full)",
    ]


def test_a_steps_busy_time_reads_below_a_minute_in_tenths_of_a_second():
    assert [busy_time(s) for s in (0.0, 0.84, 59.94, 60.0, 125.0)] == ["0.0 s", "0.8 s", "59.9 s", "1m 00s", "2m 05s"]
    assert [duration(s) for s in (0.84, 125.0)] == ["0m 00s", "2m 05s"]  # a status line keeps its own form
