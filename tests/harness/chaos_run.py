"""The chaos run: a three-step screen under a seeded schedule of faults, checked against what lands.

tests/e2e/test_chaos.py runs it small; benchmarks/chaos.py runs it large and prints its times. What
it does, fault by fault, is described in benchmarks/chaos.py.
"""

from __future__ import annotations

import os
import random
import resource
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC
from pathlib import Path

import faulty_worker
from redis import Redis
from reference import expected
from rq.job import Job, JobStatus
from rq.serializers import JSONSerializer

from pool_queue.demo.synth import SynthConfig, generate
from pool_queue.jobs.queue import Screen, screen_of
from pool_queue.launch.supervise import Supervisor
from pool_queue.proc.procs import Procs, free_port, wait_health
from pool_queue.protocol import Protocol
from pool_queue.store.store import Store

P = Protocol()
STEPS = sorted(P.steps)
BIN = Path(sys.executable).parent
SIMS = {"sim8a": "qwen3-vl-8b", "sim8b": "qwen3-vl-8b", "sim2": "qwen3-vl-2b"}
WORKERS = {"w8a": "sim8a", "w8b": "sim8b", "w2": "sim2"}


@dataclass(frozen=True)
class Config:
    items: int = 2000
    videos: int = 400
    faults: int = 12
    seed: int = 7
    speed: float = 4.0  # simulated GPUs this many times faster than an H200
    lease_s: int = 3
    heartbeat_s: float = 0.5
    rescue_s: float = 1.0
    silent_s: float = 6.0  # a server silent this long has its worker's jobs moved
    timeout_s: float = 900.0


@dataclass
class Report:
    faults: list[str]
    kinds: list[str]  # each fault's kind (KINDS, "worker")
    wall_s: float
    items_lost: int = 0
    wrong: int = 0  # settled rows whose removed or margin differ from the reference
    dup_agreeing: int = 0
    dup_disagreeing: int = 0
    back_queued_s: list[float] = field(default_factory=list)  # kill -9 of a worker -> its jobs on a queue again
    back_queued_overlapped_s: list[float] = field(default_factory=list)  # the same, overlapping a Redis fault
    back_running_s: list[float] = field(default_factory=list)  # kill -9 of a worker -> its jobs running again
    moved_s: dict[str, list[float]] = field(default_factory=dict)  # fault kind -> its held jobs running again
    unmoved: list[str] = field(default_factory=list)  # faults whose held jobs had not run again at the end
    flushed: int = 0  # held jobs a FLUSHALL deleted before they ran again (the recovery re-queues their items)
    dead_leases: int = 0  # leases of killed workers' jobs followed until the jobs were back
    renewed: list[str] = field(default_factory=list)  # any of those leases extended after the kill: none may be
    audit_ok: bool = False
    audit_tail: str = ""

    @property
    def ok(self) -> bool:
        return not (self.items_lost or self.wrong or self.dup_disagreeing) and self.audit_ok


@dataclass(eq=False)
class Killed:
    at: float
    held: dict[str, str]  # job id -> the worker's name
    kind: str = "worker"
    wall: float = field(default_factory=time.time)  # the fault's wall-clock time (RQ's started_at is one)
    queued: bool = False
    overlapped: bool = False  # Redis was restarted or flushed while its jobs were not yet back
    leases: dict[str, float] = field(default_factory=dict)  # kill -9: its jobs' runs -> expiry (Redis's clock)


OOM_UNDO = "maxmemory 0"
# Each kind once before worker kills fill the schedule; a short schedule takes the first ones.
KINDS = ["flushall", "redis", "sim", "sim-stop", "worker-stop", "disk", "oom", "skew", "redis", "sim"]


def schedule(cfg: Config) -> list[tuple[float, str]]:
    """(fraction of all rows written, fault) pairs: every kind of KINDS (as many as fit), then worker kills."""
    rng = random.Random(cfg.seed)
    kinds = KINDS[: cfg.faults]
    kinds += ["worker"] * (cfg.faults - len(kinds))
    rng.shuffle(kinds)
    at = sorted(rng.uniform(0.05, 0.85) for _ in kinds)
    return list(zip(at, kinds, strict=True))


class Chaos:
    def __init__(self, cfg: Config, root: Path, procs: Procs) -> None:
        self.cfg = cfg
        self.root = root
        self.procs = procs
        self.rng = random.Random(cfg.seed + 1)
        self.redis_port = free_port()
        self.redis_url = self._redis()
        self.conn = Redis.from_url(self.redis_url)
        self.results = root / "results" / f"chaos-{cfg.faults}-{time.strftime('%Y%m%dT%H%M%S')}"
        self.store = Store(self.results, P.fingerprint, P.model_dump(mode="json"))
        self.env = {
            **os.environ,
            "POOL_ROOT": str(root),
            "POOL_RESULTS": str(self.results),
            "REDIS_URL": self.redis_url,
            "PYTHONUNBUFFERED": "1",
            "POOL_LEASE_S": str(cfg.lease_s),
            "POOL_HEARTBEAT_S": str(cfg.heartbeat_s),
            "POOL_RESCUE_S": str(cfg.rescue_s),
            "POOL_SERVER_SILENT_S": str(cfg.silent_s),
        }
        self.skews: dict[str, float] = {}  # worker -> its clock's skew from the next start on
        self.later: list[tuple[float, str, object]] = []  # (when, what, how) to undo a fault
        self.stopped: set[str] = set()  # simulators held with SIGSTOP
        self.ports = {name: free_port() for name in SIMS}
        self.urls = {name: self._sim(name) for name in SIMS}
        scale = cfg.lease_s / 30  # time runs compressed here (30 s leases in the field): the supervisor's clock too
        self.sup = Supervisor(
            burst=False,
            log=lambda m: print(f"  supervisor: {m}", file=sys.stderr),
            backoff_s=max(0.1, scale),
            max_backoff_s=60 * scale,
            healthy_s=120 * scale,
        )
        self.started: dict[str, float] = {}
        self.t0 = time.monotonic()  # the screen's start (run)
        self.down: list[tuple[float, str]] = []  # simulators to start again at a time
        self.watch: list[Killed] = []
        self.back_queued: list[float] = []  # seconds from a kill -9 until all its jobs were on a queue again
        self.back_queued_overlapped: list[float] = []  # the same, for kills overlapping a Redis fault
        self.moved: dict[str, list[float]] = {}  # per fault kind: until the jobs it held ran again elsewhere
        self.flushed = 0  # held jobs a FLUSHALL deleted before they ran again
        self.dead_leases = 0
        self.renewed: list[str] = []

    def _redis(self) -> str:
        return self.procs.redis(self.redis_port, self.root.parent / "chaos-redis", aof=True)

    def _sim(self, name: str, wait: bool = True) -> str:
        url = self.procs.sim(name, self.ports[name], "--profile", SIMS[name], "--speed", str(self.cfg.speed))
        if wait:
            wait_health(url, 30)
        return url

    def _worker(self, name: str) -> subprocess.Popen[bytes]:
        self.started[name] = time.monotonic()
        skew = faulty_worker.command("--clock-skew-s", str(self.skews.get(name, 0.0)))
        argv = [*skew, "--server", self.urls[WORKERS[name]], "--name", name]
        return self.procs.start(name, argv, env=self.env)

    def _cli(self, *argv: str) -> subprocess.CompletedProcess[str]:
        argv = (str(BIN / argv[0]), *argv[1:])
        return subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=300)

    @property
    def screen(self) -> Screen:
        screen = screen_of(self.store, self.conn)
        assert screen is not None
        return screen

    def rows(self) -> int:
        return sum(self.store.winners(s).num_rows for s in STEPS)

    def run(self, want: dict[int, dict[str, tuple[bool, float]]]) -> Report:
        enq = self._cli("pool-enqueue", "--step", "1")
        assert enq.returncode == 0, enq.stderr
        for name in WORKERS:
            self.sup.add(name, lambda n=name: self._worker(n))  # type: ignore[misc]
        total = sum(len(v) for v in want.values())
        pending = schedule(self.cfg)
        fired: list[str] = []
        kinds: list[str] = []
        t0 = self.t0 = time.monotonic()
        next_look = 0.0
        while True:
            now = time.monotonic()
            assert now - t0 < self.cfg.timeout_s, f"not finished after {self.cfg.timeout_s:.0f} s: {fired}"
            self.sup.step(lambda: True)
            for due, name in [d for d in self.down if d[0] <= now]:
                self.down.remove((due, name))
                self._sim(name, wait=False)
            for undo in [u for u in self.later if u[0] <= now]:
                self.later.remove(undo)
                undo[2]()  # type: ignore[operator]
            self._track()
            if now >= next_look:
                next_look = now + 0.5
                done = self.rows()
                if pending and done >= pending[0][0] * total and (f := self._fire(pending[0][1])):
                    fired.append(f)
                    kinds.append(pending.pop(0)[1])
                if done >= total and not self.down and not self.later and not self._busy():
                    break
            time.sleep(0.1)
        wall = time.monotonic() - t0
        self._track()  # the last look: every job a fault held has run again by now
        for proc in self.sup.running():
            proc.send_signal(signal.SIGTERM)
        for proc in self.sup.running():
            proc.wait(60)
        return self._check(Report(fired, kinds, wall), want)

    def _busy(self) -> bool:
        try:
            return self.screen.busy(STEPS)
        except Exception:
            return True

    def _fire(self, kind: str) -> str | None:
        for k in self.watch:  # a Redis fault from here on: no rescue can run while it lasts
            if kind in ("redis", "flushall", "oom") and not k.queued:
                k.overlapped = True
        if kind in ("worker", "worker-stop", "disk", "skew"):
            return self._fire_worker(kind)
        if kind == "sim-stop":
            name = self._pick_sim()
            if name is None:
                return None
            proc = self.procs.children[name]
            os.killpg(proc.pid, signal.SIGSTOP)
            self.stopped.add(name)
            held = self._watch("sim-stop", next(w for w, s in WORKERS.items() if s == name))
            self._undo(2 * self.cfg.silent_s, f"SIGCONT {name}", lambda: self._wake(name, proc))
            return f"SIGSTOP {name} ({len(held)} jobs, {2 * self.cfg.silent_s:.0f} s)"
        if kind == "oom":
            hold = 2 * self.cfg.lease_s
            self.conn.config_set("maxmemory-policy", "noeviction")
            self.conn.config_set("maxmemory", 1)
            self._undo(hold, OOM_UNDO, lambda: self._redis_conn().config_set("maxmemory", 0))
            return f"Redis at maxmemory ({hold} s)"
        if kind == "sim":
            name = self._pick_sim()
            if name is None:
                return None
            self.procs.stop(name, signal.SIGKILL)
            down_s = self.rng.uniform(1.0, 3.0)
            self.down.append((time.monotonic() + down_s, name))
            return f"kill -9 {name} ({down_s:.1f} s down)"
        if kind == "redis":
            self.procs.stop(f"redis-{self.redis_port}", signal.SIGKILL)
            time.sleep(1.0)
            self._redis()
            return "kill -9 redis (AOF restart)"
        self._track()  # the last look before the flush deletes every job: those not yet running again never
        self.flushed += sum(len(k.held) for k in self.watch)  # will; their items go back through the recovery
        self.watch.clear()
        self.conn.flushall()
        rec = self._cli("pool-enqueue", "--step", "all")  # the README's recovery
        assert rec.returncode == 0, rec.stderr
        return "FLUSHALL + pool-enqueue --step all"

    def _fire_worker(self, kind: str) -> str | None:
        name = self.rng.choice(sorted(WORKERS))
        proc = self.sup.children[name].proc
        young = time.monotonic() - self.started[name] < 3 * self.cfg.heartbeat_s
        if proc is None or proc.poll() is not None or young:
            return None  # not up, or too young to have heartbeated: fire at the next look
        if kind == "skew":
            self.skews[name] = self.rng.choice([-120.0, 120.0])
            proc.send_signal(signal.SIGTERM)  # the supervisor starts it again, on the skewed clock
            return f"{name} restarted {self.skews[name]:+.0f} s off"
        held = self._watch(kind, name)
        if kind == "worker":
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            self.watch[-1].leases = self._leases(set(held))  # as its last heartbeat left them
            self.dead_leases += len(self.watch[-1].leases)
            return f"kill -9 {name} ({len(held)} jobs)"
        if kind == "worker-stop":
            proc.send_signal(signal.SIGSTOP)
            wake = 3 * self.cfg.lease_s
            self._undo(wake, f"SIGCONT {name}", lambda: proc.send_signal(signal.SIGCONT))
            return f"SIGSTOP {name} ({len(held)} jobs, {wake} s)"
        _, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        resource.prlimit(proc.pid, resource.RLIMIT_FSIZE, (1, hard))
        back = 2 * self.cfg.lease_s
        self._undo(back, f"disk of {name} back", lambda: _unlimit(proc))
        return f"disk of {name} refuses rows ({len(held)} jobs, {back} s)"

    def _pick_sim(self) -> str | None:
        """A simulator that is up and running (not killed, not stopped), or None: fire at a later look."""
        name = self.rng.choice(sorted(SIMS))
        return None if name in self.stopped or name in {n for _, n in self.down} else name

    def _wake(self, name: str, proc: subprocess.Popen[bytes]) -> None:
        os.killpg(proc.pid, signal.SIGCONT)
        self.stopped.discard(name)

    def _watch(self, kind: str, worker: str) -> dict[str, str]:
        held = self._held_by(worker)
        full = any(what == OOM_UNDO for _, what, _ in self.later)  # Redis refuses writes: no rescue yet
        self.watch.append(Killed(time.monotonic(), held, kind, overlapped=full))
        return held

    def _undo(self, after_s: float, what: str, how: object) -> None:
        self.later.append((time.monotonic() + after_s, what, how))

    def _redis_conn(self) -> Redis:
        return Redis.from_url(self.redis_url)

    def _running(self) -> dict[str, Job]:
        ids = [j for s in STEPS for j in self.screen.queue(s).started_job_registry.get_job_ids(cleanup=False)]
        return {j.id: j for j in Job.fetch_many(ids, connection=self.conn, serializer=JSONSerializer) if j is not None}

    def _leases(self, ids: set[str]) -> dict[str, float]:
        """The leases of these jobs' runs in the started registries: each run (job:execution) -> its expiry
        on Redis's clock, read without RQ's cleanup."""
        try:
            regs = [self.screen.queue(s).started_job_registry.key for s in STEPS]
            runs = ((m.decode(), score) for key in regs for m, score in self.conn.zrange(key, 0, -1, withscores=True))
            return {run: score for run, score in runs if run.split(":")[0] in ids}
        except Exception:
            return {}  # Redis away for a moment: look again next time

    def _held_by(self, name: str) -> dict[str, str]:
        try:
            running = self._running().items()
            return {jid: j.worker_name for jid, j in running if j.worker_name and j.worker_name.startswith(name + ".")}
        except Exception:
            return {}

    def _track(self) -> None:
        """A killed worker's jobs are back when each waits on its queue again (or already moved on), and
        running again when each runs under another worker or has finished."""
        if not self.watch:
            return
        try:
            now_running = self._running()
            waiting = {_text(j) for s in STEPS for j in self.conn.lrange(self.screen.queue(s).key, 0, -1)}
        except Exception:
            return  # Redis away for a moment: look again next time
        for k in list(self.watch):
            if k.leases and not k.queued:  # nothing renews a dead worker's lease: it runs out, then a rescue
                now = self._leases(set(k.held))
                self.renewed += [f"{run}: {k.leases[run]} -> {t}" for run, t in now.items() if run in k.leases
                                 and t > k.leases[run]]  # fmt: skip
            moved = {  # running again: under another worker, or started anew (a worker that held it took it back)
                jid: ((job := now_running.get(jid)) is not None and (job.worker_name != old or _after(job, k.wall)))
                or (job is None and self._status(jid) == JobStatus.FINISHED)
                for jid, old in k.held.items()
            }
            if k.kind == "worker" and not k.queued and all(m or jid in waiting for jid, m in moved.items()):
                k.queued = True
                (self.back_queued_overlapped if k.overlapped else self.back_queued).append(time.monotonic() - k.at)
            if all(moved.values()):
                self.watch.remove(k)
                if k.held:  # a fault that caught no job moves nothing
                    self.moved.setdefault(k.kind, []).append(time.monotonic() - k.at)

    def _status(self, jid: str) -> JobStatus | None:
        job = Job.fetch_many([jid], connection=self.conn, serializer=JSONSerializer)[0]
        return job.get_status() if job is not None else None

    def _statuses(self, held: dict[str, str]) -> str:
        """Where each held job is now, for a report that says why it did not move."""
        return ", ".join(f"{jid} ({old}): {self._status(jid)}" for jid, old in held.items())

    def _check(self, rep: Report, want: dict[int, dict[str, tuple[bool, float]]]) -> Report:
        rep.back_queued_s, rep.back_running_s = list(self.back_queued), list(self.moved.get("worker", []))
        rep.moved_s = {k: list(v) for k, v in self.moved.items()}
        rep.flushed = self.flushed
        rep.dead_leases, rep.renewed = self.dead_leases, list(self.renewed)
        rep.unmoved = [f"{k.kind} at {k.at - self.t0:.1f} s: {self._statuses(k.held)}" for k in self.watch if k.held]
        rep.back_queued_overlapped_s = list(self.back_queued_overlapped)
        for step in STEPS:
            got = {r["item_id"]: r for r in self.store.read_rows(step, self.store.winners(step))}
            rep.items_lost += len(set(want[step]) - set(got))
            for item, (removed, margin) in want[step].items():
                r = got.get(item)
                if r is None:
                    continue  # counted as lost
                if (r["status"], r["removed"]) != ("ok", removed) or abs(r["margin"] - margin) > 1e-9:
                    rep.wrong += 1
            seen: dict[str, tuple[object, ...]] = {}
            for r in self.store.read_rows(step, self.store.index(step)):
                key = (r["status"], r["removed"], r["pred"], r["margin"])
                if r["item_id"] in seen:
                    if seen[r["item_id"]] == key:
                        rep.dup_agreeing += 1
                    else:
                        rep.dup_disagreeing += 1
                seen.setdefault(r["item_id"], key)
        audit = self._cli("pool-audit", "--complete")
        rep.audit_ok = audit.returncode == 0
        rep.audit_tail = (audit.stdout + audit.stderr)[-1500:]
        return rep


def run_chaos(cfg: Config, work: Path) -> Report:
    root = work / "root"
    if not (root / "items").exists():
        generate(root, SynthConfig(n_items=cfg.items, n_videos=cfg.videos, seed=cfg.seed, frames=(8, 40)))
    want = expected(root)
    with Procs(work / f"logs-{cfg.faults}") as procs:
        return Chaos(cfg, root, procs).run(want)


def _after(job: Job, t: float) -> bool:
    return job.started_at is not None and job.started_at.replace(tzinfo=UTC).timestamp() > t


def _unlimit(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        resource.prlimit(proc.pid, resource.RLIMIT_FSIZE, (soft, hard))


def _text(v: bytes | str) -> str:
    return v.decode() if isinstance(v, bytes) else v
