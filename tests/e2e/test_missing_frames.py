"""Steps 2-3 need their frames: a frame cache that is absent, empty or short of its manifest refuses the steps
that send frames (one line, exit 2, nothing queued or started) unless the missing videos are said to be meant,
and `pool-audit --complete` fails a screen that skipped videos that are not `k:`. `k:` videos have no frames
by design: counted, never a refusal."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from craft import items_of, row, write
from ports import port0
from redis import Redis

from pool_queue.demo.synth import SynthConfig, generate

pytestmark = pytest.mark.slow  # several commands each, launches among them

BIN = Path(sys.executable).parent


def run(*argv: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "POOL_ENV_FILE": "", **(env or {})}
    return subprocess.run([str(BIN / argv[0]), *argv[1:]], capture_output=True, text=True, timeout=timeout, env=env)


def one_line(out: subprocess.CompletedProcess[str]) -> str:
    """Exit 2, no traceback, one line."""
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stdout[-2000:] + out.stderr[-3000:]
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    return lines[0]


def step1_screened(root: Path) -> list[dict]:
    """Step 1 settled for every item, every other one removed; returns its survivors."""
    items = items_of(root)
    write(root, 1, [row(it, 1, removed=i % 2 == 0) for i, it in enumerate(items)])
    return [it for i, it in enumerate(items) if i % 2]


def not_k_without_frames(root: Path, items: list[dict]) -> list[dict]:
    frames = root / "frames" / "pool_frames"
    return [it for it in items if not it["video_id"].startswith("k:") and not (frames / it["video_id"]).is_dir()]


def test_step_2_is_refused_in_one_line_while_the_frame_cache_is_absent_or_empty(pool_root, redis_url):
    survivors = step1_screened(pool_root)
    frames = pool_root / "frames" / "pool_frames"
    shutil.rmtree(frames)
    bare = not_k_without_frames(pool_root, survivors)
    assert bare and len(bare) < len(survivors)  # the survivors of `k:` videos are not counted
    flags = ("--root", str(pool_root), "--redis-url", redis_url)
    for step in ("2", "all"):
        line = one_line(run("pool-enqueue", "--step", step, *flags))
        assert f"the frame cache {frames} does not exist: {len(bare)} items of " in line, line
        assert "`pool-frames`" in line and "`pool-fetch --frames`" in line and "--allow-missing-frames" in line
    frames.mkdir()
    line = one_line(run("pool-enqueue", "--step", "2", *flags))
    assert f"the frame cache {frames} holds no video folder: {len(bare)} items" in line, line
    assert Redis.from_url(redis_url).dbsize() == 0  # nothing queued
    plan = run("pool-enqueue", "--step", "2", "--plan-only", *flags)  # a plan is made, and says why it is short
    assert plan.returncode == 0 and "REMAINING_TOTAL=0" in plan.stdout, plan.stderr
    assert "warning: the frame cache" in plan.stderr and "a screen is refused until you fill it" in plan.stderr


def test_videos_missing_beyond_the_manifest_are_refused_unless_meant_to_be_missing(pool_root, redis_url):
    """The small pool's manifest holds 2 videos fewer than its items name that are not `k:` (a snapshot, as the
    real pool's): those run. Folders lost from the cache since it was extracted are refused, unless the flag or
    POOL_ALLOW_MISSING_FRAMES says they are meant to be missing."""
    survivors = step1_screened(pool_root)
    allowed = not_k_without_frames(pool_root, survivors)
    assert allowed  # missing per the manifest
    flags = ("--root", str(pool_root), "--redis-url", redis_url)
    whole = run("pool-enqueue", "--step", "2", "--plan-only", *flags)
    assert whole.returncode == 0 and "warning" not in whole.stderr, whole.stderr
    with_frames = len(survivors) - len(allowed) - sum(it["video_id"].startswith("k:") for it in survivors)
    assert f"REMAINING_TOTAL={with_frames}" in whole.stdout

    frames = pool_root / "frames" / "pool_frames"
    n_videos = sum(1 for _ in frames.iterdir())
    for video in sorted({it["video_id"] for it in survivors if (frames / it["video_id"]).is_dir()})[:3]:
        shutil.rmtree(frames / video)
    bare = not_k_without_frames(pool_root, survivors)
    line = one_line(run("pool-enqueue", "--step", "2", *flags))
    manifest = pool_root / "frames_tar" / "frames_manifest.json"
    assert f"holds {n_videos - 3} video folders, n_videos of {manifest} is {n_videos}: " in line, line
    videos = len({it["video_id"] for it in bare})
    assert f": {len(bare)} items of {videos} videos that are not `k:` would never be screened in steps 2-3" in line
    assert Redis.from_url(redis_url).dbsize() == 0
    meant = run("pool-enqueue", "--step", "2", "--allow-missing-frames", *flags)
    assert meant.returncode == 0 and "screened without them: --allow-missing-frames" in meant.stderr, meant.stderr
    short = len(survivors) - len(bare) - sum(it["video_id"].startswith("k:") for it in survivors)
    assert f"enqueued {short:,} items as " in meant.stderr, meant.stderr
    again = run("pool-enqueue", "--step", "2", *flags, env={"POOL_ALLOW_MISSING_FRAMES": "1"})  # the setting
    assert again.returncode == 0 and "REMAINING_TOTAL=" in again.stdout, again.stderr


def test_videos_of_k_ids_alone_need_no_frames(tmp_path, redis_url):
    """A pool whose videos are all `k:` has no frame cache at all: steps 2-3 run (nothing to screen there),
    the audit of the complete screen passes, and the survivors stay a note."""
    root = tmp_path / "k-only"
    generate(root, SynthConfig(n_items=20, n_videos=5, seed=1, frames=(8, 9), k_fraction=1.0))
    shutil.rmtree(root / "frames", ignore_errors=True)
    survivors = step1_screened(root)
    flags = ("--root", str(root), "--redis-url", redis_url)
    out = run("pool-enqueue", "--step", "all", *flags)
    assert out.returncode == 0 and "STEP=2 REMAINING_TOTAL=0" in out.stdout, out.stderr
    audit = run("pool-audit", "--complete", *flags)
    assert audit.returncode == 0 and "PROBLEM" not in audit.stdout, audit.stdout
    status = run("pool-status", "--no-health", *flags)
    assert f"{len(survivors)} survivors of step 1 have no frames: not screened in steps 2-3 here" in status.stdout


def test_audit_complete_fails_on_a_screen_that_skipped_videos_that_are_not_k(
    pool_root, small_root, tmp_path, redis_url
):
    survivors = step1_screened(pool_root)
    flags = ("--root", str(pool_root))
    # a normal screen: step 2 for every survivor with frames (all removed), so step 3 has nothing to do
    framed = pool_root / "frames" / "pool_frames"
    write(pool_root, 2, [row(it, 2, removed=True) for it in survivors if (framed / it["video_id"]).is_dir()])
    never = not_k_without_frames(pool_root, survivors)
    assert never  # missing per the manifest: no finding
    normal = run("pool-audit", "--complete", *flags)
    assert normal.returncode == 0 and "OK, 0 warning(s)" in normal.stdout, normal.stdout
    # the cache deleted once step 2 is done: what step 2 screened needs it no more, only what it never could
    shutil.rmtree(framed)
    line = one_line(run("pool-enqueue", "--step", "all", "--redis-url", redis_url, *flags))
    videos = len({it["video_id"] for it in never})
    assert f"does not exist: {len(never)} items of {videos} videos that are not `k:`" in line, line
    # a screen whose frame cache was gone from the start: steps 2-3 had nothing eligible and "completed"
    gone = tmp_path / "gone"
    shutil.copytree(small_root, gone, symlinks=True)
    shutil.rmtree(gone / "frames" / "pool_frames")
    bare = not_k_without_frames(gone, step1_screened(gone))
    audit = run("pool-audit", "--complete", "--root", str(gone))
    assert audit.returncode == 1, audit.stdout + audit.stderr
    problems = [line for line in audit.stdout.splitlines() if line.startswith("PROBLEM")]
    assert len(problems) == 1 and problems[0].startswith(f"PROBLEM [frames] step 2: {len(bare)} survivors of step 1 ")
    assert "that are not `k:`) were never screened" in problems[0] and "`pool-frames`" in problems[0]
    meant = run("pool-audit", "--complete", "--allow-missing-frames", "--root", str(gone))
    assert meant.returncode == 0 and f"warning [frames] step 2: {len(bare)} survivors" in meant.stdout, meant.stdout


def test_a_launch_without_frames_is_refused_and_its_screen_is_not_complete(pool_root, redis_url):
    """`pool-launch --sim --burst` on a root whose frames/ is gone: one line, nothing started. Told that the
    videos are meant to be missing, it screens step 1 only, and the audit of that "complete" screen fails."""
    shutil.rmtree(pool_root / "frames")
    env = {"POOL_ROOT": str(pool_root), "REDIS_URL": redis_url, "NGPU": "1", "PORT0": str(port0())}
    for only in ([], ["--step", "1"]):  # step 1's model serves step 2 too: its survivors chain there
        line = one_line(run("pool-launch", "--sim", "--burst", *only, env=env))
        assert f"the frame cache {pool_root / 'frames' / 'pool_frames'} does not exist" in line, line
    assert not list((pool_root / "logs").glob("*.log")), "nothing started"
    assert not (pool_root / "results" / "pool" / "PROTOCOL.json").exists(), "nothing claimed"
    assert Redis.from_url(redis_url).dbsize() == 0
    meant = run("pool-launch", "--sim", "--burst", "--sim-speed", "100", "--allow-missing-frames", env=env, timeout=600)
    assert meant.returncode == 0, meant.stderr[-3000:]
    assert "STEP=2 REMAINING_TOTAL=0" in meant.stdout and "STEP=3 REMAINING_TOTAL=0" in meant.stdout
    assert "screened without them: --allow-missing-frames" in meant.stderr
    audit = run("pool-audit", "--complete", env=env)
    assert audit.returncode == 1 and "PROBLEM [frames] step 2: " in audit.stdout, audit.stdout


def test_a_manifest_that_cannot_be_read_is_one_line_naming_it(pool_root, redis_url):
    step1_screened(pool_root)
    manifest = pool_root / "frames_tar" / "frames_manifest.json"
    manifest.write_text('{"shards": "cut short"}')
    line = one_line(run("pool-enqueue", "--step", "2", "--root", str(pool_root), "--redis-url", redis_url))
    assert line.startswith(f"error: {manifest}: shards (") and "pool-fetch --frames" in line, line
    assert Redis.from_url(redis_url).dbsize() == 0
