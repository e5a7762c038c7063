"""The benchmark scripts themselves, against simulated servers over loopback (the GPU runs use them)."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from pool_queue.launch.plan import Server, cores_per_server
from pool_queue.launch.vllm import Tuning, server_argv
from pool_queue.proc.procs import Procs, free_port, wait_health
from pool_queue.protocol import Protocol
from pool_queue.settings import load_settings

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"

P = Protocol()


@pytest.fixture(scope="module")
def sims(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """Two 2B simulators, and an 8B one that answers under the 2B's name (other numbers)."""
    with Procs(tmp_path_factory.mktemp("benchlogs")) as procs:
        urls = [procs.sim(f"b{i}", free_port(), "--profile", "qwen3-vl-2b", "--zero-latency") for i in range(2)]
        urls.append(procs.sim("b8", free_port(), "--served-model-name", P.steps[3].served_name, "--zero-latency"))
        for u in urls:
            wait_health(u, 20)
        yield urls


def _run(*argv: str) -> str:
    return subprocess.run([sys.executable, *argv], check=True, capture_output=True, text=True, timeout=300).stdout


@pytest.mark.slow
def test_ceiling_only_run_writes_its_numbers(sims: list[str], tmp_path: Path) -> None:
    out = tmp_path / "t.jsonl"
    _run(str(BENCH / "throughput.py"), "--step", "3", "--server", sims[0], "--items", "0", "--ceiling-items", "6",
         "--skip", "2", "--procs", "2", "--conc", "2", "--root", str(tmp_path / "root"), "--label", "x",
         "--out", str(out))  # fmt: skip
    rec = json.loads(out.read_text())
    assert rec["label"] == "x" and rec["system"] is None and rec["pct_of_ceiling"] is None
    assert rec["ceiling"]["forwards"] == 6 and rec["ceiling"]["errors"] == 0
    assert rec["ceiling"]["tok_s"] > rec["ceiling"]["fwd_s"] > 0


@pytest.mark.slow
def test_system_run_next_to_the_ceiling(sims: list[str], tmp_path: Path) -> None:
    out = tmp_path / "t.jsonl"
    text = _run(str(BENCH / "throughput.py"), "--sim", "--step", "1", "--items", "30", "--ceiling-items", "8",
                "--procs", "1", "--conc", "8", "--workers", "2", "--inflight", "16", "--out", str(out))  # fmt: skip
    rec = json.loads(out.read_text())
    assert rec["system"]["items"] == 30 and rec["system"]["forwards"] == 120 and rec["system"]["errors"] == 0
    assert rec["ceiling"]["forwards"] == 32
    assert rec["pct_of_ceiling"] == pytest.approx(100 * rec["system"]["fwd_s"] / rec["ceiling"]["fwd_s"])
    assert "pool-queue" in text and "plain client" in text


@pytest.mark.slow
def test_same_numbers_tells_equal_servers_from_different_ones(sims: list[str], tmp_path: Path) -> None:
    root = str(tmp_path / "root")
    same = _run(str(BENCH / "same_numbers.py"), "--step", "3", "--a", sims[0], "--b", sims[1], "--n", "4",
                "--skip", "2", "--root", root)  # fmt: skip
    assert same.splitlines()[-1].split()[:4] == ["4", "4", "4", "4"]  # requests, identical, same tokens, same pred
    other = _run(str(BENCH / "same_numbers.py"), "--step", "3", "--a", sims[0], "--b", sims[2], "--n", "4",
                 "--skip", "2", "--root", root)  # fmt: skip
    cells = other.splitlines()[-1].split()
    assert cells[0] == "4" and cells[1] == "0" and float(cells[4]) > 0


@pytest.mark.slow
def test_profile_summary_counts_per_process_and_thread(tmp_path: Path) -> None:
    raw = (
        'process 10:"vllm serve";process 12:"VLLM::EngineCore";thread (12): MainThread;step (core.py:1);'
        "execute (runner.py:2) 30\n"
        'process 10:"vllm serve";process 12:"VLLM::EngineCore";thread (12): MainThread;step (core.py:1) 10\n'
        'process 10:"vllm serve";process 13:"VLLM::APIServer_0";thread (13): MainThread;render (r.py:3) 5\n'
    )
    f = tmp_path / "prof.txt"
    f.write_text(raw)
    text = _run(str(BENCH / "profile_summary.py"), str(f), "--seconds", "1", "--rate", "50")
    rows = [line.split() for line in text.splitlines()]
    assert ["12", "VLLM::EngineCore", "/", "MainThread", "40", "0.8"] in rows  # 40 samples at 50 Hz in 1 s
    assert ["13", "VLLM::APIServer_0", "/", "MainThread", "5", "0.1"] in rows
    assert "## 12 VLLM::EngineCore / MainThread: 40 samples" in text
    # per function: samples on top of the stack, their share, and the share with the function anywhere in it
    assert ["execute", "(runner.py:2)", "30", "75", "75"] in rows and ["step", "(core.py:1)", "10", "25", "100"] in rows


@pytest.mark.slow
def test_serve_prints_the_launchers_argv_with_the_extra_arguments() -> None:
    out = _run(str(BENCH / "serve.py"), "3", "--port", "8123", "--model-path", "/m", "--dry-run", "--",
               "--load-format", "dummy", "--mm-tensor-ipc", "torch_shm")  # fmt: skip
    tuning = Tuning.for_cores(cores_per_server(1))
    want = server_argv(load_settings(), P, Server(0, "0", (3,), 8123), "/m", False, tuning)
    assert shlex.split(out) == ["OMP_NUM_THREADS=1", *want, "--load-format", "dummy", "--mm-tensor-ipc", "torch_shm"]


@pytest.mark.slow
def test_batch_pipe_screens_every_item_both_ways_in_every_cell(tmp_path: Path) -> None:
    """The batches-against-one-request-per-forward table (docs/scale.md): one row per in-flight bound and items
    per video, both shapes screening every item without an error. Its rates are read by people, not here."""
    text = _run(str(BENCH / "batch_pipe.py"), "--inflight", "2,4", "--per-video", "1,3", "--items", "6",
                "--speed", "200", "--root", str(tmp_path))  # fmt: skip
    lines = text.splitlines()
    header = lines[1].split("  ")
    assert [h.strip() for h in header if h.strip()][:6] == ["in flight", "items/video", "items", "screened off",
                                                          "screened batch", "errors"]  # fmt: skip
    rows = [line.split() for line in lines[3:]]
    assert [(r[0], r[1]) for r in rows] == [("2", "1"), ("4", "1"), ("2", "3"), ("4", "3")]
    for r in rows:
        assert r[2] == r[3] == r[4] == "6" and r[5] == "0"  # every item screened, both ways, no error row
        assert len(r) == 11 and float(r[6]) > 0 and float(r[7]) > 0


GPU_SCRIPTS = sorted(BENCH.glob("*.sh"))


@pytest.mark.parametrize("script", GPU_SCRIPTS, ids=[p.name for p in GPU_SCRIPTS])
def test_gpu_script_parses_and_says_how_to_run_it(script: Path, tmp_path: Path) -> None:
    """The GPU-only scripts cannot run here: each parses, `--help` prints its header (how to run it from the
    project root on the lent GPU machine), and a word it does not know is exit 2 with nothing written."""
    root = BENCH.parent
    subprocess.run(["bash", "-n", str(script)], check=True, timeout=30)
    env = {"PATH": "/usr/bin:/bin", "WORK": str(tmp_path / "work"), "POOL_ROOT": str(tmp_path / "pool")}
    shown = subprocess.run(["bash", str(script), "--help"], cwd=root, env=env, capture_output=True, text=True,
                           timeout=30)  # fmt: skip
    assert shown.returncode == 0 and f"bash benchmarks/{script.name} " in shown.stdout
    assert not shown.stdout.startswith("#") and "set -" not in shown.stdout  # the comment's text only
    bad = subprocess.run(["bash", str(script), "no-such-word"], cwd=root, env=env, capture_output=True, text=True,
                         timeout=30)  # fmt: skip
    assert bad.returncode == 2 and bad.stderr.strip()
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["run", "3k", "off"], "N (items)"),
        (["variant", "auto64"], "NAME FROM"),
        (["variant", "auto64", "auto"], "no run auto"),
        (["pair", "two"], "NAME FROM"),
        (["pair", "two", "auto"], "no run auto"),
        (["wrap", "kv"], "NAME ARG"),
    ],
)
def test_gpu_run_refuses_bad_words_in_one_line_before_it_starts_anything(
    argv: list[str], said: str, tmp_path: Path
) -> None:
    env = {"PATH": "/usr/bin:/bin", "WORK": str(tmp_path / "work"), "POOL_ROOT": str(tmp_path / "pool")}
    r = subprocess.run(["bash", str(BENCH / "gpu_run.sh"), *argv], cwd=BENCH.parent, env=env,
                       capture_output=True, text=True, timeout=30)  # fmt: skip
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1 and said in r.stderr
    assert list(tmp_path.iterdir()) == []


def test_gpu_run_wrap_adds_its_arguments_to_serve_only(tmp_path: Path) -> None:
    """A wrapped vllm: `serve` gets the arguments, its --help and every other command pass through as given."""
    fake = tmp_path / "vllm"
    fake.write_text('#!/usr/bin/env bash\necho "$@"\n')
    fake.chmod(0o755)
    env = {"PATH": "/usr/bin:/bin", "VLLM": str(fake), "HOME": str(tmp_path)}
    wrapper = tmp_path / "vllm-kv"
    r = subprocess.run(["bash", str(BENCH / "gpu_run.sh"), "wrap", "kv", "--kv-cache-memory-bytes", "7"],
                       cwd=BENCH.parent, env={**env, "WRAP_DIR": str(tmp_path)}, capture_output=True, text=True,
                       timeout=30)  # fmt: skip
    assert r.returncode == 0, r.stderr

    def said(*argv: str) -> str:
        return subprocess.run([str(wrapper), *argv], capture_output=True, text=True, timeout=30).stdout.strip()

    assert said("serve", "/m", "--port", "1") == "serve /m --port 1 --kv-cache-memory-bytes 7"
    assert said("serve", "--help") == "serve --help"
    assert said("--version") == "--version"


@pytest.mark.slow
def test_vllm_sampler_writes_one_line_a_sample_without_a_gpu(tmp_path: Path) -> None:
    out = tmp_path / "samples.txt"
    _run(str(BENCH / "vllm_sampler.py"), str(out), "--count", "3", "--interval", "0.01")
    lines = [line.split() for line in out.read_text().splitlines()]
    assert len(lines) == 3 and all(len(fields) == 5 for fields in lines)
    times = [float(fields[0]) for fields in lines]
    assert times == sorted(times) and all(float(fields[1]) >= float(fields[2]) >= 0 for fields in lines)
    assert all(float(fields[4]) == 0.0 for fields in lines)  # no engine core here: no busiest thread


def _export(work: Path, run: str, t0: float, step3_top: str) -> None:
    """A run as gpu_run.sh leaves it: its export's three steps, and vllm_sampler.py's samples over them."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    parquet = work / run / "export" / "parquet"
    parquet.mkdir(parents=True)
    for step, n in ((1, 6), (2, 4), (3, 4)):
        rows = [
            {"item_id": f"i{k}", "status": "ok", "started_at": t0 + k, "finished_at": t0 + k + 1,
             "removed": k % 2 == 0,
             "forwards": [{"sent": "batch" if run != "off" else None, "pred": "A",
                           "top": [{"token": step3_top if step == 3 and k == 0 else "A", "logprob": -0.5}]}]}
            for k in range(n)
        ]  # fmt: skip
        pq.write_table(pa.Table.from_pylist(rows), parquet / f"step{step}.parquet")
    # the busiest engine-core thread: 0.1 of a core in the first seconds, 0.9 in the last (an older sampler
    # wrote no such column: the "off" run)
    samples = [f"{t0 + s} {2.0 * s} {0.5 * s} 70" + ("" if run == "off" else f" {0.1 if s < 4 else 0.9}")
               for s in range(8)]  # fmt: skip
    (work / run / "samples.txt").write_text("\n".join(samples) + "\n")


@pytest.mark.slow
def test_batch_summary_puts_runs_side_by_side_and_compares_their_top20(tmp_path: Path) -> None:
    work, results = tmp_path / "work", tmp_path / "results"
    _export(work, "off", 1000.0, "A")
    _export(work, "auto", 2000.0, "B")  # step 3's first item answers otherwise
    (results / "auto" / "prefix_cache").mkdir(parents=True)
    (results / "auto" / "prefix_cache" / "w.json").write_text(json.dumps({"steps": {"3": {"queries": 4, "hits": 1}}}))
    text = _run(str(BENCH / "batch_summary.py"), str(work), "off", "auto", "--results", str(results))
    table = [line.split("|")[1:-1] for line in text.splitlines() if line.startswith(("| off", "| auto"))]
    assert [(c[0].strip(), c[1].strip(), c[2].strip()) for c in table] == [
        (run, str(step), rows) for run in ("off", "auto") for step, rows in ((1, "6"), (2, "4"), (3, "4"))
    ]
    assert [c[4].strip() for c in table] == ["single"] * 3 + ["batch"] * 3
    assert table[5][5].split()[0] == "0.25"  # the prefix hits the workers metered: 1 of 4
    # over step 3's span (t0 .. t0 + 4: samples 0-4, the first has no interval): 0.1, 0.1, 0.1, 0.9
    assert [table[2][10].strip(), table[5][10].strip()] == ["-", "0.10 / 0.90"]
    compared = [line for line in text.splitlines() if line.startswith("step ")]
    assert [line.split(", identical top-20 ")[1].split(",")[0] for line in compared] == ["6", "4", "3"]


def _table(text: str, header: str) -> list[list[str]]:
    """The rows of the table under the line that starts with `header` (past its dashes), split on 2+ spaces,
    up to the first line that is not a row of numbered cells."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith(header)) + 2
    rows = []
    for line in lines[start:]:
        cells = [c.strip() for c in line.strip().split("  ") if c.strip()]
        if len(cells) < 2 or not cells[-1][0].isdigit():
            break
        rows.append(cells)
    return rows


@pytest.mark.slow
def test_load_items_counts_what_it_generated(tmp_path: Path) -> None:
    (row,) = _table(_run(str(BENCH / "load_items.py"), "--items", "200"), "items read")
    read, valid, rejected = (int(c) for c in row[:3])
    assert valid == 200 and read == valid + rejected and rejected > 0  # the synthetic table's bad rows


@pytest.mark.slow
def test_redis_memory_counts_jobs_per_step() -> None:
    rows = _table(_run(str(BENCH / "redis_memory.py"), "--items", "300"), "jobs of")
    assert [r[0] for r in rows] == ["step 1", "step 2", "step 3", "all steps"]
    assert rows[0][1:3] == ["300", "5"] and rows[3][1] == "300"  # 300 ids in jobs of 64
    assert int(rows[3][2]) == sum(int(r[2]) for r in rows[:3]) and int(rows[2][1]) <= int(rows[1][1]) <= 300


@pytest.mark.slow
def test_store_enqueue_times_every_data_path_once() -> None:
    rows = _table(_run(str(BENCH / "store_enqueue.py"), "--items", "300"), "operation")
    ops = {r[0]: r[1] for r in rows}
    assert ops["enqueue (5 jobs of 64)"] == ops["enqueue again (0 new jobs)"] == "300"
    assert ops["pool-audit (0 problems)"] and ops["pool-report (Markdown + 3 PNG)"] == "300"
    assert len(rows) == 10


@pytest.mark.slow
def test_http_paths_measures_every_path_against_aiohttp() -> None:
    rows = _table(_run(str(BENCH / "http_paths.py"), "--requests", "20", "--inflight", "4", "--rounds", "1"), "path")
    assert len(rows) == 5 and rows[-1][0] == "aiohttp directly (floor)" and rows[-1][2] == "1.00"
    assert "pool-worker's client (workers.client)" in [r[0] for r in rows]


@pytest.mark.slow
def test_sim_throughput_counts_requests_from_each_client() -> None:
    (row,) = _table(_run(str(BENCH / "sim_throughput.py"), "--clients", "1", "--seconds", "1", "--inflight", "4"),
                    "clients")  # fmt: skip
    assert row[:2] == ["1", "4"] and int(row[2].replace(",", "")) > 0


@pytest.mark.slow
def test_step3_cpu_reads_a_profile_as_parts(tmp_path: Path) -> None:
    raw = (
        'process 10:"VLLM::APIServer_0";thread (10): MainThread;_b64decode (base64.py:1) 6\n'
        'process 10:"VLLM::APIServer_0";thread (10): MainThread;hash (blake3) 2\n'
        'process 12:"VLLM::EngineCore";thread (12): MainThread;execute_model (gpu_model_runner.py:9) 4\n'
        'process 12:"VLLM::EngineCore";thread (12): MainThread;somewhere_else (x.py:1) 1\n'
    )
    f = tmp_path / "prof.txt"
    f.write_text(raw)
    text = _run(str(BENCH / "step3_cpu.py"), "parts", str(f), "--unclassified", "3")
    assert "## API servers: 8 samples" in text and "## engine core: 5 samples" in text
    lines = [line.split() for line in text.splitlines()]
    assert ["base64", "decode", "6", "75.0", "%"] in lines and ["unclassified", "1", "20.0", "%"] in lines
    assert any(line[:3] == ["unclassified", "leaf", "1"] for line in lines)
