"""The console scripts as a user runs them."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from redis import Redis
from reference import expected
from test_readme import fenced_lines

from pool_queue.inputs.items import load_items
from pool_queue.jobs.queue import screen_of
from pool_queue.observe.report import all_steps, by_benchmark, step_report
from pool_queue.proc.procs import free_port, wait_health
from pool_queue.proc.progress import busy_time
from pool_queue.protocol import Protocol
from pool_queue.rows import ROW_SCHEMA
from pool_queue.settings import load_settings
from pool_queue.store import export as store_export
from pool_queue.store.store import Store

SCRIPTS = [
    "pool-synth",
    "pool-items",
    "pool-frames",
    "pool-sim",
    "pool-enqueue",
    "pool-worker",
    "pool-export",
    "pool-demo",
    "pool-status",
    "pool-report",
    "pool-audit",
]


@pytest.mark.parametrize("script", SCRIPTS)
@pytest.mark.slow
def test_every_command_has_help(script):
    bindir = Path(sys.executable).parent
    out = subprocess.run([str(bindir / script), "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "usage:" in out.stdout


def test_settings_env_flags_and_secrets(monkeypatch, tmp_path):
    monkeypatch.setenv("NGPU", "3")
    monkeypatch.setenv("MAX_SEQS", "32")
    monkeypatch.setenv("POOL_SERVERS", "http://a:8001/, http://b:8002")
    monkeypatch.setenv("VLLM_API_KEY", "sk-very-secret")
    monkeypatch.setenv("REDIS_PASSWORD", "hunter2")
    settings = load_settings(root=tmp_path, max_seqs=None)
    assert settings.ngpu == 3 and settings.max_seqs == 32 and settings.gpu_util == 0.85 and settings.port0 == 8001
    assert settings.servers == ["http://a:8001", "http://b:8002"]
    assert settings.results_dir == tmp_path / "results" / "pool"
    assert settings.frames_dir == tmp_path / "frames" / "pool_frames"
    assert load_settings(max_seqs=16).max_seqs == 16  # a flag beats the environment
    text = repr(settings) + str(settings.model_dump())
    assert "sk-very-secret" not in text and "hunter2" not in text
    assert settings.redis_kwargs() == {"password": "hunter2"}


def test_a_root_decides_its_store_unless_the_results_are_named_as_explicitly(monkeypatch, tmp_path):
    """A flag beats the environment beats the `.env` file; a results folder named less explicitly than the
    root does not follow it to another root."""
    a, b = tmp_path / "a", tmp_path / "b"
    (tmp_path / "demo.env").write_text(f"POOL_ROOT={a}\nPOOL_RESULTS={a}/results/pool\n")
    monkeypatch.setenv("POOL_ENV_FILE", str(tmp_path / "demo.env"))
    assert load_settings().results_dir == a / "results" / "pool"  # the .env alone
    assert load_settings(root=b).results_dir == b / "results" / "pool"
    monkeypatch.setenv("POOL_ROOT", str(b))
    assert load_settings().results_dir == b / "results" / "pool"  # the environment over the .env
    monkeypatch.setenv("POOL_RESULTS", str(tmp_path / "mine"))
    assert load_settings().results_dir == tmp_path / "mine"  # both from the environment
    assert load_settings(root=a).results_dir == a / "results" / "pool"
    assert load_settings(root=a, results=tmp_path / "x").results_dir == tmp_path / "x"  # both flags


@pytest.mark.slow
def test_demo_runs_the_whole_screen(tmp_path, monkeypatch):
    """As a new user: the demo says where its Redis is and which commands work; afterwards the bare
    commands in that folder that read the results find the demo; its items/s are the report's."""
    bindir = Path(sys.executable).parent
    env = {k: v for k, v in os.environ.items() if k != "POOL_ENV_FILE"}  # read the .env the demo writes
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep) if Path(p) != bindir)  # not activated

    def run(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(bindir / argv[0]), *argv[1:]], capture_output=True, text=True, timeout=timeout,
                              cwd=tmp_path, env=env)  # fmt: skip

    out = run("pool-demo", "--root", "demo", "--items", "150", "--videos", "30", "--speed", "20", timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "demo screen of 150 items" in out.stdout and "REMAINING_TOTAL=150" in out.stdout
    assert "demo Redis: redis://127.0.0.1:" in out.stdout and "rq info -u redis://127.0.0.1:" in out.stdout
    env_file = tmp_path.resolve() / ".env"
    assert f"wrote {env_file}, outside the demo root demo: bare pool-* commands in this folder reach" in out.stdout
    bare = "survivors of step 1 have no frames: not screened in steps 2-3 here"  # 150 items, some of k: videos
    made = (tmp_path / "demo" / "results" / "report" / "report.md").read_text()  # before pool-report below
    assert bare in " ".join(out.stdout.split("demo screen of", 1)[1].split()) and bare in made
    # the README's lines after a demo, as written, in a fresh shell after the README's setup: bare commands
    # find the demo; and the lines the demo printed work as printed, without that setup
    fresh = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    for line in fenced_lines("afterwards the bare commands that read the results find the demo"):
        done = subprocess.run(["bash", "-c", f"source {bindir}/activate && {line}"], capture_output=True, text=True,
                              timeout=120, cwd=tmp_path, env=fresh)  # fmt: skip
        assert done.returncode == 0, (line, done.stderr[-2000:])
    printed = out.stdout.split("(stopped with the demo)", 1)[1].splitlines()
    printed = [line.strip() for line in printed if line.startswith("  ")]
    assert len(printed) == 3 and all(line.startswith(str(bindir)) for line in printed), printed
    for line in printed:
        done = subprocess.run(["bash", "-c", line], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                              env=fresh)  # fmt: skip
        assert done.returncode == 0, (line, done.stderr[-2000:])
    # another root in the folder that holds the demo's .env: its own store, never the demo's
    assert "POOL_RESULTS" not in (tmp_path / ".env").read_text()
    assert run("pool-synth", "fresh", "--items", "40", "--videos", "10").returncode == 0
    plan = run("pool-enqueue", "--root", "fresh", "--step", "1", "--plan-only")
    assert plan.returncode == 0 and "REMAINING_TOTAL=40" in plan.stdout, plan.stdout + plan.stderr
    audit = run("pool-audit", "--root", "fresh")
    assert audit.returncode == 0 and "PROBLEM" not in audit.stdout, audit.stdout + audit.stderr
    # its Redis is gone: the queue columns are unknown, the rows are not
    status = run("pool-status")
    assert status.returncode == 0, status.stderr
    assert "STEP=1 REMAINING_TOTAL=0" in status.stdout and "Redis unreachable" in status.stdout
    # a launch here would wait for the demo's Redis: it says at once where the URL came from, and waits not
    launch = subprocess.run([str(bindir / "pool-launch"), "--sim", "--burst"], capture_output=True, text=True,
                            timeout=120, cwd=tmp_path, env={**env, "PORT0": str(free_port())})  # fmt: skip
    gone = f"(REDIS_URL from {env_file}, written by pool-demo for a demo that is not running) unreachable"
    assert launch.returncode == 2 and gone in launch.stderr and launch.stderr.count("\n") == 1, launch.stderr
    export = run("pool-export", "--out", "export")
    assert export.returncode == 0, export.stderr
    lines = (tmp_path / "export" / "results" / "pool" / "step1" / "step1.jsonl").read_text().splitlines()
    assert len(lines) == 150 and "export/parquet/step3.parquet" in export.stdout
    query = export.stdout.split("all steps as one table: ", 1)[1].splitlines()[0]  # works as printed, in a new shell
    done = subprocess.run(["bash", "-c", query], capture_output=True, text=True, timeout=120, cwd=tmp_path, env=fresh)
    assert done.returncode == 0 and "item_id" in done.stdout, (query, done.stderr[-2000:])
    _export_reads_as_one_table(tmp_path / "demo", tmp_path / "export")
    assert "replacing" not in export.stdout  # a first export replaces nothing
    again = run("pool-export", "--out", "export")  # the same store again: each step says what it replaced
    n1 = len(lines)
    assert again.returncode == 0 and f"step 1: {n1:,} rows (replacing an earlier export's {n1:,}) -> " in again.stdout
    assert not list((tmp_path / "export").rglob(".*.part"))  # written aside, then renamed over the old files
    # streamed BATCH rows at a time, whatever the pool's size: a few rows a batch give the same export
    monkeypatch.setattr(store_export, "BATCH", 7)
    store_export.export(Store(tmp_path / "demo" / "results" / "pool", Protocol().fingerprint), [1, 2, 3],
                          tmp_path / "export7")  # fmt: skip
    for step in (1, 2, 3):
        rel = Path("results", "pool", f"step{step}", f"step{step}.jsonl")
        whole = (tmp_path / "export" / rel).read_text().splitlines()
        assert sorted((tmp_path / "export7" / rel).read_text().splitlines()) == sorted(whole)
        parts = pq.ParquetFile(tmp_path / "export7" / "parquet" / f"step{step}.parquet")
        assert parts.metadata.num_rows == len(whole) and parts.num_row_groups == -(-len(whole) // 7)
    # the demo ends with an audit and a report of the finished screen, with the same items/s
    assert "audit: " in out.stdout and ": OK," in out.stdout
    report = (tmp_path / "demo" / "results" / "report" / "report.md").read_text()
    assert "| 1 | 150 |" in report and (tmp_path / "demo" / "results" / "report" / "margins.png").stat().st_size > 5000
    rep = step_report(1, Store(tmp_path / "demo" / "results" / "pool", Protocol().fingerprint), load_items(
        tmp_path / "demo" / "items"))  # fmt: skip
    rate, summary = f"{rep.rows.num_rows / rep.wall_s:.1f}", out.stdout.split("demo screen of", 1)[1]
    assert f"| {rate} |" in report and f" {rate} " in summary
    assert f"| {busy_time(rep.wall_s)} |" in report and f" {busy_time(rep.wall_s)} " in summary  # one format


@pytest.mark.slow
def test_ctrl_c_during_step_3_then_the_demo_again_ends_with_every_step_complete(tmp_path):
    """Ctrl-C stops everything cleanly; `pool-demo` again resumes (its Redis kept an append-only file, and
    every step with work is enqueued) and ends with every step complete and the reference's verdicts."""
    bindir = Path(sys.executable).parent
    env = {k: v for k, v in os.environ.items() if k != "POOL_ENV_FILE"}
    argv = [str(bindir / "pool-demo"), "--root", "demo", "--items", "1500", "--videos", "150"]
    # at --speed 1 a wave of step-3 requests holds the 2B for ~17 s, and the ~480 step-3 items are more than
    # the 2B worker takes at once: Ctrl-C as its first step-3 job runs leaves step-3 work in Redis
    slow = [*argv, "--speed", "1"]
    errors = (tmp_path / "demo.err").open("w+")  # a file, not a pipe: the progress bars never block the demo
    with subprocess.Popen(slow, cwd=tmp_path, stdout=subprocess.PIPE, stderr=errors, text=True, env=env) as p:
        assert p.stdout is not None
        line = ""
        while not line.startswith("demo Redis: "):  # "demo Redis: redis://127.0.0.1:PORT/0"
            line = p.stdout.readline()
            assert line, p.communicate()
        demo_redis = Redis.from_url(line.split()[-1])
        while not any(demo_redis.zcard(k) for k in demo_redis.scan_iter("rq:wip:pool-*-step3")):  # step 3 runs
            assert p.poll() is None, p.communicate()
            time.sleep(0.1)
        p.send_signal(signal.SIGINT)
        rest, _ = p.communicate(timeout=300)
    err = (tmp_path / "demo.err").read_text()
    assert p.returncode == 130 and "Traceback" not in err and "interrupted" in rest, err[-2000:]
    logs = sorted((tmp_path / "demo" / "logs" / "demo").glob("worker-*.log"))
    assert len(logs) == 3
    for log in logs:  # each worker stopped while its server and Redis were still up
        text = log.read_text()
        assert "Traceback" not in text and "ConnectionError" not in text, text[-2000:]
    root = tmp_path / "demo"
    want = expected(root)
    store = Store(root / "results" / "pool", Protocol().fingerprint)
    assert sum(store.winners(s).num_rows for s in want) < sum(map(len, want.values()))  # stopped mid-screen
    refused = subprocess.run([*argv[:3], "--items", "100"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
    assert "already holds 1500 items and 150 videos: --items applies to a new pool" in refused.stderr, refused.stderr
    again = subprocess.run([*argv, "--speed", "8"], cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env)
    assert again.returncode == 0, again.stderr[-3000:]
    assert ": OK," in again.stdout, again.stdout[-3000:]
    for step, items in want.items():
        got = {r["item_id"]: r for r in store.read_rows(step, store.winners(step))}
        assert {k: (r["status"], r["removed"]) for k, r in got.items()} == {k: ("ok", v[0]) for k, v in items.items()}
    status = subprocess.run([str(bindir / "pool-status")], cwd=tmp_path, capture_output=True, text=True, env=env)
    assert all(f"STEP={s} REMAINING_TOTAL=0" in status.stdout for s in (1, 2, 3)), status.stdout


@pytest.mark.slow
def test_one_demo_per_root_and_after_fresh_the_fresh_run_is_the_one_resumed(tmp_path):
    """A second `pool-demo` on a root is refused in one line naming the running one. `--fresh` moves the older
    results, report and queue aside (said in one line); the next `pool-demo` resumes the fresh run, on a queue
    that holds none of the older run's jobs, and reports it."""
    bindir = Path(sys.executable).parent
    argv = [str(bindir / "pool-demo"), "--root", "demo", "--items", "150", "--videos", "30"]
    root, err = tmp_path / "demo", (tmp_path / "demo.err").open("w+")

    def started(p: subprocess.Popen[str]) -> tuple[Redis, list[str]]:
        """The demo's Redis once its queues are filled, and the lines printed until then."""
        assert p.stdout is not None
        lines = [p.stdout.readline()]
        while not lines[-1].startswith("demo Redis: "):
            assert lines[-1], p.communicate()
            lines.append(p.stdout.readline())
        conn = Redis.from_url(lines[-1].split()[-1])
        while not list(conn.scan_iter("rq:queue:pool-*")):
            assert p.poll() is None, p.communicate()
            time.sleep(0.1)
        return conn, lines

    def token() -> str | None:
        return Store(root / "results" / "pool", Protocol().fingerprint).screen_token()

    with subprocess.Popen([*argv, "--speed", "1"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=err, text=True) as p:
        started(p)
        second = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=120)
        p.send_signal(signal.SIGINT)
        p.communicate(timeout=300)
    assert second.returncode == 2 and second.stderr.count("\n") == 1, second.stderr
    assert second.stderr.startswith(f"error: pool-demo is already running on this host for root demo: pid {p.pid} (")
    older = token()
    with subprocess.Popen([*argv, "--fresh", "--speed", "1"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=err,
                          text=True) as p:  # fmt: skip
        _, lines = started(p)
        p.send_signal(signal.SIGINT)
        p.communicate(timeout=300)
    (moved,) = [line for line in lines if line.startswith("--fresh: the older results moved to ")]
    aside = tmp_path / moved.split(" moved to ", 1)[1].split(" (")[0]
    assert aside.parent == root / "results" and Store(aside, Protocol().fingerprint).screen_token() == older
    fresh = token()
    assert fresh not in (None, older)
    with subprocess.Popen([*argv, "--speed", "20"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=err, text=True) as p:
        conn, _ = started(p)
        queues = {k.decode() for k in conn.scan_iter("rq:queue:pool-*")}
        out, _ = p.communicate(timeout=600)
    assert p.returncode == 0, (tmp_path / "demo.err").read_text()[-3000:]
    screen = screen_of(Store(root / "results" / "pool", Protocol().fingerprint), conn)
    assert screen is not None
    mine = screen.queue_name(1).rsplit("-step", 1)[0]
    assert {q.removeprefix("rq:queue:").rsplit("-step", 1)[0] for q in queues} == {mine}, queues  # no older job
    assert token() == fresh and f"rows in {Path('demo', 'results', 'pool')}" in out


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("localhost:6379", "is not a Redis URL"),
        ("http://127.0.0.1:6379/0", "is not a Redis URL"),
        ("redis://127.0.0.1:99999/0", "bad port"),
        ("redis://127.0.0.1:6379/abc", "must be a number"),
        ("redis://:hunter2@127.0.0.1:6379/abc", "'redis://:***@127.0.0.1:6379/abc': the database"),
        ("redis://u:hunter2@127.0.0.1:99999/0", "'redis://u:***@127.0.0.1:99999/0': bad port"),
        ("redis://:hunter2@127.0.0.1:6379/0?foo=bar", "unexpected keyword argument 'foo'"),
    ],
)
@pytest.mark.slow
def test_a_malformed_redis_url_is_one_line_and_exit_2(tmp_path, url, says):
    """One line, naming the setting as its user gave it: the flag, or the variable that was set; a password in
    the URL is masked, never printed."""
    status = [str(Path(sys.executable).parent / "pool-status"), "--root", str(tmp_path)]
    out = subprocess.run([*status, "--redis-url", url], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and says in out.stderr and out.stderr.count("\n") == 1, out.stderr
    assert out.stderr.startswith("error: setting --redis-url: "), out.stderr
    for var in ("REDIS_URL", "POOL_REDIS_URL"):
        out = subprocess.run(status, capture_output=True, text=True, timeout=60, env={**os.environ, var: url})
        shown = url.replace("hunter2", "***")
        assert out.returncode == 2 and out.stderr.startswith(f"error: setting {var}: {shown!r}"), out.stderr
        assert "hunter2" not in out.stderr + out.stdout


@pytest.mark.slow
def test_a_root_that_does_not_exist_is_refused_and_nothing_is_written(tmp_path):
    bin_ = Path(sys.executable).parent
    missing = tmp_path / "nope"
    w = subprocess.run([str(bin_ / "pool-worker"), "--root", str(missing), "--server", "http://127.0.0.1:9"],
                       capture_output=True, text=True, timeout=60)  # fmt: skip
    x = subprocess.run([str(bin_ / "pool-export"), "--root", str(missing), "--out", str(tmp_path / "out")],
                       capture_output=True, text=True, timeout=60)  # fmt: skip
    assert x.returncode == 2 and "nothing to export" in x.stderr and not (tmp_path / "out").exists(), x.stderr
    assert w.returncode != 0 and not missing.exists(), w.stderr[-500:]


def test_a_mistyped_results_folder_is_refused_by_every_command_that_reads_one_and_the_report_stays(pool_root):
    """A --results that names no screen is one line and exit 2 for each reader, before anything is written:
    pool-report would replace the real report with an empty one, pool-status would show every item left."""
    bin_, env = Path(sys.executable).parent, {**os.environ, "POOL_ENV_FILE": ""}
    Store(pool_root / "results" / "pool", Protocol().fingerprint).claim()  # a real (empty) screen
    ok = subprocess.run([str(bin_ / "pool-report"), "--root", str(pool_root)], capture_output=True, text=True,
                        timeout=120, env=env)  # fmt: skip
    report = pool_root / "results" / "report" / "report.md"
    assert ok.returncode == 0 and report.is_file(), ok.stderr
    before = report.read_bytes()
    typo = pool_root / "results" / "pol"
    for cmd, doing in (("pool-report", "report"), ("pool-status", "show"), ("pool-export", "export")):
        extra = ["--out", str(pool_root.parent / "out")] if cmd == "pool-export" else []
        out = subprocess.run([str(bin_ / cmd), "--root", str(pool_root), "--results", str(typo), *extra],
                             capture_output=True, text=True, timeout=120, env=env)  # fmt: skip
        said = f"error: nothing to {doing}: results folder {typo} (--results) does not exist (check --root / --results)"
        assert (out.returncode, out.stderr.strip(), out.stdout) == (2, said, ""), (cmd, out.stderr)
    assert report.read_bytes() == before and not typo.exists() and not (pool_root.parent / "out").exists()


def test_an_export_that_would_land_among_the_stores_rows_is_refused(pool_root):
    """`--out` the package root (its results/pool is the store's own folder) or the results root itself: the
    store would read the export's files as segments, each item twice. A folder beside them is fine."""
    bin_, env = Path(sys.executable).parent, {**os.environ, "POOL_ENV_FILE": ""}
    results = pool_root / "results" / "pool"
    Store(results, Protocol().fingerprint).claim()
    before = sorted(p.relative_to(pool_root) for p in pool_root.rglob("*"))
    for out in (pool_root, results, results / "x"):
        x = subprocess.run([str(bin_ / "pool-export"), "--root", str(pool_root), "--out", str(out)],
                           capture_output=True, text=True, timeout=120, env=env)  # fmt: skip
        assert x.returncode == 2 and x.stderr.count("\n") == 1, x.stderr
        assert f"would write the export among the rows of the results root {results}" in x.stderr, x.stderr
    assert sorted(p.relative_to(pool_root) for p in pool_root.rglob("*")) == before
    beside = subprocess.run([str(bin_ / "pool-export"), "--root", str(pool_root), "--out", str(pool_root / "export")],
                            capture_output=True, text=True, timeout=120, env=env)  # fmt: skip
    assert beside.returncode == 0 and (pool_root / "export" / "parquet" / "step1.parquet").is_file(), beside.stderr


def _export_reads_as_one_table(root: Path, out: Path) -> None:
    """Every step's Parquet file has the one schema: duckdb, pyarrow and pandas read them together, and
    a per-benchmark removal query gives the report's numbers."""  # (pandas reads what pyarrow reads)
    files = sorted((out / "parquet").glob("step*.parquet"))
    assert [pq.read_schema(f) for f in files] == [ROW_SCHEMA] * 3
    both = pa.concat_tables(pq.read_table(f) for f in files)
    assert both.num_rows == sum(len(f.read_text().splitlines()) for f in out.rglob("step*.jsonl"))
    assert ds.dataset(str(out / "parquet"), format="parquet").count_rows() == both.num_rows  # the folder: one dataset
    assert len(pd.read_parquet(out / "parquet")) == both.num_rows
    glob = f"{out}/parquet/*.parquet"
    cli = subprocess.run(
        [str(Path(sys.executable).parent / "duckdb"), "-csv", "-c", f"select count(*) from '{glob}'"],
        capture_output=True,
        text=True,
        timeout=120,
    )  # the README's duckdb line, as make installs it
    assert cli.returncode == 0 and cli.stdout.split()[-1] == str(both.num_rows), cli.stderr
    query = "select step, benchmark, count(*), sum(removed::int) from '{}' where status = 'ok' "
    query += "group by all order by 1, 2"
    got = duckdb.sql(query.format(glob)).fetchall()
    protocol = Protocol()
    reps = all_steps(Store(root / "results" / "pool", protocol.fingerprint), load_items(root / "items"), protocol)
    assert got == sorted((s, b, n, r) for s, rep in reps.items() for b, n, r, _ in by_benchmark(rep))
    (first,) = duckdb.sql(f"select forwards[1].top[1].token, forwards[1].logprobs, frame_indices from '{glob}' "
                          "where step = 3 limit 1").fetchall()  # fmt: skip
    assert isinstance(first[0], str) and all(isinstance(i, int) for i in first[2]) and set(first[1]) <= set("ABCDEFGH")


def _worker(root: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    argv = [str(Path(sys.executable).parent / "pool-worker"), "--root", str(root), *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)


def _one_error_line(out: subprocess.CompletedProcess[str]) -> str:
    """Exit 2, no traceback, and the last line says what went wrong."""
    assert out.returncode == 2 and "Traceback" not in out.stderr and "Unclosed" not in out.stderr, out.stderr
    return out.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize("url", ["127.0.0.1:8001", "ftp://127.0.0.1:8001", "http://127.0.0.1:99999", "http://:8001"])
@pytest.mark.slow
def test_a_server_url_that_cannot_be_right_fails_at_once(pool_root, url):
    out = _worker(pool_root, "--server", url)
    assert "--server" in _one_error_line(out) and url in out.stderr


@pytest.mark.slow
def test_a_server_that_never_answers_is_waited_for_then_named(pool_root):
    port = free_port()
    out = _worker(pool_root, "--server", f"http://127.0.0.1:{port}", "--burst", "--wait-server", "2")
    line = _one_error_line(out)  # the bound it waited is in its line; _worker's timeout only ends a hang
    assert f"http://127.0.0.1:{port}" in line and "within 2 s" in line, line
    assert "waiting up to 2 s for the vLLM server" in out.stderr  # one progress line, not one per probe
    assert not (pool_root / "results" / "pool" / "PROTOCOL.json").exists()  # nothing written


@pytest.mark.slow
def test_burst_caps_the_server_wait_at_30_s(pool_root):
    argv = [str(Path(sys.executable).parent / "pool-worker"), "--root", str(pool_root), "--burst",
            "--server", f"http://127.0.0.1:{free_port()}"]  # fmt: skip
    with subprocess.Popen(argv, stderr=subprocess.PIPE, text=True) as p:
        assert p.stderr is not None
        first = p.stderr.readline()
        p.terminate()
    assert "waiting up to 30 s for the vLLM server" in first, first


@pytest.mark.slow
def test_a_burst_worker_with_nothing_queued_says_so(procs, pool_root, tmp_path):
    redis = procs.redis(free_port(), tmp_path / "redis")
    sim = procs.sim("sim", free_port(), "--profile", "qwen3-vl-8b", "--zero-latency")
    wait_health(sim, 30)
    out = _worker(pool_root, "--server", sim, "--steps", "1,2", "--burst", "--redis-url", redis)
    assert out.returncode == 0, out.stderr
    assert "burst: nothing queued for step(s) 1,2 (pool-enqueue --step N puts work there); exiting" in out.stderr


@pytest.mark.slow
def test_a_redis_port_given_as_the_server_fails_at_once(procs, pool_root, tmp_path):
    port = free_port()
    procs.redis(port, tmp_path / "redis")
    out = _worker(pool_root, "--server", f"http://127.0.0.1:{port}", "--wait-server", "600")
    assert "does not answer HTTP" in _one_error_line(out)


@pytest.mark.slow
def test_redis_down_at_start_is_waited_for_then_named(procs, pool_root, tmp_path):
    url = procs.sim("sim", free_port(), "--profile", "qwen3-vl-8b")
    wait_health(url, 20)
    redis = f"redis://127.0.0.1:{free_port()}/0"
    out = _worker(pool_root, "--server", url, "--burst", "--wait-redis", "2", "--redis-url", redis)
    line = _one_error_line(out)
    assert "127.0.0.1" in line and "did not answer for 2 s" in line and "--wait-redis" in line, line


@pytest.mark.slow
def test_commands_run_from_inside_the_package_root_find_it(pool_root):
    """One rule everywhere (run_remote.sh is run from inside the root): the current folder when it holds
    items/, else ./pool."""
    env = {**os.environ, "POOL_ROOT": ""}
    env.pop("POOL_ROOT")
    plan = subprocess.run([str(Path(sys.executable).parent / "pool-enqueue"), "--step", "1", "--plan-only"],
                          capture_output=True, text=True, timeout=60, cwd=pool_root, env=env)  # fmt: skip
    assert plan.returncode == 0 and "REMAINING_TOTAL=240" in plan.stdout, plan.stderr
    assert load_settings().root == Path("pool")  # here (the checkout) there is no items/


@pytest.mark.slow
def test_rq_info_reaches_the_pools_redis_as_the_pool_commands_do(procs, tmp_path):
    """`rq info -c pool_queue.rq_config` in a new shell: the URL and password from the environment, else from
    `.env` (which rq itself never reads); the password never on a command line; a bad URL is one line naming the
    variable as the `.env` file spells it."""
    from rq import Queue

    port = free_port()
    procs.redis(port, tmp_path / "redis", password="s3cret")
    url = f"redis://127.0.0.1:{port}/0"
    Queue("pool-q-step1", connection=Redis.from_url(url, password="s3cret")).enqueue("builtins.print", "x")
    clean = {k: v for k, v in os.environ.items() if k not in ("POOL_ENV_FILE", "REDIS_URL", "REDIS_PASSWORD")}
    rq = [str(Path(sys.executable).parent / "rq"), "info", "-c", "pool_queue.rq_config"]
    for env, dotenv in (({"REDIS_URL": url, "REDIS_PASSWORD": "s3cret"}, ""),
                        ({}, f"REDIS_URL={url}\nREDIS_PASSWORD=s3cret\n")):  # fmt: skip
        (tmp_path / ".env").write_text(dotenv)
        out = subprocess.run(rq, env={**clean, **env}, cwd=tmp_path, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and "pool-q-step1" in out.stdout and "1 queues" in out.stdout, out.stderr
    (tmp_path / ".env").write_text("REDIS_URL=127.0.0.1:6391\n")
    out = subprocess.run(rq, env=clean, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and out.stderr.strip().splitlines() == [
        f"error: setting REDIS_URL from {tmp_path / '.env'}: '127.0.0.1:6391' is not a Redis URL: write "
        "redis://HOST:PORT/DB (password in REDIS_PASSWORD)"
    ], out.stderr
    gone = f"redis://127.0.0.1:{free_port()}/0"  # a .env a stopped demo left: its Redis went with it
    (tmp_path / ".env").write_text(f"REDIS_URL={gone}\n")
    out = subprocess.run(rq, env=clean, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    (line,) = out.stderr.strip().splitlines()
    assert out.returncode == 2 and gone in line and f"REDIS_URL from {tmp_path / '.env'}" in line, out.stderr
