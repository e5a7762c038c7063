"""A real one-node Slurm (slurmctld + slurmd + munged) living in a temporary folder.

The recipe of shared/spec/slurm-local.md, kept private to the test: munged on its own socket and
key, slurm.conf named by SLURM_CONF, state/spool/logs/pids in the folder, free ports. Needs root
and the Debian packages slurm-wlm and munge (`.ci/run` installs them); otherwise the tests skip.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import time
from pathlib import Path

import pytest

from pool_queue.proc.procs import free_port

BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "scancel", "squeue")
GPUS = 2  # declared, not real: `--gres=gpu:N` and `--cpus-per-gpu` are accepted as on a GPU cluster


def _need() -> None:
    missing = [b for b in BINARIES if not shutil.which(b)]
    if missing or os.geteuid() != 0:
        why = f"missing: {missing}" if missing else "not root"
        pytest.skip(f"a local Slurm needs root and slurm-wlm + munge ({why}); .ci/run installs them")


class LocalSlurm:
    def __init__(self, base: Path) -> None:
        _need()
        self.base = base
        self.conf = base / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self._pids: list[Path] = []

    def __enter__(self) -> LocalSlurm:
        b = self.base
        for d in ("munge", "state", "spool", "log"):
            (b / d).mkdir(parents=True, exist_ok=True)
        (b / "munge").chmod(0o700)
        key = b / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        sock = b / "munge" / "sock"
        m = b / "munge"
        subprocess.run(
            ["munged", "--force", f"--socket={sock}", f"--key-file={key}", f"--log-file={m / 'log'}",
             f"--pid-file={m / 'pid'}", f"--seed-file={m / 'seed'}"],
            check=True, timeout=30,
        )  # fmt: skip
        self._pids.append(m / "pid")
        host, mem = socket.gethostname(), os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20
        self.conf.write_text(
            "\n".join([
                "ClusterName=local", f"SlurmctldHost={host}", "SlurmUser=root", "SlurmdUser=root",
                "AuthType=auth/munge", f"AuthInfo=socket={sock}",
                f"StateSaveLocation={b / 'state'}", f"SlurmdSpoolDir={b / 'spool'}",
                f"SlurmctldLogFile={b / 'log' / 'ctld.log'}", f"SlurmdLogFile={b / 'log' / 'd.log'}",
                f"SlurmctldPidFile={b / 'ctld.pid'}", f"SlurmdPidFile={b / 'd.pid'}",
                f"SlurmctldPort={free_port()}", f"SlurmdPort={free_port()}",
                "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "SchedulerType=sched/backfill",
                "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core", "ReturnToService=2",
                "GresTypes=gpu", f"NodeName={host} CPUs={os.cpu_count()} RealMemory={mem - 2000} Gres=gpu:{GPUS}"
                " State=UNKNOWN",
                f"PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP",
            ]) + "\n"
        )  # fmt: skip
        # GPUs to count, none to drive: node jobs ask for them as on a GPU cluster and run simulated servers;
        # each "GPU" is a character device as /dev/null (Slurm checks the kind of file, the job opens none)
        for k in range(GPUS):
            os.mknod(b / f"gpu{k}", stat.S_IFCHR | 0o600, os.makedev(1, 3))
        (b / "gres.conf").write_text(f"NodeName={host} Name=gpu File={b}/gpu[0-{GPUS - 1}]\n")
        for daemon in ("slurmctld", "slurmd"):
            subprocess.run([daemon], check=True, env=self.env, timeout=30)
        self._pids += [b / "ctld.pid", b / "d.pid"]
        deadline = time.monotonic() + 30
        while "idle" not in self.run("sinfo", "-h", "-o", "%t").stdout:
            if time.monotonic() > deadline:
                log = (b / "log" / "d.log").read_text()[-2000:]
                raise RuntimeError(f"the local Slurm node never became idle: {log}")
            time.sleep(0.5)
        return self

    def __exit__(self, *exc: object) -> None:
        self.run("scancel", "--user=root")
        deadline = time.monotonic() + 30  # let every job step report its end before the controller goes
        while self.run("squeue", "-h").stdout.strip() and time.monotonic() < deadline:
            time.sleep(0.5)
        pids = [int(p.read_text().strip()) for p in reversed(self._pids) if p.exists()]
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        for pid in pids:
            while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline + 10:
                time.sleep(0.2)

    def run(self, *argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(list(argv), capture_output=True, text=True, env=self.env, timeout=60)

    def submit(self, script: Path, *opts: str, env: dict[str, str]) -> int:
        """Settings travel in sbatch's environment (--export=ALL), never on its command line."""
        argv = ["sbatch", "--parsable", "--export=ALL", *opts, str(script)]
        out = subprocess.run(argv, capture_output=True, text=True, env={**self.env, **env}, timeout=60)
        if out.returncode != 0:
            raise RuntimeError(f"sbatch {script.name}: {out.stderr}")
        return int(out.stdout.strip().split(";")[0])

    def state(self, job: int) -> tuple[str, str]:
        """(JobState, ExitCode) from scontrol (no accounting database here)."""
        text = self.run("scontrol", "show", "job", str(job)).stdout
        st = re.search(r"JobState=(\S+)", text)
        ec = re.search(r"ExitCode=(\S+)", text)
        return (st.group(1) if st else "GONE", ec.group(1) if ec else "?")

    def wait(self, job: int, timeout: float) -> tuple[str, str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            st = self.state(job)
            if st[0] not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING"):
                return st
            time.sleep(1)
        raise TimeoutError(f"job {job} still {self.state(job)} after {timeout:.0f} s")
