"""The benchmark scripts themselves, against simulated servers over loopback (the GPU runs use them)."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from pool_queue.launch import Server, Tuning, cores_per_server, server_argv
from pool_queue.procs import Procs, free_port, wait_health
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


def test_ceiling_only_run_writes_its_numbers(sims: list[str], tmp_path: Path) -> None:
    out = tmp_path / "t.jsonl"
    _run(str(BENCH / "throughput.py"), "--step", "3", "--server", sims[0], "--items", "0", "--ceiling-items", "6",
         "--skip", "2", "--procs", "2", "--conc", "2", "--root", str(tmp_path / "root"), "--label", "x",
         "--out", str(out))  # fmt: skip
    rec = json.loads(out.read_text())
    assert rec["label"] == "x" and rec["system"] is None and rec["pct_of_ceiling"] is None
    assert rec["ceiling"]["forwards"] == 6 and rec["ceiling"]["errors"] == 0
    assert rec["ceiling"]["tok_s"] > rec["ceiling"]["fwd_s"] > 0


def test_system_run_next_to_the_ceiling(sims: list[str], tmp_path: Path) -> None:
    out = tmp_path / "t.jsonl"
    text = _run(str(BENCH / "throughput.py"), "--sim", "--step", "1", "--items", "30", "--ceiling-items", "8",
                "--procs", "1", "--conc", "8", "--workers", "2", "--inflight", "16", "--out", str(out))  # fmt: skip
    rec = json.loads(out.read_text())
    assert rec["system"]["items"] == 30 and rec["system"]["forwards"] == 120 and rec["system"]["errors"] == 0
    assert rec["ceiling"]["forwards"] == 32
    assert rec["pct_of_ceiling"] == pytest.approx(100 * rec["system"]["fwd_s"] / rec["ceiling"]["fwd_s"])
    assert "pool-queue" in text and "plain client" in text


def test_same_numbers_tells_equal_servers_from_different_ones(sims: list[str], tmp_path: Path) -> None:
    root = str(tmp_path / "root")
    same = _run(str(BENCH / "same_numbers.py"), "--step", "3", "--a", sims[0], "--b", sims[1], "--n", "4",
                "--skip", "2", "--root", root)  # fmt: skip
    assert same.splitlines()[-1].split()[:4] == ["4", "4", "4", "4"]  # requests, identical, same tokens, same pred
    other = _run(str(BENCH / "same_numbers.py"), "--step", "3", "--a", sims[0], "--b", sims[2], "--n", "4",
                 "--skip", "2", "--root", root)  # fmt: skip
    cells = other.splitlines()[-1].split()
    assert cells[0] == "4" and cells[1] == "0" and float(cells[4]) > 0


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


def test_serve_prints_the_launchers_argv_with_the_extra_arguments() -> None:
    out = _run(str(BENCH / "serve.py"), "3", "--port", "8123", "--model-path", "/m", "--dry-run", "--",
               "--load-format", "dummy", "--mm-tensor-ipc", "torch_shm")  # fmt: skip
    tuning = Tuning.for_cores(cores_per_server(1))
    want = server_argv(load_settings(), P, Server(0, "0", (3,), 8123), "/m", False, tuning)
    assert shlex.split(out) == ["OMP_NUM_THREADS=1", *want, "--load-format", "dummy", "--mm-tensor-ipc", "torch_shm"]


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
