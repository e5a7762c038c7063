"""A generated package root is whole or absent: pool-synth (and pool-demo through it) writes beside the
root and renames it into place when complete, so an interrupted run leaves nothing that looks usable, and
the next run names the leftover and removes it (or refuses one it did not leave)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pool_queue.demo.synth import PARTIAL, SynthConfig, build_root, generate
from pool_queue.hub.pack import SYNTHETIC
from pool_queue.inputs.shards import MANIFEST, verify

pytestmark = pytest.mark.slow  # pool-synth and pool-demo runs, some stopped by Ctrl-C

BIN = Path(sys.executable).parent


def _synth(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / "pool-synth"), *argv], capture_output=True, text=True, timeout=600, cwd=cwd)


def test_ctrl_c_leaves_no_root_and_the_next_run_removes_the_leftover(tmp_path):
    cmd = [str(BIN / "pool-synth"), "big", "--items", "4000", "--videos", "1500"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    partial = tmp_path / f"big{PARTIAL}"
    deadline = time.monotonic() + 300
    while not (partial / "frames" / "pool_frames").is_dir() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None, "pool-synth ended before it was interrupted: make the pool bigger"
    proc.send_signal(signal.SIGINT)  # mid-frames: items are written, frames and shards are not
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "interrupted" in err and f"big{PARTIAL}" in err
    assert not (tmp_path / "big").exists() and (partial / "items").is_dir()

    again = _synth("big", "--items", "40", "--videos", "10", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert f"removing big{PARTIAL}" in again.stdout and "interrupted" in again.stdout
    assert not partial.exists() and (tmp_path / "big" / "frames_tar" / MANIFEST).is_file()
    assert (tmp_path / "big" / SYNTHETIC).is_file()


def test_ctrl_c_while_the_demo_generates_its_pool_leaves_no_root_to_screen(tmp_path):
    env = {**os.environ, "POOL_ENV_FILE": ""}
    cmd = [str(BIN / "pool-demo"), "--root", "demo", "--items", "4000", "--videos", "1500"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    partial = tmp_path / f"demo{PARTIAL}"
    deadline = time.monotonic() + 300
    while not (partial / "frames" / "pool_frames").is_dir() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None, "pool-demo ended before it was interrupted"
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and "Traceback" not in err, err
    assert "interrupted while generating: demo was not made" in out and "resumes" not in out, out
    assert not (tmp_path / "demo").exists() and partial.is_dir()  # nothing a rerun could take for a pool


def test_a_leftover_it_did_not_leave_is_refused_and_kept(tmp_path):
    stranger = tmp_path / f"pool{PARTIAL}"
    stranger.mkdir()
    (stranger / "notes.txt").write_text("someone's\n")
    out = _synth("pool", "--items", "20", "--videos", "5", cwd=tmp_path)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert f"pool{PARTIAL}" in out.stderr and "not left by pool-synth" in out.stderr
    assert (stranger / "notes.txt").is_file() and not (tmp_path / "pool").exists()
    shutil.rmtree(stranger)
    made = _synth("pool", "--items", "20", "--videos", "5", cwd=tmp_path)
    assert made.returncode == 0
    again = _synth("pool", "--items", "20", "--videos", "5", cwd=tmp_path)
    assert again.returncode == 2 and "exists (a package root)" in again.stderr, again.stderr


def test_a_root_moved_into_place_keeps_its_links_and_shards(tmp_path):
    """Links inside a generated root (the hostile pool's) are relative, and hard-linked frames stay linked:
    the rename that puts the root in place keeps every one of them valid."""
    from hostile import add_hostile

    def make(folder: Path) -> None:
        generate(folder, SynthConfig(n_items=30, n_videos=8, seed=2, frames=(8, 12), link_frames=True))
        add_hostile(folder, 2)

    build_root(tmp_path / "root", make, lambda _: None)
    cache = tmp_path / "root" / "frames" / "pool_frames"
    links = [p for p in cache.rglob("*") if p.is_symlink()]
    assert links and all(not os.readlink(p).startswith("/") for p in links)
    assert (cache / "hv-hx-folder-link-out").resolve() == (tmp_path / "root" / "not-frames" / "clip").resolve()
    assert verify(tmp_path / "root" / "frames_tar", show=False).shards  # raises on a missing or changed shard


def test_an_empty_folder_already_there_is_filled_from_inside_items_last(tmp_path):
    """A volume's mount point (compose's /pool) cannot be renamed over: the root is staged inside it and its
    entries moved up, items/ last; a leftover staging folder there is named and removed by the next run."""
    root = tmp_path / "pool"
    root.mkdir()
    seen: list[Path] = []

    def make(folder: Path) -> None:
        seen.append(folder)
        generate(folder, SynthConfig(n_items=20, n_videos=5, seed=4, frames=(8, 9)))

    (root / PARTIAL).mkdir()  # what an interrupted run left inside it
    (root / PARTIAL / ".pool-synth-partial").write_text("ours")
    said: list[str] = []
    build_root(root, make, said.append)
    assert seen == [root / PARTIAL] and said == [
        f"removing {root / PARTIAL}: a pool left half-made by an interrupted run"
    ]
    assert not (root / PARTIAL).exists() and (root / "items").is_dir() and (root / SYNTHETIC).is_file()
    assert verify(root / "frames_tar", show=False).shards
    out = _synth(str(root), "--items", "10", "--videos", "3", cwd=tmp_path)  # now a pool: refused, kept
    assert out.returncode == 2 and "exists (a package root)" in out.stderr, out.stderr
