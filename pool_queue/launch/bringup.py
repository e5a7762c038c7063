"""pool-launch's bring-up on one node: the phases one after the other; in each, the servers started on every
GPU at once (each GPU's one after the other) with the options derived from its cores and memory, each server's
workers started as it becomes healthy and restarted when they die, until the queues are empty (`burst`) or a
signal; then the drain: no new jobs, in-flight forwards finish, rows written, jobs acknowledged, servers
stopped. Before anything starts: the frame cache, the GPUs' memory, the ports and Redis (waited for).
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import httpx
from huggingface_hub.errors import LocalEntryNotFoundError
from redis import AuthenticationError, RedisError

from ..cli import fail
from ..jobs.queue import Screen
from ..jobs.steps import check_frames, run_steps
from ..observe.presence import HoldNews
from ..proc.hostlock import hold
from ..proc.procs import Procs, StopRequest, free_port, port_taken, wait_health
from ..proc.progress import duration
from ..protocol import BATCH_PATH, Protocol, lists_batch
from ..settings import BURST_WAIT_S, Settings, redis_data, url_from_file
from ..sim.__main__ import options as sim_options
from ..text import steps_label
from .plan import Server, devices, log_name, log_tag, metrics_port, plan_phases, ports, server_cores
from .sizing import Sizing, coserve, gpu_memory_gib, many_images, size
from .supervise import Supervisor
from .vllm import (
    OPTIONAL_FLAGS,
    SIM_BUDGET,
    SIM_COMMAND,
    Budget,
    Tuning,
    batched_tokens,
    cache_gb_per_api_server,
    server_argv,
    server_env,
    snapshot,
    vllm_flags,
    vllm_release,
)


@dataclass(frozen=True)
class SimServers:
    """`--sim`: simulated servers instead of vLLM, this much faster than an H200, each answering /health
    503 for `warmup_s` after its start, on a simulated GPU of `gpu_gib` (None: unknown)."""

    speed: float = 20.0
    warmup_s: float = 0.0
    gpu_gib: float | None = None


@dataclass(frozen=True)
class LaunchRun:
    """One pool-launch as asked for: its settings and protocol, the steps it screens, `--step` or `--split`
    (neither: every step, phase after phase), `--burst`, the simulated servers (None: vLLM), the wait for each
    server's health, and the folder flags it was given, which its pool-status line repeats."""

    settings: Settings
    protocol: Protocol
    step: int | None = None
    split: str | None = None
    burst: bool = False
    sim: SimServers | None = None
    health_timeout_s: float = 1200.0
    folder_flags: tuple[str, ...] = ()

    @property
    def steps(self) -> list[int]:
        """`--step`'s one step; a split or the whole screen: every step."""
        return [self.step] if self.step else sorted(self.protocol.steps)


@dataclass(frozen=True)
class Phase:
    """One phase as it runs: the processes it started, the screen its workers serve, its servers' sizes, whether
    it ends when its queues are empty, and its servers as they come up."""

    procs: Procs
    screen: Screen
    sizes: dict[tuple[int, ...], Sizing]
    burst: bool
    ready: Bringup


OOM_HINTS = ("out of memory", "CUDA error: out of memory", "OutOfMemoryError", "No available memory for the cache")


def _wait_healthy(procs: Procs, name: str, srv: Server, timeout: float, note_s: float) -> str | None:
    """None when /health answers 200; else why not. A vLLM start takes minutes (loading, profiling, graphs):
    the wait says so every `note_s` (POOL_WAIT_NOTE_S), with how long so far and its bound."""
    t0 = time.monotonic()
    while True:
        left = timeout - (time.monotonic() - t0)
        try:
            wait_health(srv.url, min(note_s, left), procs.children[name], poll_s=1.0)
            return None
        except ChildProcessError as e:
            return str(e)
        except TimeoutError:
            if left <= note_s:
                return f"{srv.url}/health did not answer 200 within {timeout:.0f} s (--health-timeout)"
        print(f"{srv.name}: still starting after {duration(time.monotonic() - t0)} (vLLM loads the model, profiles "
              f"its memory; its log: {name}.log), gives up after {duration(timeout)}", flush=True)  # fmt: skip


def _explain(log: Path, why: str) -> str:
    tail = log.read_text(errors="replace").splitlines()[-40:] if log.exists() else []
    msg = [f"{log.stem}: {why}; last lines of {log}:", *("  " + line for line in tail)]
    if any(h.lower() in line.lower() for line in tail for h in OOM_HINTS):
        msg.append(
            "out of GPU memory at start-up: lower MAX_SEQS (e.g. 64 -> 32) or GPU_UTIL; "
            "do not lower the resolution or the frame count"
        )
    return "\n".join(msg)


def _flags_known(vllm: str) -> frozenset[str] | None:
    """Ask the installed vLLM once which optional flags it knows."""
    known = vllm_flags(vllm)
    if known is None:
        print(f"could not read `{vllm} serve --help`: passing every option", file=sys.stderr)
    elif missing := [f"{f} (vLLM >= {v})" for f, v in OPTIONAL_FLAGS.items() if f not in known]:
        print("this vLLM does not know " + ", ".join(missing) + ": left out", file=sys.stderr)
    return known


def launch(run: LaunchRun) -> None:
    """What pool-launch does once its flags are read (and it was not asked for the plan only): the frame cache
    checked for the steps it serves, the GPUs found and sized, the ports checked, then its phases run one
    after the other; anything refused is refused before anything starts."""
    settings, protocol, sim = run.settings, run.protocol, run.sim
    check_frames(settings, protocol, list(protocol.model_group(run.step)) if run.step else run.steps)  # what it serves
    found = devices(settings.ngpu, sim is not None)
    if not found:
        fail("no GPU visible (CUDA_VISIBLE_DEVICES / nvidia-smi); NGPU=N or --sim for simulated servers")
    gib = sim.gpu_gib if sim is not None else gpu_memory_gib(found[0])
    shares = None if run.step or run.split else coserve(protocol, gib, settings.gpu_util)
    phases = plan_phases(settings, protocol, run.step, run.split, found, shares)
    # a GPU too small: refused before any start
    sizes = [_sizes(settings, protocol, servers, gib) for servers in phases]
    # a second launcher here would fight for the same ports
    hold("pool-launch", settings.root, f"PORT0 {settings.port0}")
    stop = StopRequest().install()  # Ctrl-C, SIGTERM, SIGHUP: a drain instead of killing the launcher
    with Procs(settings.logs_dir) as own:  # an embedded Redis (--sim) lives as long as the launch
        _check_ports(phases, sizes)  # once what a killed launch left running here is stopped (entering `own`)
        _phases(run, len(found), phases, sizes, stop, own)


def _phases(
    run: LaunchRun,
    gpus: int,
    phases: list[list[Server]],
    sizes: list[dict[tuple[int, ...], Sizing]],
    stop: StopRequest,
    own: Procs,
) -> None:
    """The phases one after the other; one that ends when its queues are empty starts only the servers whose
    steps have work."""
    settings, protocol, steps = run.settings, run.protocol, run.steps
    if run.sim is not None:
        settings = _sim_redis(settings, own)
    # before any server starts: a node job resubmitted during a Redis restart waits
    settings = _wait_redis(settings, stop)
    run = replace(run, settings=settings)
    if run.step is None and not run.split:

        def on(v: Server) -> str:
            return f"{steps_label(v.steps)} on {protocol.steps[v.steps[0]].model}"

        if len(phases) > 1:
            print(f"{gpus} GPU(s), every step: " + ", then ".join(on(ph[0]) for ph in phases))
        else:
            print("1 GPU, every step, both models at once: " + " and ".join(f"{on(v)} (GPU_UTIL {v.util:g})"
                                                                            for v in phases[0]))  # fmt: skip
    served: set[int] = set()
    screen: Screen | None = None
    for i, (servers, sized) in enumerate(zip(phases, sizes, strict=True)):
        last = i == len(phases) - 1
        with Procs(settings.logs_dir) as procs:
            screen, remaining = run_steps(settings, protocol, steps, plan_only=False, label=run.step is None,
                                          frames_checked=True)  # fmt: skip
            assert screen is not None  # run_steps stamped the results root
            burst = run.burst or not last  # a phase that hands over to the next ends when its queues are empty
            if burst:  # else it serves until a signal, for work that may still come
                servers = _with_work(protocol, servers, remaining)
            if not servers:
                continue
            for g in dict.fromkeys(v.steps for v in servers):
                print(sized[g].why)
            ready = _start_servers(procs, run, servers, sized)
            codes = _supervise(run, Phase(procs, screen, sized, burst, ready), stop)
        served |= {step for v in servers for step in v.steps}
        if any(codes):
            fail(f"worker exit codes {codes}: see {settings.logs_dir}/client_s*_gpu*.log", code=1)
        if stop.is_set():
            break
    run_steps(settings, protocol, steps, plan_only=True, label=run.step is None)
    if screen is not None:
        _say_what_waits(protocol, screen, served)


def _with_work(protocol: Protocol, servers: list[Server], remaining: dict[int, int]) -> list[Server]:
    """The servers to start in a phase that ends when its queues are empty: not one whose steps all show
    REMAINING_TOTAL=0 (a resume after steps 1-2 are complete starts no 8B: a model's start costs minutes of a
    GPU), said in one line per model left out."""
    idle = {v for v in servers if all(remaining.get(step) == 0 for step in v.steps)}
    for g in dict.fromkeys(v.steps for v in servers if v in idle):
        print(f"{steps_label(g)}: REMAINING_TOTAL=0, nothing to do: {protocol.steps[g[0]].model} "
              "is not started")  # fmt: skip
    return [v for v in servers if v not in idle]


def _check_ports(phases: list[list[Server]], sizes: list[dict[tuple[int, ...], Sizing]]) -> None:
    """Every port the launch will bind, servers' and workers' metrics, free before anything starts: else one line
    naming them (a server that finds its port taken would only fail minutes later, in its log)."""
    processes = {g: sz.processes for sized in sizes for g, sz in sized.items()}
    if taken := [p for p in ports(phases, processes) if port_taken(p)]:
        fail(f"port(s) {', '.join(map(str, taken))} already in use on this host (servers listen on PORT0+i, their "
             "workers' metrics on PORT0+100+i+16k): stop what holds them, or give another PORT0")  # fmt: skip


def _sim_redis(settings: Settings, procs: Procs) -> Settings:
    """The CPU path: `--sim` with no Redis named (flag, environment, .env or POOL_REDIS_URL_FILE) and none
    answering at the default address starts an embedded one, as pool-demo does (its append-only file under
    <root>/redis-data, so a rerun resumes its queue), stopped with the launch. A Redis that was named is waited
    for, but with --sim only as long as `pool-worker --burst` waits, unless POOL_WAIT_REDIS_S is set."""
    if "redis_url" in settings.model_fields_set or settings.redis_url_file is not None:
        if "wait_redis_s" in settings.model_fields_set or settings.redis_url_file is not None:
            return settings
        return settings.model_copy(update={"wait_redis_s": min(settings.wait_redis_s, BURST_WAIT_S)})
    try:
        settings.redis().ping()
        return settings
    except AuthenticationError:
        raise
    except RedisError:
        pass
    url = procs.redis(free_port(), redis_data(settings.root, settings.results_dir), aof=True)
    print(f"--sim: no Redis at {settings.redis_where()}, so an embedded one runs at {url} for this launch (stopped "
          f"with it; `pool-status --redis-url {url}` meanwhile)", file=sys.stderr, flush=True)  # fmt: skip
    return settings.model_copy(update={"redis_url": url})


def _wait_redis(settings: Settings, stop: StopRequest) -> Settings:
    """Until Redis answers: one line when the outage begins (and every POOL_WAIT_NOTE_S while it lasts) and one
    when it ends, up to POOL_WAIT_REDIS_S; a refused password is not an outage (one line, exit 2, at once).
    With POOL_REDIS_URL_FILE (a Slurm Redis job writes its address there) and no REDIS_URL, the address is read
    from the file at every try: a node job submitted before the Redis job, or after it moved to another host,
    waits for the address that answers. The first SIGTERM or Ctrl-C ends the wait (nothing has started yet).
    Returns the settings with the URL that answered."""
    base, t0, pause, said = settings, time.monotonic(), 0.2, ""
    noted = t0
    while True:
        settings, why = url_from_file(base)
        if why is None:
            try:
                settings.redis().ping()
                break
            except AuthenticationError:
                raise
            except RedisError as e:
                why = f"Redis at {settings.redis_said()} unreachable ({type(e).__name__})"
                if (gone := settings.demo_gone()) is not None:  # its Redis stopped with the demo: no wait can help
                    fail(gone)
        if why != said:  # the wait's cause, said once (again only when it changes)
            print(
                f"{why}; waiting up to {settings.wait_redis_s:.0f} s (POOL_WAIT_REDIS_S)", file=sys.stderr, flush=True
            )
            said, noted = why, time.monotonic()
        elif time.monotonic() - noted >= settings.wait_note_s:  # a long wait says so again, without repeating its cause
            noted = time.monotonic()
            print(f"still waiting for Redis: {duration(noted - t0)} so far, "
                  f"gives up after {duration(settings.wait_redis_s)} (POOL_WAIT_REDIS_S)",
                  file=sys.stderr, flush=True)  # fmt: skip
        if time.monotonic() - t0 > settings.wait_redis_s:
            fail(f"{why}: gave up after {settings.wait_redis_s:.0f} s (POOL_WAIT_REDIS_S)")
        if stop.wait(pause):
            print("pool-launch: signal received while waiting for Redis: nothing started, stopping", file=sys.stderr)
            raise SystemExit(0)
        pause = min(2 * pause, 2.0)
    if said:
        print(
            f"Redis at {settings.redis_said()} is back after {time.monotonic() - t0:.1f} s", file=sys.stderr, flush=True
        )
    return settings


def _say_what_waits(protocol: Protocol, screen: Screen, served: set[int]) -> None:
    """Jobs of a step whose model this launch did not serve wait in Redis: say so, and how to finish them."""
    try:
        left = {st: q.pending for st, q in screen.snapshot(sorted(set(protocol.steps) - served)).items() if q.pending}
    except RedisError:  # the plan above already says what remains
        return
    for step, jobs in left.items():
        model = protocol.steps[step].model
        print(f"step {step}: {len(jobs)} job(s) wait in Redis for {model}, which this launch did not serve; "
              f"finish them with: pool-launch --step {step} --burst (or pool-launch --burst for every step)",
              file=sys.stderr)  # fmt: skip


def check_max_seqs(settings: Settings, protocol: Protocol) -> None:
    """MAX_SEQS per step, checked against the protocol before anything is planned (with or without --plan-only):
    a step it lacks would size nothing, two batches for one server's steps cannot both hold. One line, exit 2."""
    if isinstance(settings.max_seqs, dict) and (unknown := sorted(set(settings.max_seqs) - set(protocol.steps))):
        fail(f"MAX_SEQS names {steps_label(tuple(unknown))}, which the protocol does not have (its steps: "
             f"{', '.join(map(str, sorted(protocol.steps)))})")  # fmt: skip
    for group in protocol.model_groups():
        settings.max_seqs_for(group)


def _sizes(
    settings: Settings, protocol: Protocol, servers: list[Server], gib: float | None
) -> dict[tuple[int, ...], Sizing]:
    """Batch and in-flight sizes per model group from the GPU's memory (`sizing.size`; a share of it when the
    models share the GPU, where step 3's batch needs its KV cache once: `sizing.coserve`). A GPU that cannot
    hold the model and one sequence is refused (one line, exit 2); one with room for only a small batch is
    warned about, one line each."""
    out = {
        v.steps: size(protocol, v.steps, gib, v.util or settings.gpu_util, settings.max_seqs_for(v.steps),
                      settings.workers, copies=1 if v.util and many_images(protocol, v.steps) else 2)
        for v in {v.steps: v for v in servers}.values()
    }  # fmt: skip
    for sz in out.values():
        if sz.refusal:
            fail(sz.refusal)
        if sz.warning:
            print(f"warning: {sz.warning}", file=sys.stderr, flush=True)
    return out


def _tuning(
    settings: Settings, protocol: Protocol, servers: list[Server], srv: Server, release: str | None, inflight: int
) -> Tuning:
    """The options for one server's cores (`server_cores`), said in one line. The vLLM release decides whether
    the workers send batches, and so whether a processor cache pays (`Tuning.for_cores`)."""
    cores = server_cores(protocol, servers, srv)
    api = Tuning.for_cores(cores, settings.api_servers, settings.renderer_workers).api_servers
    frames = max(protocol.steps[step].n_frames for step in srv.steps)
    host_gib = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**30
    cache = cache_gb_per_api_server(frames, inflight, api, len(servers), host_gib)
    tuning = Tuning.for_cores(cores, settings.api_servers, settings.renderer_workers, release, cache)
    if settings.batch == "off":
        tuning = replace(tuning, why="POOL_BATCH=off: one request per forward, no processor cache")
    elif release is None:
        tuning = replace(tuning, why=f"the release of `{settings.vllm}` unknown: no processor cache")
    gib = tuning.processor_cache_gb
    total = f" ({tuning.api_servers} x {gib:g} = {tuning.api_servers * gib:.1f} GiB of host memory)" if gib else ""
    print(
        f"{srv.name} server options: {tuning.api_servers} API servers, {tuning.renderer_workers} renderer threads, "
        f"processor cache {gib:g} GiB per API server{total}, OMP_NUM_THREADS={tuning.omp_threads} unless set "
        f"({cores} cores); {tuning.why}"
    )
    return tuning


def _requests(srv: Server, batch: str) -> str:
    """How the workers of a healthy server will send, from what the server lists (its /openapi.json, as each
    worker asks it at start), not from the release the options were chosen for."""
    if batch == "off":
        return "POOL_BATCH=off: the workers send one request per forward"
    try:
        r = httpx.get(f"{srv.url}/openapi.json", timeout=15.0)
        listed = r.status_code == 200 and lists_batch(r.content)
    except httpx.HTTPError:
        listed = False
    if listed:
        return f"it lists {BATCH_PATH}: the workers send a video's items as one request"
    return f"its /openapi.json lists no {BATCH_PATH}: the workers send one request per forward"


def _budgets(
    settings: Settings, protocol: Protocol, servers: list[Server], sizes: dict[tuple[int, ...], Sizing], sim: bool
) -> dict[tuple[int, ...], Budget]:
    """Each model group's prefill budget (`batched_tokens`), said in one line each. The installed vLLM's release
    is read only for MAX_BATCHED_TOKENS=derived (simulated servers: none, and the line says they take no budget:
    it is what a vLLM server in their place would be given)."""
    release = vllm_release(settings.vllm) if settings.max_batched_tokens == "derived" and not sim else None
    out = {g: batched_tokens(settings, protocol, g, sizes[g], release) for g in dict.fromkeys(v.steps for v in servers)}
    for b in out.values():
        print(f"{b.why} {SIM_BUDGET}" if sim else b.why)
    return out


def _start_servers(
    procs: Procs, run: LaunchRun, servers: list[Server], sizes: dict[tuple[int, ...], Sizing]
) -> Bringup:
    """Every GPU's servers at once, with the options derived from the cores, in the background: each is handed
    to the workers as it becomes healthy. Two servers of one GPU start one after the other (vLLM sizes its KV
    cache from the GPU's free memory while it profiles, which the other's start would change under it); the
    first one's workers run meanwhile (on the H200 the 8B idled 178 s while the 2B started)."""
    settings, protocol, sim = run.settings, run.protocol, run.sim is not None
    try:
        paths = {g: snapshot(protocol, g, sim) for g in {srv.steps for srv in servers}}
    except LocalEntryNotFoundError as e:  # not in the local cache: say how to get it
        fail(f"model not in the local hub cache ({e}); run `pool-fetch --models` first (or set HF_HOME)")
    known = None if sim else _flags_known(settings.vllm)
    name = {v: log_name("vllm", log_tag(v, run.step, run.split), v) for v in servers}
    tuning: dict[Server, Tuning | None] = dict.fromkeys(servers)  # a simulator takes none of vLLM's options
    if not sim:
        release = None if settings.batch == "off" else vllm_release(settings.vllm)  # no batches: today's options
        tuning = {
            v: _tuning(settings, protocol, servers, v, release, settings.workers or sizes[v.steps].max_seqs)
            for v in servers
        }
    budget = _budgets(settings, protocol, servers, sizes, sim)
    sim_args = ["--speed", str(run.sim.speed), "--warmup-s", str(run.sim.warmup_s)] if run.sim is not None else []
    argv = {v: [*server_argv(settings, protocol, v, paths[v.steps], sim, tuning[v], known, sizes[v.steps].max_seqs,
                             budget[v.steps].tokens), *sim_args] for v in servers}  # fmt: skip
    for v in servers if sim else ():
        print(f"{v.name} simulator options: {sim_options(argv[v][len(SIM_COMMAND) :])}")
    bring = Bringup(len(servers))

    def bring_up(on_gpu: list[Server]) -> None:
        for v in on_gpu:
            t0 = time.monotonic()
            with bring.lock:  # never after the launch closed: a server started then would outlive it
                if bring.closed:
                    return
                procs.start(name[v], argv[v], env=server_env(v, sim, tuning[v]))
            if why := _wait_healthy(procs, name[v], v, run.health_timeout_s, settings.wait_note_s):
                bring.events.put((v, _explain(settings.logs_dir / f"{name[v]}.log", why)))
                return
            print(f"{v.name} healthy after {time.monotonic() - t0:.0f} s; {_requests(v, settings.batch)}", flush=True)
            bring.events.put((v, None))

    what = {v: f"{protocol.steps[v.steps[0]].model} ({steps_label(v.steps)})" for v in servers}
    print(f"starting {len(servers)} server(s): " + ", ".join(f"{v.name}={what[v]}@{v.url}" for v in servers))
    for d in dict.fromkeys(v.device for v in servers):
        threading.Thread(target=bring_up, args=([v for v in servers if v.device == d],), daemon=True).start()
    return bring


class Bringup:
    """Servers as they come up: (server, None) when healthy, (server, why) when it failed to start. Once
    `close`d (a signal, a failed start, the end) no further server is started."""

    def __init__(self, n: int) -> None:
        self.events: queue.Queue[tuple[Server, str | None]] = queue.Queue()
        self.pending = n
        self.lock = threading.Lock()
        self.closed = False

    def close(self) -> None:
        with self.lock:
            self.closed = True

    def take(self) -> list[tuple[Server, str | None]]:
        out = []
        while not self.events.empty():
            out.append(self.events.get())
        self.pending -= len(out)
        return out


def _watch_command(run: LaunchRun) -> str:
    """The pool-status line that shows this launch from the same shell: the folders it was given on its command
    line, and its Redis (an embedded one no setting names; a URL that holds a password is left to the settings)."""
    redis = [] if "@" in run.settings.redis_url else [f"--redis-url {run.settings.redis_url}"]
    return " ".join(["pool-status --watch", *run.folder_flags, *redis])


def _supervise(run: LaunchRun, phase: Phase, stop: StopRequest) -> list[int]:
    """Each server's workers from the moment it is healthy, restarted when they die, until the queues are empty
    (burst) or a signal; then drain: no new jobs, in-flight forwards finish, rows written, jobs acknowledged.
    A server that fails to start stops the launch (exit 1) once the running workers have drained."""
    settings, procs, screen, sizes, ready, burst = (
        run.settings,
        phase.procs,
        phase.screen,
        phase.sizes,
        phase.ready,
        phase.burst,
    )
    host = socket.gethostname()
    common = ["--root", str(settings.root), "--results", str(settings.results_dir), "--redis-url", settings.redis_url]

    def worker_starter(srv: Server, k: int) -> tuple[str, Callable[[], subprocess.Popen[bytes]]]:
        """Worker process k of a server: its own name, log and metrics port (k = 0 keeps the run package's)."""
        nth = f"-w{k}" if k else ""
        wargv = [sys.executable, "-m", "workers.main", "--server", srv.url, *common]
        wargv += ["--name", f"{host}-{srv.name}{nth}", "--steps", ",".join(map(str, srv.steps))]
        wargv += ["--inflight", str(sizes[srv.steps].per_process)]
        wargv += ["--metrics-port", str(metrics_port(srv, k))] + (["--burst"] if burst else [])
        name = log_name("client", log_tag(srv, run.step, run.split), srv) + nth.replace("-", "_")
        return name, lambda: procs.start(name, wargv)

    def say(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    sup = Supervisor(burst, say)
    holds = HoldNews(screen.conn, say)  # why a worker takes no work, said here as its log says it
    failed: list[str] = []

    def work_left(steps: list[int]) -> bool:
        """Work for the steps of the workers started so far: step 3's queue restarts no idle 8B worker."""
        try:
            return screen.busy(steps)
        except AuthenticationError:
            raise
        except RedisError:  # Redis away: its work is still there
            return True

    while not stop.is_set() and not failed:
        for srv, why in ready.take():
            if why is not None:
                failed.append(why)
                continue
            for k in range(sizes[srv.steps].processes):
                sup.add(*worker_starter(srv, k), srv.steps)
            print(f"{srv.name}: {sizes[srv.steps].processes} worker(s) started; progress: {_watch_command(run)}; "
                  f"logs in {settings.logs_dir}", flush=True)  # fmt: skip
            if not ready.pending and not failed:  # a server that failed in this same round is not healthy
                print("all servers healthy")
        with contextlib.suppress(RedisError):  # Redis away: its workers wait for it, the next look says more
            holds.look([p.pid for p in sup.running()])
        if not sup.step(work_left) and not ready.pending:
            break
        time.sleep(1)
    ready.close()
    if stop.is_set():
        procs.say_stopping(stop.why, first=sup.children)  # the workers, then the servers
    for proc in sup.running():
        proc.send_signal(signal.SIGTERM)
    for proc in sup.running():
        proc.wait()
    if failed:
        print("\n".join(failed), file=sys.stderr)
        raise SystemExit(1)
    return sup.exit_codes()
