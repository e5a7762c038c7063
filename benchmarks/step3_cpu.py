"""Where a step-3 item's server CPU goes: the protocol's 32-frame requests against one vLLM server,
the CPU seconds of each of the server's processes (/proc) per item, optionally a py-spy `--native`
profile of them all, read as parts (base64, JPEG decode, image processor, tokenizing, hashing, ...).

Load shaped as the pool's step 3 (`shared/gpu/step3_prefix.py`): K items per video, fresh 448x252
JPEG frames every run (nothing helped by an earlier run), the protocol's own request bodies, a
video's items sent together (`adjacent`, the workers' default) or its first item alone then its
siblings (`serial`). `--uuid` adds vLLM's multimodal identifier (a digest of the frame's bytes) to
each image part; `--no-resend` (with `--uuid`, serial only) sends the siblings' frames as an empty
URL, for a server whose processor cache holds them.

  python benchmarks/step3_cpu.py run --port 8101 --label A --k 3 --items 300 [--uuid] [--profile 8] --out r.jsonl
  python benchmarks/step3_cpu.py same --a 8101 --b 8102 --b-uuid [--n 8]   # identical top-20, firsts and siblings
  python benchmarks/step3_cpu.py parts prof.txt                            # a recorded profile as parts
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gzip
import hashlib
import io
import json
import os
import random
import re
import subprocess
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).parent.parent))
from pool_queue.protocol import Protocol

P = Protocol()
STEP = 3
WORDS = [
    "the",
    "a",
    "study",
    "video",
    "shows",
    "person",
    "object",
    "scene",
    "table",
    "red",
    "blue",
    "moves",
    "left",
    "right",
    "before",
    "after",
    "while",
]

# Parts of a sample, by the first frame (leaf first) that names one; the rest fall under their process.
# fmt: off
PARTS: list[tuple[str, tuple[str, ...]]] = [
    ("mm hashing", ("blake3", "hasher.py", "hash_kwargs", "get_mm_hashes", "xxhash")),
    ("base64 decode", ("b64decode", "pybase64", "binascii", "base64")),
    ("JPEG decode + RGB", ("decode_mcu", "jpeg_", "libjpeg", "ImageFile.py", "ImagingDecode", "convert (PIL",
                           "_imaging", "PIL/Image.py")),
    ("tokenizing + chat template", ("tokenizers", "tokenization_", "_tokenize", "apply_chat_template", "jinja2",
                                    "encode (vllm/tokenizers", "tokenizer.py", "detokeniz")),
    ("image processor", ("image_processing", "image_processor", "image_transforms", "torchvision", "image_utils")),
    ("media fetch (other)", ("fetch_image", "multimodal/media", "connector.py", "load_bytes", "load_base64")),
    ("engine: pixel concat", ("_reduce_data", "batched (vllm/multimodal", "group_mm_kwargs")),
    ("engine: scheduler", ("scheduler.py", "kv_cache_manager", "block_pool", "kv_cache_utils")),
    ("engine: model runner", ("gpu_model_runner", "model_executor", "execute_model", "libcuda", "cudaLaunch")),
    ("vLLM mm processing (other)", ("multimodal/processing", "qwen3_vl.py", "qwen2_vl.py", "multimodal/parse",
                                    "multimodal/inputs", "_call_hf_processor", "processing_qwen")),
    ("request/response JSON", ("pydantic", "orjson", "json/", "ujson", "starlette", "fastapi", "uvicorn", "h11",
                               "httptools", "protocol.py (vllm/entrypoints")),
    ("IPC (msgspec, zmq, pickle)", ("msgspec", "zmq", "serial_utils", "pickle", "shm_broadcast", "shm_object")),
]
# fmt: on


# ---- load -----------------------------------------------------------------------------------------


def frame_url(seed: int, width: int = 448, height: int = 252) -> str:
    """A gradient with noise and boxes, JPEG q85 (~40 KB, as the pool's 448-px frames), as a data URL."""
    import base64

    import numpy as np
    from PIL import Image, ImageDraw

    g = np.random.default_rng(seed)
    t = np.linspace(0.0, 1.0, width)[None, :, None]
    c0, c1 = g.integers(0, 256, 3), g.integers(0, 256, 3)
    arr = c0[None, None, :] * (1 - t) + c1[None, None, :] * t + g.integers(-40, 41, (height, width, 3))
    img = Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8), "RGB")
    d = ImageDraw.Draw(img)
    for _ in range(int(g.integers(3, 9))):
        x0, y0 = int(g.integers(0, width - 40)), int(g.integers(0, height - 40))
        d.rectangle([x0, y0, x0 + int(g.integers(15, 160)), y0 + int(g.integers(15, 120))],
                    fill=tuple(int(x) for x in g.integers(0, 256, 3)))  # fmt: skip
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=85)
    return "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode()


def frame_id(url: str) -> str:
    """vLLM's identifier of an image part: a digest of its bytes, so equal frames, and only they, share it."""
    return hashlib.blake2b(url.encode(), digest_size=16).hexdigest()


def body(urls: list[str], rng: random.Random, uuid: bool, omit: bool) -> bytes:
    """The protocol's request body for one forward; `uuid`: each image part carries its identifier;
    `omit`: the images are named only (their URL empty)."""
    n = rng.choice([4, 5])
    question = " ".join(rng.choice(WORDS) for _ in range(rng.randint(60, 120))) + "?"
    options = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 9))) for _ in range(n)]
    b = P.request_body(STEP, question, options, urls)
    if uuid:
        parts = b["messages"][0]["content"]
        for part, u in zip(parts, urls, strict=False):
            part["uuid"] = frame_id(u)
            if omit:
                part["image_url"] = {"url": ""}
    return json.dumps(b).encode()


def build(videos: int, k: int, salt: int, uuid: bool, no_resend: bool, frames: int = 32) -> list[list[bytes]]:
    seeds = [salt * 10_000_000 + v * 64 + j for v in range(videos) for j in range(frames)]
    with ProcessPoolExecutor(min(16, os.cpu_count() or 1)) as pool:
        flat = list(pool.map(frame_url, seeds, chunksize=16))
    rng = random.Random(salt)
    return [
        [body(flat[v * frames : (v + 1) * frames], rng, uuid, no_resend and j > 0) for j in range(k)]
        for v in range(videos)
    ]


# ---- server processes -----------------------------------------------------------------------------


def tree(root: int) -> list[int]:
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            kids.setdefault(ppid, []).append(int(d))
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += kids.get(p, [])
    return out


def kind(pid: int) -> str:
    """API server / engine core / launcher, from vLLM's process titles."""
    try:
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return "gone"
    text = comm + " " + cmd
    if "EngineCore" in text:
        return "engine core"
    if "APIServer" in text or "ApiServer" in text:
        return "API servers"
    return "other"


def cpu_by_kind(root: int) -> dict[str, float]:
    out: Counter[str] = Counter()
    tck = os.sysconf("SC_CLK_TCK")
    for p in tree(root):
        try:
            with open(f"/proc/{p}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[kind(p)] += (int(fields[11]) + int(fields[12])) / tck
    return dict(out)


def metrics(port: int) -> dict[str, float]:
    txt = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    out: dict[str, float] = {}
    for line in txt.splitlines():
        m = re.match(r"^(vllm:[a-z_]*(?:cache_queries|cache_hits|prompt_tokens)[a-z_]*)(?:\{[^}]*\})?\s+(\S+)$", line)
        if m:
            out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(2))
    return out


class GpuSampler(threading.Thread):
    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.vals: list[float] = []
        self.stop = False

    def run(self) -> None:
        cmd = ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits", "-lms", "500"]
        try:
            p = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        except OSError:  # no GPU here (a simulated server): no busy figure
            return
        assert p.stdout is not None
        for line in p.stdout:
            if self.stop:
                break
            with contextlib.suppress(ValueError):
                self.vals.append(float(line.strip()))
        p.terminate()


async def send_all(port: int, mode: str, groups: list[list[bytes]], conc: int) -> tuple[float, list[str]]:
    sem = asyncio.Semaphore(conc)
    errors: list[str] = []
    limits = httpx.Limits(max_connections=conc + 8, max_keepalive_connections=conc + 8)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=600, limits=limits) as c:

        async def one(b: bytes) -> None:
            async with sem:
                r = await c.post("/v1/chat/completions", content=b, headers={"content-type": "application/json"})
                if r.status_code != 200:
                    errors.append(r.text[:300])

        async def serial(g: list[bytes]) -> None:
            await one(g[0])
            await asyncio.gather(*(one(b) for b in g[1:]))

        t0 = time.perf_counter()
        if mode == "serial":
            await asyncio.gather(*(serial(g) for g in groups))
        else:
            await asyncio.gather(*(one(b) for g in groups for b in g))
        return time.perf_counter() - t0, errors


def cmd_run(args: argparse.Namespace) -> None:
    root = int(Path(args.pid_file or f"/root/vllm-{args.port}.pid").read_text())
    k = 1 if args.mode == "distinct" else args.k
    t = time.perf_counter()
    groups = build(args.items // k, k, args.salt, args.uuid, args.no_resend)
    built = time.perf_counter() - t
    prof = None
    if args.profile:
        out = Path(args.profile_out or f"/root/prof-{args.label}.txt")
        spy = [args.py_spy, "record", "--pid", str(root), "--subprocesses", *(["--native"] if args.native else []),
               "--threads", "--format", "raw", "--rate", str(args.rate), "--duration", str(args.profile),
               "--output", str(out)]  # fmt: skip
        prof = subprocess.Popen(spy, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        time.sleep(1.0)  # py-spy attaches to every process first
    m0, c0 = metrics(args.port), cpu_by_kind(root)
    g = GpuSampler()
    g.start()
    wall, errors = asyncio.run(
        send_all(args.port, "serial" if args.mode == "serial" else "adjacent", groups, args.conc)
    )
    g.stop = True
    m1, c1 = metrics(args.port), cpu_by_kind(root)
    if prof is not None:
        _, err = prof.communicate(timeout=args.profile + 120)
        if prof.returncode:
            print(f"py-spy exited {prof.returncode}: {err[-500:]}", file=sys.stderr)
    n = sum(len(x) for x in groups)
    d = {key: m1.get(key, 0) - m0.get(key, 0) for key in m1}
    q = next((v for key, v in d.items() if "prefix_cache_queries" in key), 0)
    h = next((v for key, v in d.items() if "prefix_cache_hits" in key), 0)
    cpu = {key: round(1000 * (c1.get(key, 0) - c0.get(key, 0)) / n, 1) for key in c1}
    rec = {"label": args.label, "port": args.port, "mode": args.mode, "k": k, "uuid": args.uuid,
           "no_resend": args.no_resend, "items": n, "wall_s": round(wall, 2), "items_per_s": round(n / wall, 2),
           "build_s": round(built, 1),
           "gpu_busy": round(sum(g.vals) / max(1, len(g.vals)), 1), "prefix_hit": round(h / q, 3) if q else None,
           "cpu_ms_per_item": cpu, "cpu_ms_per_item_total": round(sum(cpu.values()), 1),
           "prompt_tokens_per_item": round(d.get("vllm:prompt_tokens_total", 0) / n, 1),
           "profiled_s": args.profile or 0, "errors": len(errors),
           "first_error": errors[0] if errors else None}  # fmt: skip
    print(json.dumps(rec), flush=True)
    if args.out:
        with open(args.out, "a") as f:
            f.write(json.dumps(rec) + "\n")


# ---- same numbers ---------------------------------------------------------------------------------


def top20(c: httpx.Client, port: int, b: bytes) -> list[tuple[str, float]]:
    r = c.post(f"http://127.0.0.1:{port}/v1/chat/completions", content=b, headers={"content-type": "application/json"})
    r.raise_for_status()
    lp = r.json()["choices"][0]["logprobs"]["content"][0]["top_logprobs"]
    return [(t["token"], t["logprob"]) for t in lp]


def cmd_same(args: argparse.Namespace) -> None:
    """Each video's first item, then a sibling, one request at a time: A plain, B in its shape."""
    videos = args.n // 2
    plain = build(videos, 2, args.salt, False, False)
    shaped = build(videos, 2, args.salt, args.b_uuid, args.b_no_resend)
    same = firsts = sibs = 0
    max_d = 0.0
    with httpx.Client(timeout=300) as c:
        for gp, gs in zip(plain, shaped, strict=True):
            for j, (bp, bs) in enumerate(zip(gp, gs, strict=True)):
                ta, tb = top20(c, args.a, bp), top20(c, args.b, bs)
                ok = ta == tb
                same += ok
                firsts += ok and j == 0
                sibs += ok and j > 0
                da, db = dict(ta), dict(tb)
                max_d = max([max_d, *(abs(da[x] - db[x]) for x in da.keys() & db.keys())])
    rec = {"a": args.a, "b": args.b, "b_uuid": args.b_uuid, "b_no_resend": args.b_no_resend, "requests": 2 * videos,
           "identical_top20": same, "firsts": firsts, "siblings": sibs, "max_abs_d_logprob": max_d}  # fmt: skip
    print(json.dumps(rec), flush=True)
    if args.out:
        with open(args.out, "a") as f:
            f.write(json.dumps(rec) + "\n")


# ---- profile parts --------------------------------------------------------------------------------


def part_of(frames: list[str]) -> str | None:
    for fr in reversed(frames):  # leaf first
        for name, keys in PARTS:
            if any(k in fr for k in keys):
                return name
    return None


def parts(text: str) -> dict[str, Counter[str]]:
    """Samples per process kind and part (threads of one kind summed)."""
    out: dict[str, Counter[str]] = {}
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        fs = stack.split(";")
        proc = next((f for f in fs if f.startswith("process ")), "")
        frames = [f for f in fs if not f.startswith(("process ", "thread "))]
        k = "engine core" if "EngineCore" in proc else "API servers" if "APIServer" in proc else "other"
        out.setdefault(k, Counter())[part_of(frames) or "unclassified"] += int(count)
    return out


def cmd_parts(args: argparse.Namespace) -> None:
    raw = Path(args.profile).read_bytes()
    text = (gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw).decode(errors="replace")
    for k, c in sorted(parts(text).items()):
        n = sum(c.values())
        print(f"## {k}: {n} samples")
        for name, v in c.most_common():
            print(f"  {name:32s} {v:7d}  {100 * v / n:5.1f} %")
    if args.unclassified:
        top: Counter[str] = Counter()
        for line in text.splitlines():
            stack, _, count = line.rpartition(" ")
            fs = [f for f in stack.split(";") if not f.startswith(("process ", "thread "))]
            if count.isdigit() and fs and part_of(fs) is None:
                top[fs[-1][:120]] += int(count)
        for f, v in top.most_common(args.unclassified):
            print(f"  unclassified leaf {v:6d}  {f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    run_parser = sub.add_parser("run")
    run_parser.add_argument("--port", type=int, required=True)
    run_parser.add_argument("--label", required=True)
    run_parser.add_argument(
        "--pid-file", help="the server's pid (default: /root/vllm-PORT.pid, as benchmarks/h200.sh writes)"
    )
    run_parser.add_argument("--mode", choices=("distinct", "adjacent", "serial"), default="adjacent")
    run_parser.add_argument("--k", type=int, default=3)
    run_parser.add_argument("--items", type=int, default=300)
    run_parser.add_argument("--conc", type=int, default=64)
    run_parser.add_argument("--uuid", action="store_true")
    run_parser.add_argument("--no-resend", action="store_true")
    run_parser.add_argument("--profile", type=int, default=0, help="py-spy --native for this many seconds")
    run_parser.add_argument("--profile-out")
    run_parser.add_argument("--rate", type=int, default=40)
    run_parser.add_argument("--py-spy", default="/tmp/ours/bin/py-spy")
    run_parser.add_argument("--no-native", dest="native", action="store_false",
                            help="Python frames only (py-spy --native crashed with SIGSEGV on the Firecracker H100 "
                            "of 2026-12-05)")  # fmt: skip
    run_parser.add_argument("--salt", type=int, default=int(time.time() * 1000) % 1_000_000)
    run_parser.add_argument("--out")
    same_parser = sub.add_parser("same")
    same_parser.add_argument("--a", type=int, required=True)
    same_parser.add_argument("--b", type=int, required=True)
    same_parser.add_argument("--b-uuid", action="store_true")
    same_parser.add_argument("--b-no-resend", action="store_true")
    same_parser.add_argument("--n", type=int, default=8)
    same_parser.add_argument("--salt", type=int, default=int(time.time() * 1000) % 1_000_000 + 7)
    same_parser.add_argument("--out")
    parts_parser = sub.add_parser("parts")
    parts_parser.add_argument("profile")
    parts_parser.add_argument("--unclassified", type=int, default=0, help="show the top N unclassified leaves")
    args = ap.parse_args()
    {"run": cmd_run, "same": cmd_same, "parts": cmd_parts}[args.cmd](args)


if __name__ == "__main__":
    main()
