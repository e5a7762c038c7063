#!/usr/bin/env bash
# Step 3 with two 2B servers on one GPU: the step-3 profile (benchmarks/results/h200.md) shows the
# engine core's one thread as the limit (batching the images' pixel values on the CPU) with the GPU
# three-quarters idle, so a second server (its own engine core) on the same GPU should add to it.
# The system (Redis + workers) runs once against one server, then against both at once (a worker
# set and a Redis each, as pool-launch does per server). After `benchmarks/h200.sh deps` and `install`:
#   bash benchmarks/step3_two_servers.sh start
#   bash benchmarks/step3_two_servers.sh measure OUTDIR
set -euo pipefail
H="bash benchmarks/h200.sh"
export PYTHONPATH="/tmp/site:/tmp/ours:$PWD"
N=${SYSTEM_ITEMS:-240}
RUN="--ceiling-items 40 --items $N --procs 4 --conc 24 --workers 4 --inflight 32 --root /root/b3"
case "${1:?start|measure}" in
  start)
    # a fixed KV cache each (12 GiB) so the two start-ups cannot upset each other's memory profiling
    export GPU_UTIL=0.4 MAX_SEQS=256
    for p in 8002 8003; do $H serve 2b "$p" --kv-cache-memory-bytes 12884901888; done
    python3 -c "import sys; sys.path.insert(0, 'benchmarks'); from pathlib import Path; from _pool import pool_items; \
print(len(pool_items(Path('/root/b3'), 3, 3 * ($N + 40))), 'items in /root/b3')"
    for p in 8002 8003; do $H wait "$p" "${WAIT:-450}"; done ;;
  measure)
    out=${2:?OUTDIR}
    mkdir -p "$out"
    # shellcheck disable=SC2086  # RUN is a word list
    $H bench 3 8002 $RUN --label one-server --out "$out/throughput.jsonl"
    # shellcheck disable=SC2086
    $H bench 3 8002 $RUN --skip $((N + 40)) --label two-servers-a --out "$out/throughput.jsonl" > "$out/a.txt" &
    # shellcheck disable=SC2086
    $H bench 3 8003 $RUN --skip $((2 * N + 80)) --label two-servers-b --out "$out/throughput.jsonl" > "$out/b.txt"
    wait
    cat "$out/a.txt" "$out/b.txt"
    python3 - "$out/throughput.jsonl" <<'PY'
import json, sys
r = {x["label"]: x for x in map(json.loads, open(sys.argv[1]))}
one, a, b = r["one-server"]["system"], r["two-servers-a"]["system"], r["two-servers-b"]["system"]
print(f"system fwd/s: one server {one['fwd_s']:.2f}; two servers {a['fwd_s']:.2f} + {b['fwd_s']:.2f} = "
      f"{a['fwd_s'] + b['fwd_s']:.2f} ({(a['fwd_s'] + b['fwd_s']) / one['fwd_s']:.2f}x); "
      f"GPU busy {one['gpu_busy']:.0f} % -> {a['gpu_busy']:.0f} %")
PY
    ;;
  help|-h|--help) sed -n '2,/^set -/p' "$0" | sed '$d; s/^# \{0,1\}//' ;;
  *) echo "start|measure" >&2; exit 2 ;;
esac
