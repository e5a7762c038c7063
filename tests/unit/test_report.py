"""Report flags and the audit on crafted stores; status, metrics, report and audit on a half-finished real run."""

import signal
import time

import httpx
import orjson
import pytest
from craft import P, items_of, row, valid_store, write
from redis import Redis

from pool_queue.inputs.items import load_items
from pool_queue.observe.audit import run_audit
from pool_queue.observe.markdown import PLOTS, write_report
from pool_queue.observe.report import all_steps, chance_floor, flags
from pool_queue.observe.status import StatusReader
from pool_queue.proc.procs import free_port
from pool_queue.store.store import Store


def _store(root):
    return Store(root / "results" / "pool", P.fingerprint)


def _audit(root, **kw):
    return run_audit(
        root / "results" / "pool", P, load_items(root / "items"), root / "frames" / "pool_frames", show=False, **kw
    )


def test_sanity_flags_each_trigger(pool_root):
    items = items_of(pool_root)
    rows = []
    for i, it in enumerate(items):
        bench = "AllGone" if i < 40 else "NoneGone" if i < 80 else "Normal"
        rows.append(row(it, 1, removed=bench == "AllGone" or (bench == "Normal" and i % 2 == 0), benchmark=bench))
    rows[100] = row(items[100], 1, n_orders=3, benchmark="Normal")
    rows[101] = row(items[101], 1, status="error", benchmark="Normal")
    write(pool_root, 1, rows)
    got = [f.what for f in flags(all_steps(_store(pool_root), load_items(pool_root / "items"), P), P)]
    assert any("AllGone removes 100.0 %" in f for f in got)
    assert any("NoneGone removes 0.0 %" in f for f in got)
    assert any("1 ok rows without 4 orders" in f for f in got)
    assert any("error rate 0.42 %" in f for f in got)
    assert not any("Normal" in f for f in got)


def test_clean_store_raises_no_flag_and_passes_audit(pool_root):
    valid_store(pool_root)
    assert flags(all_steps(_store(pool_root), load_items(pool_root / "items"), P), P) == []
    audit = _audit(pool_root)
    assert audit.problems == [] and audit.rows > 240
    assert {w.check for w in audit.warnings} == {"incomplete"}  # step 2 only partly done, step 3 not begun
    assert {p.check for p in _audit(pool_root, complete=True).problems} == {"incomplete"}


def test_chance_floor_under_cyclic_orders():
    rows = {n: (best, p) for n, best, p in chance_floor(P, [2, 3, 4, 5])}
    assert rows[4][0] == 1 and rows[5][0] == 1  # gold visits 4 different letters
    assert rows[2][0] == 2 and rows[3][0] == 2  # as evenly as possible: still below 3 of 4
    assert rows[4][1] == pytest.approx(4 * (1 / 4) ** 3 * (3 / 4) + (1 / 4) ** 4)


@pytest.mark.parametrize("corruption", ["duplicate", "fingerprint", "chain", "torn", "garbage", "orders"])
def test_audit_catches_each_corruption(pool_root, corruption):
    items, alive = valid_store(pool_root)
    removed_item = items[0]  # removed at step 1
    if corruption == "duplicate":
        write(pool_root, 1, [row(items[1], 1, removed=True)], name="again")  # step 1 said kept, now removed
        want = "duplicate winners"
    elif corruption == "fingerprint":
        write(pool_root, 1, [row(items[3], 1, fingerprint="v1-0000000000000000")], name="other")
        want = "protocol"
    elif corruption == "chain":
        write(pool_root, 2, [row(removed_item, 2)], name="stray")
        want = "chain"
    elif corruption == "torn":
        seg = write(pool_root, 3, [row(alive[0], 3)], name="torn")
        seg.write_bytes(seg.read_bytes()[:-40])
        want = "torn line"
    elif corruption == "garbage":
        seg = write(pool_root, 1, [row(items[5], 1), row(items[7], 1)], name="garbage")
        lines = seg.read_bytes().split(b"\n")
        seg.write_bytes(lines[0][:50] + b"\n" + lines[1] + b"\n")
        want = "unparsable row"
    else:
        write(pool_root, 1, [row(items[9], 1, n_orders=2)], name="short")
        want = "step-1 orders"
    audit = _audit(pool_root)
    assert [p.check for p in audit.problems] == [want], audit.problems
    assert audit.problems[0].detail


def test_audit_warns_on_repeated_rows_that_agree(pool_root):
    items, _ = valid_store(pool_root)
    write(pool_root, 1, [row(items[1], 1, t=2000.0)], name="again")
    audit = _audit(pool_root)
    assert audit.problems == []
    assert [w.check for w in audit.warnings if w.check != "incomplete"] == ["repeated rows"]
    assert audit.warnings[0].examples == (items[1]["item_id"],)


@pytest.mark.slow
def test_status_metrics_report_audit_on_a_half_finished_run(stack, pool_root, tmp_path):
    server = stack.sim("sim", "qwen3-vl-8b", "--speed", "0.4")
    stack.enqueue(1, chunk_size=8)
    w = stack.worker("w", server, "--metrics-port", "0", "--inflight", "8")
    items = load_items(pool_root / "items")
    reader = StatusReader(items, stack.store, pool_root / "frames" / "pool_frames", stack.conn, P)
    deadline = time.monotonic() + 60
    while True:
        st = reader.read()
        if st.workers and st.workers[0].items >= 16 and st.steps[0].done >= 16:
            break
        assert time.monotonic() < deadline, stack.log("w")
        time.sleep(0.5)
    live = st.workers[0]
    assert live.server == server and live.health is True and live.server_up and live.steps == [1, 2]
    assert st.steps[0].running_items and st.steps[0].running_jobs
    metrics = httpx.get(live.metrics_url.replace(live.host, "127.0.0.1")).text
    assert 'pool_forwards_total{step="1"}' in metrics and "pool_forward_latency_seconds_bucket" in metrics
    assert "pool_inflight_requests" in metrics
    w.send_signal(signal.SIGTERM)
    assert w.wait(60) == 0, stack.log("w")
    st = reader.read()
    assert st.workers == []  # a stopped worker withdraws its presence
    for step in st.steps:  # with no worker running, every eligible item is done or waits in a job
        assert step.done + step.queued_items == step.eligible, step
        assert step.running_items == 0 and step.workers == 0 and step.eta_s is None, step  # no worker: no countdown
    away = StatusReader(items, stack.store, pool_root / "frames" / "pool_frames", Redis(port=free_port()), P).read()
    assert away.redis_error and [(s.workers, s.eta_s) for s in away.steps] == [(None, None)] * 3  # none known
    s1 = st.steps[0]
    assert s1.remaining == s1.eligible - s1.done  # the first step: nothing can still come
    assert all(s.remaining > s.eligible - s.done for s in st.steps[1:])  # an upper bound while step 1 runs
    assert 0 < s1.done < 240 and s1.items_per_s_1m > 0
    assert orjson.loads(st.model_dump_json())["steps"][0]["eligible"] == 240

    audit = _audit(pool_root)
    assert audit.problems == [] and any(x.check == "incomplete" for x in audit.warnings)
    path = write_report(stack.store, items, P, tmp_path / "report")
    text = path.read_text()
    assert f"| 1 | {s1.done:,} |" in text and "## Sanity flags" in text and "### Chance floor" in text
    for name in PLOTS:
        assert (tmp_path / "report" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_names_holding_pipes_or_line_breaks_stay_in_their_cell():
    from pool_queue.observe.markdown import _table

    name = "Bench|mark\nwith a break\\and a backslash"
    row = _table(["benchmark", "items"], [[name, 3]])[2]
    assert row.count(" | ") == 1 and "\n" not in row  # two cells, one line
    assert row == "| Bench\\|mark with a break\\\\and a backslash | 3 |"
    odd = b"caf\xe9".decode("utf-8", "surrogateescape")
    assert _table(["x"], [[odd]])[2].encode("utf-8") == b"| caf\\\\xe9 |"  # renders as caf\\xe9


def test_a_benchmark_name_holding_pipes_or_line_breaks_keeps_every_part_of_the_report_whole(pool_root):
    """Not one column: every table cell and the sanity flags' lines that name it stay one line each."""
    from pool_queue.observe.markdown import markdown

    odd = "Odd|Bench\nName"
    items = items_of(pool_root)
    write(
        pool_root, 1, [row(it, 1, removed=i < 40, benchmark=odd if i < 40 else "Normal") for i, it in enumerate(items)]
    )
    item_set = load_items(pool_root / "items")
    text = markdown(all_steps(_store(pool_root), item_set, P), item_set, P, pool_root)
    assert "Odd\nName" not in text.replace("\\n", "") and "\nName" not in text  # no line starts inside the name
    flagged = [line for line in text.splitlines() if "Odd" in line and line.startswith("- **")]
    assert flagged and all("Odd\\|Bench Name removes 100.0 %" in line for line in flagged), flagged
    for table in (block for block in text.split("\n\n") if block.startswith("| ")):
        assert len({line.count(" | ") for line in table.splitlines() if not line.startswith("|---")}) == 1, table


def test_a_resumed_gpu_is_one_row_and_its_pause_is_not_wall_time(pool_root):
    """node1's GPU 0 answers 40 items, the screen stops for an hour, and a resume serves the same GPU on
    another port from another worker process; node2's GPU 0 has the same loopback URL as node1's first."""
    items = items_of(pool_root)

    def by(worker, server, its, t0):
        rows = [row(it, 1, t=t0 + i) for i, it in enumerate(its)]  # one item a second, back to back
        return [{**r, "worker": worker, "server": server} for r in rows]

    write(pool_root, 1, by("node1-gpu0.node1.a1b2c3", "http://127.0.0.1:8001", items[:40], 1000.0), name="a")
    write(pool_root, 1, by("node1-gpu0-w1.node1.d4e5f6", "http://127.0.0.1:8011", items[40:80], 4640.0), name="b")
    write(pool_root, 1, by("node2-gpu0.node2.0a0b0c", "http://127.0.0.1:8001", items[80:100], 1000.0), name="c")
    rep = all_steps(_store(pool_root), load_items(pool_root / "items"), P)[1]
    assert rep.per_gpu == [
        ("node1 gpu0", "http://127.0.0.1:8001, http://127.0.0.1:8011", 80, 80.0),
        ("node2 gpu0", "http://127.0.0.1:8001", 20, 20.0),
    ]
    assert rep.wall_s == 80.0  # 1000-1041 and 4640-4680; not the 3,680 s from first start to last finish


def test_a_screen_that_removes_nothing_flags_each_step_once(pool_root):
    """12 benchmarks of 20 items, none removed (dummy weights): one line for the step, the count and the
    most extreme five, not a line per benchmark."""
    items = items_of(pool_root)
    write(pool_root, 1, [row(it, 1, benchmark=f"Bench{i % 12:02d}") for i, it in enumerate(items)])
    (flag,) = flags(all_steps(_store(pool_root), load_items(pool_root / "items"), P), P)
    assert flag.what == "step 1: 12 benchmarks remove <= 1 % of their items"
    shown = ", ".join(f"Bench{i:02d} 0.0 % (0 of 20 items)" for i in range(5))
    assert flag.detail == f"most extreme: {shown}, and 7 more"


def test_survivors_without_frames_are_counted_in_status_and_report(pool_root, redis_url, tmp_path):
    """Step 1's survivors and step 2's eligible items reconcile: those whose video has no frames are
    counted, in pool-status and in the report, by the same line."""
    from redis import Redis
    from rich.console import Console

    from pool_queue.commands.status import render

    items, _ = valid_store(pool_root)
    framed = {p.name for p in (pool_root / "frames" / "pool_frames").iterdir()}
    bare = sum(1 for i, it in enumerate(items) if i % 2 and it["video_id"] not in framed)  # survivors, no frames
    other = sum(1 for i, it in enumerate(items) if i % 2 and it["video_id"] not in framed and
                not it["video_id"].startswith("k:"))  # fmt: skip
    assert bare > other > 0  # both kinds: `k:` videos, and a few folders the snapshot lacks
    note = (f"{bare:,} survivors of step 1 have no frames: not screened in steps 2-3 here ({bare - other} of `k:` "
            f"videos, not downloaded in this snapshot; {other} of other videos, whose folder is missing from "
            "frames/pool_frames)")  # fmt: skip
    item_set, frames = load_items(pool_root / "items"), pool_root / "frames" / "pool_frames"
    reader = StatusReader(item_set, _store(pool_root), frames, Redis.from_url(redis_url), P, probe_health=False)
    st = reader.read()
    assert [s.no_frames for s in st.steps] == [0, bare, 0] and [s.no_frames_other for s in st.steps] == [0, other, 0]
    assert st.steps[1].eligible + bare == sum(1 for i in range(len(items)) if i % 2)  # every survivor accounted
    con = Console(record=True, width=100)
    con.print(render(st))
    assert note in " ".join(con.export_text().split())
    text = write_report(_store(pool_root), item_set, P, tmp_path / "report", frames).read_text()
    assert note in text
