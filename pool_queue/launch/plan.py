"""Where pool-launch's servers go: one model server per GPU on PORT0+i, the phases one after the other, the
ports every server and worker binds, the GPUs this node has, the cores each server gets, and the log names
(the run package's `vllm_s<STEP>_gpu<i>`, `client_s<STEP>_gpu<i>`). What each server is started with is
`launch.vllm`'s.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass

from ..errors import SetupError
from ..protocol import Protocol
from ..settings import Settings
from ..text import steps_label
from .sizing import many_images


def cores_per_server(n_servers: int) -> int:
    """This process's cores (Slurm's and docker's CPU sets count) shared by the node's servers."""
    return max(1, len(os.sched_getaffinity(0)) // max(1, n_servers))


def server_cores(protocol: Protocol, servers: list[Server], srv: Server) -> int:
    """The GPU's cores (the host's, shared by its GPUs) for one of its servers. Sharing its GPU, the steps-1-2
    server takes half of them and step 3's all of its (preprocessing is step 3's limit): as measured co-served
    on the H200 (h200.md, 4 and 8 API servers on 16 cores)."""
    cores = cores_per_server(len({v.device for v in servers}))
    if srv.util is not None and not many_images(protocol, srv.steps):
        return max(1, cores // 2)
    return cores


@dataclass(frozen=True)
class Server:
    gpu: int  # index among this node's GPUs (log names)
    device: str  # what CUDA_VISIBLE_DEVICES names it (Slurm may hand out e.g. "2,5")
    steps: tuple[int, ...]  # the protocol's steps its model answers (`Protocol.model_groups`)
    port: int
    util: float | None = None  # its GPU_UTIL share when it shares the GPU with the other model (`coserve`)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def name(self) -> str:
        return f"gpu{self.gpu}" if self.util is None else f"gpu{self.gpu}-s{'-'.join(map(str, self.steps))}"


def plan_servers(
    settings: Settings, protocol: Protocol, step: int | None, split: str | None, devices: list[str]
) -> list[Server]:
    """GPU i serves the step's model on PORT0+i; `split` "3+1" puts the protocol's first model (steps 1-2)
    on 3 GPUs and its second (step 3) on 1."""
    groups = protocol.model_groups()
    if split:
        counts = split_counts(protocol, split)
        if sum(counts) > len(devices):
            raise SetupError(f"--split {split}: {sum(counts)} GPUs asked, {len(devices)} available")
        plan = [g for g, n in zip(groups, counts, strict=True) for _ in range(n)]
    else:
        if step is None:
            raise SetupError("give --step N or --split A+B")
        plan = [protocol.model_group(step)] * len(devices)
    return [Server(i, d, g, settings.port0 + i) for i, (d, g) in enumerate(zip(devices, plan, strict=False))]


def metrics_port(srv: Server, k: int) -> int:
    """Worker process k of a server serves its /metrics here (k = 0: the run package's PORT0+100+i)."""
    return srv.port + 100 + 16 * k


def ports(phases: list[list[Server]], processes: dict[tuple[int, ...], int]) -> list[int]:
    """Every port a launch binds, servers' and their workers' metrics, over all its phases (`processes`: worker
    processes per model group)."""
    found = {srv.port for servers in phases for srv in servers}
    found |= {metrics_port(srv, k) for servers in phases for srv in servers for k in range(processes[srv.steps])}
    return sorted(found)


def split_counts(protocol: Protocol, split: str) -> list[int]:
    """`--split A+B` as GPUs per model group, checked without looking at the GPUs (so `--plan-only` refuses
    what a launch would): one count per group, none negative, at least one GPU in all."""
    groups = protocol.model_groups()
    parts = split.split("+")
    counts = [int(x) for x in parts if x.strip().isdigit()]
    if len(counts) != len(parts) or len(counts) != len(groups) or sum(counts) == 0:
        want = "+".join(f"<GPUs for {steps_label(g)}>" for g in groups)
        raise SetupError(f"--split {split!r}: expected {want}, at least one GPU in all, e.g. 3+1")
    return counts


def plan_phases(
    settings: Settings,
    protocol: Protocol,
    step: int | None,
    split: str | None,
    devices: list[str],
    shares: dict[tuple[int, ...], float] | None = None,
) -> list[list[Server]]:
    """What pool-launch runs, one phase after the other. `--step N` or `--split A+B` is one phase. Neither
    is the whole screen. On one GPU with `shares` (`sizing.coserve`: both models get their best batch
    in it) both models are served at once, each on its share, so step 3's CPU-bound preprocessing
    overlaps steps 1-2 (1.43 times the work of one after the other, h200.md). Otherwise one phase per
    model group in step order, each on every GPU (steps 1-2 on the 8B, then step 3 on the 2B), handed
    over when the group's queues are empty: on several GPUs each phase fills them all (h200.md: a 3+1
    split leaves step 3 on one GPU)."""
    if step is not None or split:
        return [plan_servers(settings, protocol, step, split, devices)]
    if len(devices) == 1 and shares:
        return [[Server(0, devices[0], g, settings.port0 + i, util) for i, (g, util) in enumerate(shares.items())]]
    return [[Server(i, d, g, settings.port0 + i) for i, d in enumerate(devices)] for g in protocol.model_groups()]


def log_tag(srv: Server, step: int | None, split: str | None) -> str:
    """The log names' step part: the step (run package), the split (`3p1`), or the server's steps (`1-2`)."""
    if step is not None:
        return str(step)
    if split:
        return split.replace("+", "p")
    return "-".join(map(str, srv.steps))


def devices(ngpu: int | None, sim: bool) -> list[str]:
    """This node's GPUs: CUDA_VISIBLE_DEVICES (as Slurm sets it), else nvidia-smi; NGPU keeps the first N."""
    cvd = os.environ.get("CUDA_VISIBLE_DEVICES")
    if cvd is not None:
        found = [x.strip() for x in cvd.split(",") if x.strip()]
    elif shutil.which("nvidia-smi"):
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=False).stdout
        found = [str(i) for i, line in enumerate(x for x in out.splitlines() if x.startswith("GPU "))]
    else:
        found = []
    if sim:  # simulated servers need no GPU: NGPU of them (default 1)
        return found[: ngpu or 1] if found else [str(i) for i in range(ngpu or 1)]
    return found[:ngpu] if ngpu else found


def log_name(kind: str, step_tag: str, srv: Server) -> str:
    """`vllm_s1_gpu0`, `client_s1_gpu0` (the run package's names); the tag is `log_tag`'s."""
    return f"{kind}_s{step_tag}_gpu{srv.gpu}"
