"""pool-fetch and pool-upload: the real huggingface_hub code against a local hub (tests/harness/hubfixture.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from craft import row, valid_store, write
from hubfixture import Hub, HubServer

from pool_queue.hub.fetch import FRAMES_REPO, ITEMS_REPO
from pool_queue.hub.pack import SYNTHETIC, pack_name
from pool_queue.inputs.items import load_items
from pool_queue.inputs.shards import read_manifest
from pool_queue.protocol import Protocol

pytestmark = pytest.mark.slow  # several commands each against a local hub

TOKEN = "hf_s3cretTOKENvalue"


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


@pytest.fixture()
def hub(small_root: Path, tmp_path: Path) -> Iterator[Hub]:
    with HubServer(tmp_path / "hub") as h:
        items = {f"items/{k}": v for k, v in _files(small_root / "items").items()}
        items["code/run_remote.sh"] = b"#!/bin/sh\n"  # in the real repo too; pool-fetch leaves it
        h.add("dataset", ITEMS_REPO, items)
        h.add("dataset", FRAMES_REPO, _files(small_root / "frames_tar"))
        for spec in Protocol().steps.values():
            files = {
                "config.json": b'{"architectures": ["Qwen3VLForConditionalGeneration"]}',
                "model.bin": os.urandom(4096),
            }
            h.add("model", spec.model, files, commit=spec.revision)
        yield h


def fetch(root: Path, hub_url: str, home: Path, *args: str, offline: bool = False) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HF_ENDPOINT": hub_url, "HF_HOME": str(home), "HF_TOKEN": TOKEN}
    env.pop("HF_HUB_OFFLINE", None)
    if offline:
        env["HF_HUB_OFFLINE"] = "1"
    cmd = [sys.executable, "-m", "pool_queue.commands.fetch", "--root", str(root), *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)


def test_fetch_everything_then_resume_then_offline(hub, small_root, tmp_path):
    root, home = tmp_path / "pool", tmp_path / "hf"
    out = fetch(root, hub.url, home)
    assert out.returncode == 0, out.stderr
    assert TOKEN not in out.stdout + out.stderr
    assert len(load_items(root / "items").items) == len(load_items(small_root / "items").items)
    assert not (root / "code").exists()  # only the item table is taken from the items repo
    n_videos = read_manifest(small_root / "frames_tar").n_videos
    assert f"frames: {n_videos} video folders" in out.stdout
    assert sorted(p.name for p in (root / "frames" / "pool_frames").iterdir() if p.is_dir()) == sorted(
        p.name for p in (small_root / "frames" / "pool_frames").iterdir()
    )
    for spec in Protocol().steps.values():
        snap = home / "hub" / f"models--{spec.model.replace('/', '--')}" / "snapshots" / spec.revision
        assert (snap / "model.bin").is_file(), snap
    downloads = [r for r in hub.requests if r.startswith("GET") and "/resolve/" in r]
    assert any(r.endswith(".tar") for r in downloads)

    hub.requests.clear()  # a second run resumes: nothing is downloaded again
    again = fetch(root, hub.url, home)
    assert again.returncode == 0, again.stderr
    assert not [r for r in hub.requests if r.startswith("GET") and "/resolve/" in r]
    lost = sorted((root / "frames_tar").glob("frames_*.tar"))[0]
    lost.unlink()  # an interrupted fetch: only what is missing comes again
    hub.requests.clear()
    assert fetch(root, hub.url, home, "--frames").returncode == 0
    assert [r for r in hub.requests if r.startswith("GET") and "/resolve/" in r] == [
        f"GET /datasets/{FRAMES_REPO}/resolve/{hub.repos[('dataset', FRAMES_REPO)].commit}/{lost.name}"
    ]

    models = fetch(tmp_path / "other", "http://127.0.0.1:9", home, "--models", offline=True)  # no hub at all
    assert models.returncode == 0, models.stderr
    assert Protocol().steps[3].revision[:12] in models.stdout


def test_fetch_refuses_a_corrupt_shard_and_names_it(hub, tmp_path):
    frames = hub.repos[("dataset", FRAMES_REPO)].folder
    shard = sorted(frames.glob("frames_*.tar"))[1]
    data = bytearray(shard.read_bytes())
    data[600] ^= 0xFF
    shard.write_bytes(bytes(data))
    out = fetch(tmp_path / "pool", hub.url, tmp_path / "hf", "--frames")
    assert out.returncode == 2
    assert f"SHA256 MISMATCH: {shard.name}" in out.stderr
    assert not (tmp_path / "pool" / "frames" / "pool_frames").exists() or not any(
        (tmp_path / "pool" / "frames" / "pool_frames").iterdir()
    )


def test_fetch_from_a_local_folder_reads_it_only(small_root, tmp_path):
    src = tmp_path / "mirror"
    (src / "items").mkdir(parents=True)
    for f in (small_root / "items").iterdir():
        (src / "items" / f.name).write_bytes(f.read_bytes())
    for f in (small_root / "frames_tar").iterdir():
        (src / f.name).write_bytes(f.read_bytes())
    src.chmod(0o555)  # a read-only mount: nothing may be written beside the inputs
    try:
        before = sorted(p.name for p in src.rglob("*"))
        out = fetch(tmp_path / "pool", "http://127.0.0.1:9", tmp_path / "hf", "--items", "--frames", "--from", str(src))
        assert out.returncode == 0, out.stderr
        assert sorted(p.name for p in src.rglob("*")) == before
        assert "valid items" in out.stdout and "video folders" in out.stdout
    finally:
        src.chmod(0o755)


def test_fetch_says_what_is_missing_offline(tmp_path):
    out = fetch(tmp_path / "pool", "http://127.0.0.1:9", tmp_path / "hf", "--models", offline=True)
    assert out.returncode == 2
    assert "not in the local cache" in out.stderr and "Traceback" not in out.stderr


def _cli(module: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if k != "HF_TOKEN"} | (env or {})
    cmd = [sys.executable, "-m", f"pool_queue.commands.{module}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=full, timeout=300)


def test_pack_then_upload_a_return(hub, pool_root, tmp_path):
    (pool_root / SYNTHETIC).unlink()  # a root that pool-fetch laid out: real items, no synthetic mark
    valid_store(pool_root)
    (pool_root / "logs" / "client_s1_gpu0.log").write_text("step 1 done\n")
    stale = pool_root / "results" / "pool" / "step1" / ".index2" / "seg-old"  # an earlier release's index
    stale.mkdir(parents=True)
    (stale / "0-10.parquet").write_bytes(b"PAR1")
    out = _cli("pack", "--root", str(pool_root))
    assert out.returncode == 0, out.stderr
    name = pack_name()
    tar_path, sha_path = pool_root / f"{name}.tar.gz", pool_root / f"{name}.sha256"
    assert "audit:" in out.stdout and out.stdout.strip().endswith(f"send it: pool-upload {tar_path}")
    assert "synthetic" not in out.stdout
    check = subprocess.run(["sha256sum", "-c", sha_path.name], cwd=pool_root, capture_output=True, text=True)
    assert check.returncode == 0 and check.stdout.strip() == f"{tar_path.name}: OK"
    with tarfile.open(tar_path) as tf:
        names = tf.getnames()
    assert "logs/client_s1_gpu0.log" in names and "logs/pool_audit.txt" in names
    assert any(n.startswith("results/pool/step1/") for n in names)
    assert any(n.startswith("results/pool/step2/") for n in names)
    assert not any(".index" in n for n in names) and not any(n.startswith("items") for n in names)

    dry = _cli("upload", str(tar_path), "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert f"would upload {tar_path}" in dry.stdout and f"returns/{name}.sha256" in dry.stdout
    assert not hub.commits

    no_token = _cli("upload", str(tar_path), env={"HF_ENDPOINT": hub.url})
    assert no_token.returncode == 2 and "HF_TOKEN is not set" in no_token.stderr
    assert "upload" not in no_token.stdout  # nothing that looks like an upload before the token is checked

    sent = _cli("upload", str(tar_path), env={"HF_ENDPOINT": hub.url, "HF_TOKEN": TOKEN})
    assert sent.returncode == 0, sent.stderr
    assert TOKEN not in sent.stdout + sent.stderr
    got = hub.repos[("dataset", ITEMS_REPO)].folder / "returns"
    assert (got / tar_path.name).read_bytes() == tar_path.read_bytes()
    assert (got / sha_path.name).read_text() == sha_path.read_text()
    assert [c["token"] for c in hub.commits] == [TOKEN, TOKEN]

    tar_path.write_bytes(tar_path.read_bytes()[:-10])  # torn or changed after packing: not sent
    torn = _cli("upload", str(tar_path), env={"HF_ENDPOINT": hub.url, "HF_TOKEN": TOKEN})
    assert torn.returncode == 2 and "does not match" in torn.stderr and len(hub.commits) == 2


def test_a_synthetic_pack_never_reaches_the_dataset(hub, pool_root):
    """A generated root is marked, its pack carries the mark first, and pool-upload refuses it in one line,
    --dry-run too; --synthetic-ok sends it, to another repo only."""
    valid_store(pool_root)
    out = _cli("pack", "--root", str(pool_root), "--name", "demo")
    assert out.returncode == 0, out.stdout + out.stderr
    tar_path = pool_root / "demo.tar.gz"
    said = out.stdout.strip().splitlines()[-1]  # what pool-upload will do, and nothing it will not
    assert said.startswith(f"synthetic: the pack carries {SYNTHETIC}") and "send it:" not in out.stdout, out.stdout
    assert f"pool-upload refuses to send it to {ITEMS_REPO}" in said
    hint = said.split("to try the upload itself: pool-upload ", 1)[1]
    assert hint == f"--synthetic-ok --repo <your test repo> {tar_path}"
    with tarfile.open(tar_path) as tf:
        assert tf.getnames()[0] == SYNTHETIC
    test_repo = "someone/upload-test"
    hub.add("dataset", test_repo, {"README.md": b"a test repo\n"})
    env = {"HF_ENDPOINT": hub.url, "HF_TOKEN": TOKEN}
    for argv in (["--dry-run"], [], ["--synthetic-ok"], ["--synthetic-ok", "--dry-run"]):
        refused = _cli("upload", str(tar_path), *argv, env=env)
        assert refused.returncode == 2 and "Traceback" not in refused.stderr, (argv, refused.stderr)
        assert len(refused.stderr.strip().splitlines()) == 1 and not refused.stdout, (argv, refused)
        assert (SYNTHETIC in refused.stderr) if "--synthetic-ok" not in argv else (ITEMS_REPO in refused.stderr)
    assert not hub.commits
    sent = _cli("upload", *hint.replace("<your test repo>", test_repo).split(), env=env)  # the command it named
    assert sent.returncode == 0, sent.stderr
    assert [c["repo"] for c in hub.commits] == [test_repo, test_repo]
    assert not (hub.repos[("dataset", ITEMS_REPO)].folder / "returns").exists()


def test_pack_refuses_a_results_root_with_audit_problems(pool_root):
    items, _ = valid_store(pool_root)
    write(pool_root, 2, [row(items[0], 2)], name="stray")  # items[0] was removed at step 1
    out = _cli("pack", "--root", str(pool_root), "--name", "r")
    assert out.returncode == 1
    assert "PROBLEM [chain]" in out.stdout and "--force" in out.stderr
    assert not (pool_root / "r.tar.gz").exists()
    forced = _cli("pack", "--root", str(pool_root), "--name", "r", "--force")
    assert forced.returncode == 0, forced.stderr
    with tarfile.open(pool_root / "r.tar.gz") as tf:
        audit = tf.extractfile("logs/pool_audit.txt")
        assert audit is not None and b"PROBLEM [chain]" in audit.read()
