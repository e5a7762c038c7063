#!/usr/bin/env bash
# Step 3 with two 2B servers on one GPU, each with its own engine core: does a second server raise step 3
# on the same card, at the same forwards in flight? The engine core's one thread was 0.72-0.83 of a core
# with the GPU half idle (docs/scale.md), so a second engine core could add to it. Both servers start at
# once, each with a fixed KV cache (KV_GIB, default 24) so neither start-up's memory profiling sees the
# other's. The system (Redis + pool-workers, throughput.py) then screens distinct items of one pool of
# 448-px JPEG frames, one measurement after the other:
#   one-server-32   server A alone, 32 forwards in flight (one worker of 32)
#   one-server-64   server A alone, 64 in flight (two workers of 32): what a second server must beat
#   two-servers     A and B at once, 32 in flight each (64 in all)
# vllm_sampler.py runs throughout: per measurement, the busiest engine-core thread's share of a core (p50, p90;
# with two servers the busier of the two cores' threads) and the GPU's median busy percent.
# After `benchmarks/h200.sh deps` and `install`, on the GPU machine:
#   bash benchmarks/step3_two_servers.sh start            the two servers and the pool (background servers)
#   bash benchmarks/step3_two_servers.sh measure OUTDIR   the three measurements and one summary line
#   bash benchmarks/step3_two_servers.sh all OUTDIR       both (a background job's: ends with DONE)
# Env: SYSTEM_ITEMS (items per measurement, 600), KV_GIB (24), WAIT (s for a start, 600).
set -euo pipefail
H="bash benchmarks/h200.sh"
export PYTHONPATH="/tmp/site:/tmp/ours:$PWD"
N=${SYSTEM_ITEMS:-600}
KV=$(( ${KV_GIB:-24} * 1024 * 1024 * 1024 ))
ROOT=/root/b3
RUN=(--ceiling-items 0 --items "$N" --real-frames --root "$ROOT")

start() {
  export GPU_UTIL=0.4 MAX_SEQS=64
  for p in 8002 8003; do $H serve 2b "$p" --kv-cache-memory-bytes "$KV"; done
  python3 -c "import sys; sys.path.insert(0, 'benchmarks'); from pathlib import Path; from _pool import pool_items; \
print(len(pool_items(Path('$ROOT'), 3, 4 * $N, real_frames=True)), 'items in $ROOT')"
  for p in 8002 8003; do $H wait "$p" "${WAIT:-600}"; done
}

phase() {  # LABEL: the span of the measurement that follows, for the sampler's lines
  echo "$1 $(date +%s.%N)" >> "$out/phases.txt"
}

measure() {
  out=$1
  mkdir -p "$out"
  python3 benchmarks/vllm_sampler.py "$out/samples.txt" &
  local sampler=$!
  phase one-server-32
  $H bench 3 8002 "${RUN[@]}" --workers 1 --inflight 32 --label one-server-32 --out "$out/throughput.jsonl"
  phase one-server-64
  $H bench 3 8002 "${RUN[@]}" --skip "$N" --workers 2 --inflight 32 --label one-server-64 --out "$out/throughput.jsonl"
  phase two-servers
  $H bench 3 8002 "${RUN[@]}" --skip $((2 * N)) --workers 1 --inflight 32 --label two-servers-a \
    --out "$out/throughput.jsonl" > "$out/a.txt" &
  local a=$!
  $H bench 3 8003 "${RUN[@]}" --skip $((3 * N)) --workers 1 --inflight 32 --label two-servers-b \
    --out "$out/throughput.jsonl" > "$out/b.txt"
  wait "$a"
  phase end
  kill "$sampler"
  cat "$out/a.txt" "$out/b.txt"
  python3 - "$out/throughput.jsonl" "$out/phases.txt" "$out/samples.txt" <<'PY'
import json, statistics, sys
spans = [line.split() for line in open(sys.argv[2])]
samples = [tuple(map(float, line.split())) for line in open(sys.argv[3]) if len(line.split()) == 5]
for (label, t0), (_, t1) in zip(spans, spans[1:]):  # the busiest engine-core thread (share of a core), GPU busy
    top = sorted(s[4] for s in samples if float(t0) + 5 <= s[0] <= float(t1))
    gpu = [s[3] for s in samples if float(t0) + 5 <= s[0] <= float(t1)]
    if top:
        print(f"{label}: busiest engine-core thread p50 {top[len(top) // 2]:.2f} p90 {top[int(len(top) * 0.9)]:.2f} "
              f"of a core; GPU busy median {statistics.median(gpu):.0f} % over {len(top)} s")
r = {x["label"]: x["system"] for x in map(json.loads, open(sys.argv[1]))}
one32, one64, a, b = r["one-server-32"], r["one-server-64"], r["two-servers-a"], r["two-servers-b"]
two = a["fwd_s"] + b["fwd_s"]
print(f"step-3 forwards/s: one server, 32 in flight {one32['fwd_s']:.2f} (GPU {one32['gpu_busy']:.0f} %); "
      f"64 in flight {one64['fwd_s']:.2f} (GPU {one64['gpu_busy']:.0f} %); two servers, 32 each "
      f"{a['fwd_s']:.2f} + {b['fwd_s']:.2f} = {two:.2f} (GPU {a['gpu_busy']:.0f} %): "
      f"{two / one64['fwd_s']:.2f}x one server at the same 64 in flight")
PY
}

case "${1:?start|measure|all}" in
  start) start ;;
  measure) measure "${2:?OUTDIR}" ;;
  all) out=${2:?OUTDIR}; start && measure "$out"; echo DONE ;;
  help|-h|--help) sed -n '2,/^set -/p' "$0" | sed '$d; s/^# \{0,1\}//' ;;
  *) echo "start|measure OUTDIR|all OUTDIR" >&2; exit 2 ;;
esac
