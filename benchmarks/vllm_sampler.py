"""Once a second: the time, the CPU seconds so far of every vLLM process and of its engine cores alone (from
/proc), the GPU's busy percent (NVML), and the share of a core the engine cores' busiest thread used since
the last line (near 1.0: the engine core's one Python thread is what binds). One line each, until killed (or
--count lines).

    python benchmarks/vllm_sampler.py FILE [--interval 1.0] [--count N]

batch_summary.py reads these lines over a step's span. Where NVML is not there (no GPU, no pynvml) the GPU
column reads `nan`, so the CPU columns still come (what the simulator's smoke test checks)."""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable

TICK = os.sysconf("SC_CLK_TCK")


def vllm_cpu() -> tuple[float, float, dict[str, float]]:
    """CPU seconds so far: every vLLM process, its engine cores, and each engine-core thread (by pid/tid)."""
    total = engine = 0
    threads: dict[str, float] = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
            with open(f"/proc/{pid}/comm", "rb") as f:
                comm = f.read()
            if b"vllm" not in cmd and b"VLLM" not in comm:
                continue
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if b"EngineCor" in comm:  # comm keeps 15 bytes: VLLM::EngineCor
                for tid in os.listdir(f"/proc/{pid}/task"):
                    with open(f"/proc/{pid}/task/{tid}/stat") as f:
                        t = f.read().rsplit(")", 1)[1].split()
                    threads[f"{pid}/{tid}"] = (int(t[11]) + int(t[12])) / TICK
        except OSError:  # the process or thread ended while read
            continue
        ticks = int(fields[11]) + int(fields[12])
        total += ticks
        engine += ticks if b"EngineCor" in comm else 0
    return total / TICK, engine / TICK, threads


def busiest(before: dict[str, float], now: dict[str, float], dt: float) -> float:
    """The share of a core the busiest engine-core thread used between two samples (0 with none)."""
    return max(((now[k] - before[k]) / dt for k in now.keys() & before.keys()), default=0.0)


def gpu_busy() -> Callable[[], float]:
    """GPU 0's busy percent over NVML's last sample period, or nan without NVML."""
    try:
        import pynvml

        pynvml.nvmlInit()
        gpu = pynvml.nvmlDeviceGetHandleByIndex(0)
    except Exception:  # no pynvml, no driver, no GPU: the CPU columns still count
        return lambda: float("nan")
    return lambda: float(pynvml.nvmlDeviceGetUtilizationRates(gpu).gpu)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "file",
        help="appended to, one line a sample: time, vLLM CPU s, engine-core CPU s, GPU busy %%, "
        "busiest engine-core thread's cores",
    )
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("--count", type=int, default=0, help="stop after this many lines (0: until killed)")
    args = ap.parse_args()
    busy = gpu_busy()
    n = 0
    before: dict[str, float] = {}
    t_before = time.time()
    with open(args.file, "a", buffering=1) as out:
        while not args.count or n < args.count:
            cpu, engine, threads = vllm_cpu()
            t = time.time()
            top = busiest(before, threads, max(t - t_before, 1e-3))
            out.write(f"{t:.2f} {cpu:.2f} {engine:.2f} {busy():.0f} {top:.3f}\n")
            before, t_before = threads, t
            n += 1
            time.sleep(args.interval)


if __name__ == "__main__":
    main()
