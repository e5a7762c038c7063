"""The rehearsal: a pool of the real shape through every stage (synth, enqueue, the screen with status
refreshes, a FLUSHALL and its recovery, a worker killed, report, audit, export, pack), every process
measured. tests/e2e/test_rehearsal.py runs it small; benchmarks/rehearsal.py runs it large and prints
its tables.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from redis import Redis

from pool_queue.hub.pack import check_sha
from pool_queue.launch.supervise import Supervisor
from pool_queue.proc.procs import Procs, free_port, wait_health

BIN = Path(sys.executable).parent
TICK = os.sysconf("SC_CLK_TCK")
MODELS = {"8b": ("qwen3-vl-8b", "1,2"), "2b": ("qwen3-vl-2b", "3")}
SYNTH = """
import sys
from pathlib import Path
from pool_queue.demo.synth import SynthConfig, generate
n = int(sys.argv[2])
print(generate(Path(sys.argv[1]), SynthConfig(n_items=n, n_videos=round(n / 2.7), seed=11, n_benchmarks=139,
      k_fraction=0.35, missing_fraction=0.05, frames=(32, 64), frame_formats=(("jpeg448", 1.0),),
      link_frames=True, shards=False)))
"""


@dataclass(frozen=True)
class Config:
    items: int = 3000
    speed: float = 50.0  # simulated servers this many times an H200: the system is what is measured
    workers: int = 2  # per model
    status_every_s: float = 5.0
    flush_at: float = 0.4  # of step 1's items done: FLUSHALL + pool-enqueue --step all
    kill_at: float = 0.6  # of step 1's items done: SIGKILL of one worker
    timeout_s: float = 8 * 3600.0


@dataclass
class Cost:
    """One stage or process kind: wall, CPU and the peak RSS of its largest process."""

    wall_s: float = 0.0
    cpu_s: float = 0.0
    rss_mb: float = 0.0
    out_mb: float | None = None

    def add(self, wall_s: float, cpu_s: float, rss_mb: float) -> None:
        self.wall_s, self.cpu_s, self.rss_mb = self.wall_s + wall_s, self.cpu_s + cpu_s, max(self.rss_mb, rss_mb)


@dataclass
class Report:
    items: int
    stages: dict[str, Cost] = field(default_factory=dict)  # one-shot commands and the screen itself
    kinds: dict[str, Cost] = field(default_factory=dict)  # long-running processes over the screen
    redis_peak_mb: float = 0.0
    status_s: list[float] = field(default_factory=list)
    steps: dict[int, tuple[int, int, int]] = field(default_factory=dict)  # step -> (eligible, done, remaining)
    audit_ok: bool = False
    audit_tail: str = ""
    pack_ok: bool = False
    faults: list[str] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return bool(self.steps) and all(done == eligible and left == 0 for eligible, done, left in self.steps.values())

    @property
    def peak_rss_mb(self) -> float:
        return max(c.rss_mb for c in [*self.stages.values(), *self.kinds.values()])


def run_child(argv: list[str], env: dict[str, str]) -> tuple[subprocess.CompletedProcess[str], Cost]:
    """One command to its end, with its own CPU and peak RSS from the kernel (wait4; its output via files, so
    nothing reaps it first)."""
    t0 = time.monotonic()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        p = subprocess.Popen(argv, env=env, stdout=out, stderr=err, text=True)
        _, status, ru = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0), err.seek(0)
        done = subprocess.CompletedProcess(argv, p.returncode, out.read(), err.read())
    return done, Cost(time.monotonic() - t0, ru.ru_utime + ru.ru_stime, ru.ru_maxrss / 1024)


def proc_sample(pid: int) -> tuple[float, float] | None:
    """(peak RSS MB, CPU s) of a live process from /proc; None once it is gone, or going: an exiting
    process (a zombie) still has a status file, without its memory lines."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    hwm = [int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM:")]
    return (hwm[0] / 1024, (int(stat[11]) + int(stat[12])) / TICK) if hwm else None


def du_mb(path: Path) -> float:
    """Bytes under `path` (a hard-linked file once), in MB. With os.walk, not a glob that remembers every
    path: this process stays small, and every command it starts inherits its peak RSS at exec."""
    seen, total = set(), 0
    for d, _, files in os.walk(path):
        for name in files:
            st = os.lstat(os.path.join(d, name))
            if st.st_nlink > 1:
                if (st.st_dev, st.st_ino) in seen:
                    continue
                seen.add((st.st_dev, st.st_ino))
            total += st.st_size
    return total / 1e6


class Rehearsal:
    def __init__(self, cfg: Config, work: Path, procs: Procs) -> None:
        self.cfg, self.work, self.procs = cfg, work, procs
        self.root = work / "pool"
        self.rep = Report(cfg.items)
        port = free_port()
        self.redis_url = procs.redis(port, work / "redis", aof=True)
        self.conn = Redis.from_url(self.redis_url)
        self.env = {**os.environ, "POOL_ROOT": str(self.root), "REDIS_URL": self.redis_url, "PYTHONUNBUFFERED": "1"}
        self.pids: dict[int, str] = {}  # every long-running process -> its kind
        self.last: dict[int, tuple[float, float]] = {}  # its last sample

    def stage(self, name: str, *argv: str) -> tuple[subprocess.CompletedProcess[str], Cost]:
        """A command run to its end, its cost added to the stage's; only the audit may fail (it is reported)."""
        out, cost = run_child([str(BIN / argv[0]) if (BIN / argv[0]).exists() else argv[0], *argv[1:]], self.env)
        self.rep.stages.setdefault(name, Cost()).add(cost.wall_s, cost.cpu_s, cost.rss_mb)
        if out.returncode != 0 and name != "audit":
            raise SystemExit(f"{name}: exit {out.returncode}\n{out.stderr[-3000:]}")
        return out, cost

    def run(self) -> Report:
        self.stage("synth", sys.executable, "-c", SYNTH, str(self.root), str(self.cfg.items))
        self.rep.stages["synth"].out_mb = du_mb(self.root)
        self.stage("enqueue", "pool-enqueue", "--step", "all")
        self._screen()
        self.stage("report", "pool-report", "--out", str(self.work / "report"))
        self.rep.stages["report"].out_mb = du_mb(self.work / "report")
        audit, _ = self.stage("audit", "pool-audit", "--complete")
        self.rep.audit_ok, self.rep.audit_tail = audit.returncode == 0, (audit.stdout + audit.stderr)[-1500:]
        self.stage("export", "pool-export", "--out", str(self.work / "export"))
        self.rep.stages["export"].out_mb = du_mb(self.work / "export")
        self.stage("pack", "pool-pack", "--out", str(self.work / "pack"))
        (tar,) = (self.work / "pack").glob("*.tar.gz")
        check_sha(tar, tar.with_name(tar.name.removesuffix(".tar.gz") + ".sha256"))  # raises when it differs
        self.rep.pack_ok, self.rep.stages["pack"].out_mb = True, tar.stat().st_size / 1e6
        return self.rep

    def _screen(self) -> None:
        sup = Supervisor(burst=False, log=lambda m: print(f"  supervisor: {m}", file=sys.stderr))
        for model, (profile, takes) in MODELS.items():
            url = self.procs.sim(f"sim{model}", free_port(), "--profile", profile, "--speed", str(self.cfg.speed))
            wait_health(url, 30)
            self.pids[self.procs.children[f"sim{model}"].pid] = "simulated server"
            for k in range(self.cfg.workers):
                name = f"w{model}{k}"
                argv = [sys.executable, "-m", "workers.main", "--server", url, "--name", name, "--steps", takes]
                sup.add(name, lambda n=name, a=argv: self.procs.start(n, a, env=self.env))  # type: ignore[misc]
        self.pids[self.procs.children[next(n for n in self.procs.children if n.startswith("redis"))].pid] = "redis"
        t0, next_status, flushed, killed = time.monotonic(), 0.0, False, False
        while True:
            now = time.monotonic()
            if now - t0 > self.cfg.timeout_s:
                raise SystemExit(f"not finished after {self.cfg.timeout_s:.0f} s")
            sup.step(lambda: True)
            for name, child in sup.children.items():
                if child.proc is not None and child.proc.poll() is None:
                    self.pids.setdefault(child.proc.pid, f"worker {name[1:3].upper()}")
            self._sample()
            if now >= next_status:
                next_status = now + self.cfg.status_every_s
                steps = self._status()
                eligible1, done1 = steps[1][0], steps[1][1]
                if not flushed and done1 >= self.cfg.flush_at * eligible1:
                    flushed = True
                    self.conn.flushall()
                    self.stage("recovery", "pool-enqueue", "--step", "all")
                    self.rep.faults.append(f"FLUSHALL + pool-enqueue --step all at {done1:,} step-1 items")
                if not killed and done1 >= self.cfg.kill_at * eligible1:
                    killed = True
                    name = random.Random(self.cfg.items).choice(sorted(sup.children))
                    proc = sup.children[name].proc
                    if proc is not None:
                        proc.send_signal(signal.SIGKILL)
                        self.rep.faults.append(f"kill -9 {name} at {done1:,} step-1 items")
                if all(left == 0 for _, _, left in steps.values()):
                    break
            time.sleep(0.5)
        self.rep.steps = self._status()
        self._sample()
        self.rep.redis_peak_mb = int(self.conn.info("memory")["used_memory_peak"]) / 1e6
        for proc in sup.running():
            proc.send_signal(signal.SIGTERM)
        for proc in sup.running():
            proc.wait(60)
        screen = self.rep.stages.setdefault("screen", Cost())
        screen.wall_s = time.monotonic() - t0
        for pid, kind in self.pids.items():
            rss, cpu = self.last.get(pid, (0.0, 0.0))
            self.rep.kinds.setdefault(kind, Cost()).add(0.0, cpu, rss)
        screen.cpu_s = sum(c.cpu_s for c in self.rep.kinds.values())
        screen.rss_mb = max(c.rss_mb for c in self.rep.kinds.values())
        screen.out_mb = du_mb(self.root / "results")

    def _sample(self) -> None:
        for pid in self.pids:
            if (got := proc_sample(pid)) is not None:
                self.last[pid] = got

    def _status(self) -> dict[int, tuple[int, int, int]]:
        out, cost = self.stage("status", "pool-status", "--json", "--no-health")
        self.rep.status_s.append(cost.wall_s)
        return {s["step"]: (s["eligible"], s["done"], s["remaining"]) for s in json.loads(out.stdout)["steps"]}


def run_rehearsal(cfg: Config, work: Path) -> Report:
    with Procs(work / "logs") as procs:
        return Rehearsal(cfg, work, procs).run()
