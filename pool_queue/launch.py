"""What pool-launch starts: one model server per GPU with the protocol's fixed arguments.

Only MAX_SEQS (`--max-num-seqs`) and GPU_UTIL (`--gpu-memory-utilization`) may change, as in the
run package; everything that could change what the model computes is fixed here. Server options
that only change throughput (API server count, batched-token budget) are launcher defaults.
The simulated server (`sim=True`) takes the same place for tests and the CPU demo.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass

from .protocol import Protocol
from .settings import Settings

MAX_MODEL_LEN = {"8b": 8192, "2b": 8192}  # step 3: 32 x 196 tokens for square 448-px frames, + text
IMAGES = {"8b": 1, "2b": 32}
MAX_PIXELS = 448 * 448  # the processor never upsizes a protocol frame past 448 x 448
API_SERVERS = {"8b": 4, "2b": 4}  # one API process caps the H200 at ~320 req/s on step 1 (measured)
BATCHED_TOKENS = {"8b": 16384, "2b": 32768}  # step 3 prefill of 32 images: 6.0 -> 6.9 req/s (measured)
# Step 3 is bound by the host copying float32 pixel values (benchmarks/results/h200.md): more API
# servers, renderer threads, torch_shm IPC, ViT CUDA graphs or a second server per GPU did not help.
SIM_PROFILE = {"8b": "qwen3-vl-8b", "2b": "qwen3-vl-2b"}


def model_of(step: int) -> str:
    return "2b" if step == 3 else "8b"


def steps_of(model: str) -> list[int]:
    return [3] if model == "2b" else [1, 2]


@dataclass(frozen=True)
class Server:
    gpu: int  # index among this node's GPUs (ports and log names)
    device: str  # what CUDA_VISIBLE_DEVICES names it (Slurm may hand out e.g. "2,5")
    model: str  # "8b" | "2b"
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def name(self) -> str:
        return f"gpu{self.gpu}"


def plan_servers(s: Settings, step: int | None, split: str | None, devices: list[str]) -> list[Server]:
    """GPU i serves the step's model on PORT0+i; `split` "3+1" puts the 8B on 3 GPUs and the 2B on 1."""
    if split:
        try:
            n8, n2 = (int(x) for x in split.split("+"))
        except ValueError as e:
            raise ValueError(f"--split {split!r}: expected <8B GPUs>+<2B GPUs>, e.g. 3+1") from e
        if n8 < 0 or n2 < 0 or n8 + n2 == 0 or n8 + n2 > len(devices):
            raise ValueError(f"--split {split}: {n8 + n2} GPUs asked, {len(devices)} available")
        models = ["8b"] * n8 + ["2b"] * n2
    else:
        if step is None:
            raise ValueError("give --step N or --split A+B")
        models = [model_of(step)] * len(devices)
    return [Server(i, d, m, s.port0 + i) for i, (d, m) in enumerate(zip(devices, models, strict=False))]


def snapshot(protocol: Protocol, model: str, sim: bool) -> str:
    """The local snapshot folder of the pinned revision (so /v1/models shows the revision)."""
    spec = protocol.steps[steps_of(model)[0]]
    if sim:
        return spec.model
    from huggingface_hub import snapshot_download

    return snapshot_download(spec.model, revision=spec.revision, local_files_only=True)


def server_argv(s: Settings, protocol: Protocol, srv: Server, model_path: str, sim: bool) -> list[str]:
    spec = protocol.steps[steps_of(srv.model)[0]]
    fixed = [
        "--served-model-name", spec.served_name,
        "--port", str(srv.port),
        "--max-logprobs", str(protocol.top_logprobs),
        "--limit-mm-per-prompt", json.dumps({"image": IMAGES[srv.model], "video": 0}),
        "--max-model-len", str(MAX_MODEL_LEN[srv.model]),
        "--max-num-seqs", str(s.max_seqs),
    ]  # fmt: skip
    if sim:
        return [sys.executable, "-m", "pool_queue.sim", "--profile", SIM_PROFILE[srv.model], *fixed]
    return [
        *shlex.split(s.vllm), "serve", model_path, *fixed,
        "--host", "0.0.0.0",
        "--gpu-memory-utilization", str(s.gpu_util),
        "--mm-processor-kwargs", json.dumps({"max_pixels": MAX_PIXELS}),
        "--dtype", "bfloat16",
        "--api-server-count", str(API_SERVERS[srv.model]),
        "--max-num-batched-tokens", str(BATCHED_TOKENS[srv.model]),
    ]  # fmt: skip


def server_env(srv: Server, sim: bool) -> dict[str, str]:
    env = {"CUDA_VISIBLE_DEVICES": srv.device} if not sim else {}
    if "HF_HUB_OFFLINE" not in os.environ:
        env["HF_HUB_OFFLINE"] = "1"  # the models were fetched before (pool-fetch): never reach the hub mid-run
    return env


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
    """`vllm_s1_gpu0`, `client_s1_gpu0` (the run package's names); the tag is the step or the split."""
    return f"{kind}_s{step_tag}_gpu{srv.gpu}"
