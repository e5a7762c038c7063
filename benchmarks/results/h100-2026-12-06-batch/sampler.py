"""Once a second: the time, the CPU seconds so far of every vLLM process and of its engine cores alone (from
/proc), and the GPU's busy percent (NVML). One line each, until killed."""

import os
import sys
import time

import pynvml

TICK = os.sysconf("SC_CLK_TCK")


def vllm_cpu() -> tuple[float, float]:
    total = engine = 0
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
        except OSError:
            continue
        ticks = int(fields[11]) + int(fields[12])
        total += ticks
        engine += ticks if b"EngineCor" in comm else 0  # comm keeps 15 bytes: VLLM::EngineCor
    return total / TICK, engine / TICK


pynvml.nvmlInit()
gpu = pynvml.nvmlDeviceGetHandleByIndex(0)
with open(sys.argv[1], "a", buffering=1) as out:
    while True:
        cpu, engine = vllm_cpu()
        busy = pynvml.nvmlDeviceGetUtilizationRates(gpu).gpu
        out.write(f"{time.time():.2f} {cpu:.2f} {engine:.2f} {busy}\n")
        time.sleep(1.0)
