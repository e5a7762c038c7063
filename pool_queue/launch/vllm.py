"""What one model server is started with: the protocol's fixed arguments, the throughput-only options.

Only MAX_SEQS (`--max-num-seqs`) and GPU_UTIL (`--gpu-memory-utilization`) may change, as in the
run package; everything that could change what the model computes is fixed here. Server options
that only change throughput (`Tuning`: API servers, renderer threads, processor cache, OpenMP
threads) come from the host's cores per server, as measured on the H200 (benchmarks/results/h200.md),
and a flag the installed vLLM does not know is left out (`vllm_flags`; its release, `vllm_release`, each
asked once per host and installation). The simulated server (`sim=True`) takes the same place for tests and
the CPU demo.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..inputs.frames import sample_sizes, served_size
from ..protocol import Protocol
from ..settings import Settings
from ..text import steps_label
from .plan import Server
from .sizing import FALLBACK_SEQS, MAX_MODEL_LEN, Sizing, frame_tokens, many_images, step_budget

SIM_COMMAND = (sys.executable, "-m", "pool_queue.sim")  # the simulated server; its arguments follow
MAX_PIXELS = 448 * 448  # the processor never upsizes a protocol frame past 448 x 448
# Prefill budget per engine step: a model whose requests carry many images gets twice the tokens
# (step 3's 32 images: 6.0 -> 6.9 req/s, measured). MAX_BATCHED_TOKENS=derived sizes it from the frames.
BATCHED_TOKENS, BATCHED_TOKENS_MANY_IMAGES = 16384, 32768
# The first release whose encoder outputs stay held across two engine steps: async scheduling on by default
# and outputs freed only after their step ran (read in 0.26.0's and 0.32.0's source; 0.11.0 does neither).
TWO_STEPS_SINCE = "0.12.0"
SIM_BUDGET = "(for a vLLM server; the simulator has no prefill budget)"  # said after a simulated launch's budget
FRAME_SAMPLE = 16  # video folders whose first frame tells the pool's frame size
# Flags that change only throughput, and the first vLLM release that knows each (from its source).
OPTIONAL_FLAGS = {
    "--api-server-count": "0.10.0",
    "--mm-processor-cache-gb": "0.10.1",
    "--renderer-num-workers": "0.19.0",
}


# What a release of vLLM gains for the workers' batch path (from its source; docs/deployment.md).
BATCH_SINCE = "0.22.0"  # /v1/chat/completions/batch: a video's items as one request
CACHE_THREADS_SINCE = "0.27.0"  # the processor cache with more than one renderer thread
FRAME_MIB = 1.4  # one 448-px frame as the processor keeps it in its cache (32 frames: ~44 MB)
CACHE_SHARE = 0.125  # the processor caches of a host's servers take at most this share of its memory


@dataclass(frozen=True)
class Tuning:
    """Throughput-only server options. On a 16-core H200 host, step 3 went from 7.3 to 20.5 items/s and
    the GPU from 30 to 91 % busy: OpenMP's default threads in the engine core fought the API servers
    for the cores, then one preprocessing thread per API server was the limit (h200.md). With the batch
    endpoint the workers send a video's items as one request whose siblings name the frames by uuid: the
    API server's processor cache then processes each frame once (step 3's server CPU per item 244 -> 115 ms
    on an H100, vLLM 0.26: benchmarks/results/h100-2026-12-06-batch)."""

    api_servers: int
    renderer_workers: int
    processor_cache_gb: float = 0  # without batches every frame reaches a server once: a cache only costs a copy
    omp_threads: int = 1
    why: str = "no batch endpoint: one request per forward, no processor cache"

    @classmethod
    def for_cores(
        cls,
        cores: int,
        api_servers: int | None = None,
        renderer_workers: int | None = None,
        release: str | None = None,
        cache_gb: float = 0.0,
    ) -> Tuning:
        """16 cores per server (the H200 host) -> 8 API servers and 3 renderer threads; fewer cores, fewer.
        A release with the batch endpoint gets `cache_gb` of processor cache per API server, and on releases
        before CACHE_THREADS_SINCE the one renderer thread the cache needs (unless RENDERER_WORKERS is set:
        then no cache, and the workers send every frame)."""
        api = api_servers or max(1, min(8, cores // 2))
        threads = renderer_workers or max(1, min(3, cores // 5))
        if release is None or _release_key(release) < _release_key(BATCH_SINCE):
            return cls(api, threads)
        if _release_key(release) >= _release_key(CACHE_THREADS_SINCE):
            why = f"batch requests; vLLM {release} caches with {threads} renderer thread(s)"
            return cls(api, threads, cache_gb, why=why)
        if renderer_workers and renderer_workers > 1:
            return cls(api, threads, why=f"batch requests without a cache: RENDERER_WORKERS={threads} on {release}")
        return cls(api, 1, cache_gb, why=f"batch requests; vLLM {release}'s processor cache needs 1 renderer thread")


def cache_gb_per_api_server(frames: int, inflight: int, api_servers: int, servers: int, host_gib: float) -> float:
    """Enough processor cache for the videos in flight on one API server, twice over (one video per forward
    at worst), within CACHE_SHARE of the host's memory for all its servers' API servers; tenths of a GiB."""
    videos = -(-inflight // max(1, api_servers))
    want = 2 * videos * max(1, frames) * FRAME_MIB / 1024
    cap = CACHE_SHARE * host_gib / max(1, api_servers * servers)
    return max(0.1, math.ceil(min(want, cap) * 10) / 10)


def _release_key(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in version.split("+")[0].split(".")[:3] if x.isdigit())


def flags_of_release(version: str) -> frozenset[str]:
    """The optional flags a vLLM release knows, from OPTIONAL_FLAGS (compose pins a release)."""
    return frozenset(f for f, since in OPTIONAL_FLAGS.items() if _release_key(version) >= _release_key(since))


def cache_dir() -> Path:
    """Where vLLM keeps its compile cache and we keep the flags probe: beside the models in the hub cache
    (HF_HOME, mounted into containers and shared by Slurm nodes), so a restarted server reuses them."""
    from huggingface_hub import constants

    return Path(os.environ.get("VLLM_CACHE_ROOT") or Path(constants.HF_HOME) / "vllm-cache")


def vllm_flags(vllm: str) -> frozenset[str] | None:
    """The optional flags that `<vllm> serve` knows (its `--help`)."""
    known = _probe(vllm, "flags", lambda: None if (f := _ask_flags(vllm)) is None else sorted(f))
    return None if known is None else frozenset(known)


def vllm_release(vllm: str) -> str | None:
    """The installed vLLM's release (`<vllm> --version`), which decides what the workers' requests may use."""
    found = _probe(vllm, "release", lambda: _ask_release(vllm))
    return found if isinstance(found, str) else None


def _probe(vllm: str, what: str, ask: Callable[[], Any]) -> Any:
    """Asked once per host and installed vLLM (each question costs a full import, ~10 s), then kept in the
    cache folder; None when it cannot be told."""
    memo = cache_dir() / f"pool-{what}-{_install_key(vllm)}.json"
    try:
        return json.loads(memo.read_text())
    except (OSError, ValueError):
        pass
    found = ask()
    if found is not None:
        with contextlib.suppress(OSError):  # a read-only cache: ask again next time
            memo.parent.mkdir(parents=True, exist_ok=True)
            memo.write_text(json.dumps(found))
    return found


def _ask_release(vllm: str) -> str | None:
    """From the package's metadata beside the program (no import), else from `--version`."""
    exe = shutil.which(shlex.split(vllm)[0]) or vllm
    for d in _package_dir(exe) or ():
        if m := re.fullmatch(r"vllm(?:_cpu)?-(\d+\.\d+\.\d+[^-]*)\.dist-info", Path(d).name):
            return m.group(1)
    try:
        argv = [*shlex.split(vllm), "--version"]
        out = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = re.findall(r"^(\d+\.\d+\.\d+\S*)\s*$", out.stdout, re.M)
    return found[-1] if found else None


def _install_key(vllm: str) -> str:
    """This host and this installation of vLLM: the command, and where its program and package live and when
    they were written (an upgrade rewrites them)."""
    argv = shlex.split(vllm)
    exe = shutil.which(argv[0]) or argv[0]
    parts = [socket.gethostname(), vllm]
    for path in (exe, *(_package_dir(exe) or ())):
        with contextlib.suppress(OSError):
            st = os.stat(path)
            parts += [os.path.realpath(path), str(st.st_mtime_ns)]
    return hashlib.sha1("\0".join(parts).encode()).hexdigest()[:16]


def _package_dir(exe: str) -> list[str] | None:
    """The vllm package folders beside the Python that `exe` runs (its site-packages), if any."""
    base = Path(os.path.realpath(exe)).parent.parent
    found = sorted(str(p) for p in base.glob("lib/python3*/site-packages/vllm*") if p.is_dir())
    return found or None


def _ask_flags(vllm: str) -> frozenset[str] | None:
    """One `serve --help` call; None when its help cannot be read."""
    for ask in ("--help=all", "--help"):  # vLLM >= 0.10 lists only groups under a bare --help
        try:
            out = subprocess.run(
                [*shlex.split(vllm), "serve", ask], capture_output=True, text=True, timeout=300, check=False
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        text = out.stdout + out.stderr
        if "--max-num-seqs" in text:
            return frozenset(f for f in OPTIONAL_FLAGS if f in text)
    return None


def images_per_prompt(protocol: Protocol, steps: tuple[int, ...]) -> int:
    """The most frames one request of these steps carries, from the protocol (a protocol file that
    sends more frames raises the server's limit with it)."""
    return max(len(protocol.frame_indices(s, protocol.steps[s].n_frames or 1)) for s in steps)


def steps_held(release: str | None) -> int:
    """Engine steps whose encoder outputs a server holds at once. vLLM sizes the vision encoder's budget per
    step and its output cache both to `--max-num-batched-tokens`. 0.11.0 runs one step at a time (async
    scheduling off) and frees a request's encoder inputs once it is scheduled: 1. From TWO_STEPS_SINCE async
    scheduling keeps two steps in flight and outputs are freed only after their step ran: 2. An unknown
    release is taken as a newer one."""
    return 1 if release is not None and _release_key(release) < _release_key(TWO_STEPS_SINCE) else 2


@dataclass(frozen=True)
class Frame:
    """The frame size served to the model, and where it was read."""

    width: int
    height: int
    source: str

    @property
    def tokens(self) -> int:
        return frame_tokens(self.width, self.height)


def served_frame(settings: Settings, protocol: Protocol) -> Frame:
    """The pool's frames as served (long side `image_long_side`): the one of most tokens among the first frames
    of FRAME_SAMPLE videos; without frames on disk the protocol's largest, a square one."""
    side = protocol.image_long_side
    read = sample_sizes(settings.frames_dir, FRAME_SAMPLE)
    if not read:
        return Frame(side, side, "the protocol's largest")
    w, h = max((served_size(w, h, side) for w, h in read), key=lambda wh: frame_tokens(*wh))
    return Frame(w, h, f"the pool's frames: the largest of {len(read)} videos' first")


@dataclass(frozen=True)
class Budget:
    """`--max-num-batched-tokens` for one model group, and its plan line."""

    tokens: int
    why: str


def default_budget(protocol: Protocol, steps: tuple[int, ...]) -> int:
    return BATCHED_TOKENS_MANY_IMAGES if many_images(protocol, steps) else BATCHED_TOKENS


def batched_tokens(
    settings: Settings, protocol: Protocol, steps: tuple[int, ...], sized: Sizing, release: str | None
) -> Budget:
    """The user's MAX_BATCHED_TOKENS for every server; `derived` sizes a many-image group's from its frames per
    item, the frame size served (`served_frame`) and the release (`steps_held`, `sizing.step_budget`);
    otherwise the default."""
    name, default = f"{steps_label(steps)}: --max-num-batched-tokens", default_budget(protocol, steps)
    if isinstance(settings.max_batched_tokens, int):
        return Budget(settings.max_batched_tokens, f"{name} {settings.max_batched_tokens:,}: MAX_BATCHED_TOKENS as set")
    if settings.max_batched_tokens is None or default == BATCHED_TOKENS:
        derive = "; MAX_BATCHED_TOKENS=derived sizes it from the frames" if default != BATCHED_TOKENS else ""
        return Budget(default, f"{name} {default:,}: the default{derive}")
    frames, held, frame = images_per_prompt(protocol, steps), steps_held(release), served_frame(settings, protocol)
    per_video = frames * frame.tokens
    how = "two steps in flight" if held == 2 else "one step at a time"
    on = f"vLLM {release}" if release else "an unknown vLLM release, taken as a newer one"
    tokens, why = step_budget(per_video, held, default, sized)
    return Budget(tokens, (f"{name} {tokens:,} (MAX_BATCHED_TOKENS=derived): {frames} frames x "
                           f"{frame.tokens} tokens ({frame.width}x{frame.height}, {frame.source}) = {per_video:,} per "
                           f"video; {on} holds encoder outputs for {how}: {why}"))  # fmt: skip


def snapshot(protocol: Protocol, steps: tuple[int, ...], sim: bool) -> str:
    """The local snapshot folder of the pinned revision (so /v1/models shows the revision)."""
    spec = protocol.steps[steps[0]]
    if sim:
        return spec.model
    from huggingface_hub import snapshot_download

    return snapshot_download(spec.model, revision=spec.revision, local_files_only=True)


def server_argv(
    settings: Settings,
    protocol: Protocol,
    srv: Server,
    model_path: str,
    sim: bool,
    tuning: Tuning | None,
    known: frozenset[str] | None = None,
    max_seqs: int | None = None,
    budget: int | None = None,
) -> list[str]:
    """`tuning`: the throughput-only options (none: vLLM's defaults; a simulator takes none of them).
    `known`: the optional flags the installed vLLM accepts (`vllm_flags`); None passes them all.
    `max_seqs`: the derived batch (`sizing.size`), when MAX_SEQS is not set; `budget`: the prefill budget
    (`batched_tokens`), else the default."""
    spec, images = protocol.steps[srv.steps[0]], images_per_prompt(protocol, srv.steps)
    fixed = [
        "--served-model-name", spec.served_name,
        "--port", str(srv.port),
        "--max-logprobs", str(protocol.top_logprobs),
        "--limit-mm-per-prompt", json.dumps({"image": images, "video": 0}),
        "--max-model-len", str(MAX_MODEL_LEN),
        "--max-num-seqs", str(settings.max_seqs_for(srv.steps) or max_seqs or FALLBACK_SEQS),
    ]  # fmt: skip
    if sim:
        return [*SIM_COMMAND, "--model", spec.model, *fixed]
    return [
        *shlex.split(settings.vllm), "serve", model_path, *fixed,
        "--host", "0.0.0.0",
        "--gpu-memory-utilization", str(srv.util or settings.gpu_util),
        "--mm-processor-kwargs", json.dumps({"max_pixels": MAX_PIXELS}),
        "--dtype", "bfloat16",
        "--max-num-batched-tokens", str(budget or default_budget(protocol, srv.steps)),
        *(optional_args(tuning, known) if tuning else []),
    ]  # fmt: skip


def optional_args(tuning: Tuning, known: frozenset[str] | None) -> list[str]:
    want = {
        "--api-server-count": tuning.api_servers,
        "--mm-processor-cache-gb": tuning.processor_cache_gb,
        "--renderer-num-workers": tuning.renderer_workers,
    }
    return [x for flag, v in want.items() if known is None or flag in known for x in (flag, str(v))]


def server_env(srv: Server, sim: bool, tuning: Tuning | None = None) -> dict[str, str]:
    env = {"CUDA_VISIBLE_DEVICES": srv.device} if not sim else {}
    if tuning is not None and not sim and "OMP_NUM_THREADS" not in os.environ:
        env["OMP_NUM_THREADS"] = str(tuning.omp_threads)  # the user's own setting wins
    if "HF_HUB_OFFLINE" not in os.environ:
        env["HF_HUB_OFFLINE"] = "1"  # the models were fetched before (pool-fetch): never reach the hub mid-run
    if not sim and "VLLM_CACHE_ROOT" not in os.environ:
        env["VLLM_CACHE_ROOT"] = str(cache_dir())  # torch.compile's cache: a restart takes ~1 min, not ~4
    return env
