#!/usr/bin/env bash
# The server options pool-launch now derives from the host's cores (Tuning.for_cores(16) on the H200 host:
# 8 API servers, 3 renderer threads, processor cache 0, OMP_NUM_THREADS=1), against the former ones (4 API
# servers, 1 renderer thread, a 4 GiB processor cache, OpenMP's default of one thread per core), for every
# step, with the plain client and the whole system on the same servers, and the same-numbers check.
# Four servers share the one GPU, each with a fixed KV cache so their start-ups cannot upset each other's
# memory profiling; each is measured while the others idle. After the bundle's chunks are in /root/stash,
# from the repo root on the GPU machine (.whl and .gpu/base carried):
#   bash benchmarks/h200_tuned.sh start            # install, our wheels, 4 servers, the pools, wait
#   bash benchmarks/h200_tuned.sh step3 OUTDIR      # ~5 min
#   bash benchmarks/h200_tuned.sh steps12 OUTDIR    # ~5 min (stop the 2B servers first: four servers at once
#                                                   # ran the 8B out of GPU memory on its first full batch)
# Step 3 on real-like frames (every frame a 448-px JPEG, which the workers send untouched), one new 2B server:
#   bash benchmarks/h200_tuned.sh real-start        # install, our wheels, the server, the pools, wait
#   bash benchmarks/h200_tuned.sh real OUTDIR       # ~5 min
#   bash benchmarks/h200_tuned.sh real-defaults OUTDIR   # instead: pool-launch's defaults (MAX_SEQS 64, one worker)
set -euo pipefail
H="bash benchmarks/h200.sh"
export PYTHONPATH="/tmp/site:/tmp/ours:$PWD" PYTHONUNBUFFERED=1
GIB=1073741824
OLD="--api-server-count 4 --renderer-num-workers 1 --mm-processor-cache-gb 4"
NEW2=8002 OLD2=8003 NEW8=8001 OLD8=8004

pool() {  # pool ROOT STEP N PER_VIDEO [VIDEOS [REAL_FRAMES]]
  python3 -c "import sys; sys.path.insert(0, 'benchmarks'); from pathlib import Path; from _pool import pool_items; \
print(len(pool_items(Path('$1'), $2, $3, ${5:-None}, $4, ${6:-False})), 'items in $1')"
}

prepare() {
  [ -d /tmp/site/vllm ] || $H install
  $H deps
}

case "${1:?start|step3|steps12|real-start|real|real-defaults}" in
  start)
    prepare
    export GPU_UTIL=0.15 MAX_SEQS=256
    $H serve 2b $NEW2 --kv-cache-memory-bytes $((32 * GIB))
    $H serve 8b $NEW8 --kv-cache-memory-bytes $((24 * GIB))
    # shellcheck disable=SC2086
    OMP_NUM_THREADS=16 $H serve 2b $OLD2 --kv-cache-memory-bytes $((8 * GIB)) $OLD
    # shellcheck disable=SC2086
    OMP_NUM_THREADS=16 $H serve 8b $OLD8 --kv-cache-memory-bytes $((8 * GIB)) $OLD
    pool /root/d1 3 1000 1 &
    pool /root/d3 3 1920 3 &
    pool /root/s1 1 15100 0 300 &
    pool /root/s2 2 3700 0 &
    wait
    for p in $NEW2 $NEW8 $OLD2 $OLD8; do $H wait $p "${WAIT:-480}" || echo ":$p did not come up"; done
    nvidia-smi --query-gpu=memory.used,memory.total --format=csv
    for p in $NEW2 $NEW8 $OLD2 $OLD8; do head -n 1 "/root/vllm-$p.log"; grep -m1 "KV cache size" "/root/vllm-$p.log" || true; done ;;
  step3)
    out=${2:?OUTDIR}; mkdir -p "$out"; j="$out/step3.jsonl"
    C="--procs 4 --conc 16 --workers 4 --inflight 32"
    # shellcheck disable=SC2086
    {
      $H bench 3 $NEW2 --root /root/d1 --ceiling-items 240 --items 480 $C --label "new distinct" --out "$j"
      $H bench 3 $NEW2 --root /root/d3 --ceiling-items 240 --items 480 $C --video-send adjacent \
        --label "new 3/video adjacent" --out "$j"
      $H bench 3 $NEW2 --root /root/d3 --skip 720 --ceiling-items 30 --items 480 $C --video-send serial \
        --label "new 3/video serial" --out "$j"
      $H bench 3 $OLD2 --root /root/d1 --skip 720 --ceiling-items 240 --items 0 $C --label "old distinct" --out "$j"
      $H bench 3 $OLD2 --root /root/d3 --skip 1230 --ceiling-items 240 --items 0 $C --label "old 3/video adjacent" --out "$j"
      $H same 3 $NEW2 $OLD2 16 --root /root/d1 --skip 960
      python3 .gpu/base/step3_prefix.py --port $NEW2 --model "$(python3 -c 'from pool_queue.protocol import Protocol; print(Protocol().steps[3].served_name)')" \
        --items 192 --k 3 --conc 64 --modes warmup,distinct,serial,adjacent
    } 2>&1 | tee "$out/step3.log" ;;
  steps12)
    out=${2:?OUTDIR}; mkdir -p "$out"; j="$out/steps12.jsonl"
    # shellcheck disable=SC2086
    {
      $H bench 1 $NEW8 --root /root/s1 --ceiling-items 3000 --items 12000 --procs 8 --conc 64 --workers 4 --inflight 128 \
        --label "new" --out "$j"
      $H bench 1 $OLD8 --root /root/s1 --skip 12000 --ceiling-items 3000 --items 0 --procs 8 --conc 64 --label "old" --out "$j"
      $H bench 2 $NEW8 --root /root/s2 --ceiling-items 1200 --items 1800 --procs 4 --conc 64 --workers 4 --inflight 128 \
        --label "new" --out "$j"
      $H bench 2 $OLD8 --root /root/s2 --skip 3000 --ceiling-items 680 --items 0 --procs 4 --conc 64 --label "old" --out "$j"
      $H same 1 $NEW8 $OLD8 16 --root /root/s1 --skip 15050
      $H same 2 $NEW8 $OLD8 16 --root /root/s2 --skip 3680
    } 2>&1 | tee "$out/steps12.log" ;;
  real-start)
    prepare
    GPU_UTIL=0.15 MAX_SEQS=256 $H serve 2b $NEW2 --kv-cache-memory-bytes $((32 * GIB))
    pool /root/r1 3 1560 1 None True &
    pool /root/r3 3 1560 3 None True &
    wait
    $H wait $NEW2 "${WAIT:-480}"
    head -n 1 "/root/vllm-$NEW2.log" ;;
  real)
    out=${2:?OUTDIR}; mkdir -p "$out"; j="$out/real.jsonl"
    C="--procs 4 --conc 32 --workers 4 --real-frames"
    # shellcheck disable=SC2086
    {
      $H bench 3 $NEW2 --root /root/r1 --ceiling-items 360 --items 600 $C --inflight 64 --label "real distinct" --out "$j"
      $H bench 3 $NEW2 --root /root/r1 --skip 960 --ceiling-items 0 --items 600 $C --inflight 96 \
        --label "real distinct 4x96" --out "$j"
      $H bench 3 $NEW2 --root /root/r3 --ceiling-items 360 --items 600 $C --inflight 64 --video-send adjacent \
        --label "real 3/video" --out "$j"
      $H bench 3 $NEW2 --root /root/r3 --skip 960 --ceiling-items 0 --items 600 $C --inflight 64 --video-send serial \
        --label "real 3/video serial" --out "$j"
      python3 .gpu/base/step3_prefix.py --port $NEW2 --model "$(python3 -c 'from pool_queue.protocol import Protocol; print(Protocol().steps[3].served_name)')" \
        --items 192 --k 3 --conc 64 --modes warmup,distinct,serial,adjacent
    } 2>&1 | tee "$out/real.log" ;;
  real-defaults)   # pool-launch's defaults as a user gets them: MAX_SEQS=64, GPU_UTIL=0.85, one worker of 64 in flight
    out=${2:?OUTDIR}; mkdir -p "$out"; j="$out/defaults.jsonl"
    prepare
    MAX_SEQS=64 $H serve 2b $NEW2
    pool /root/q1 3 1200 1 None True &
    pool /root/q3 3 1200 3 None True &
    wait
    $H wait $NEW2 "${WAIT:-480}"
    S="--ceiling-items 0 --items 600 --real-frames"
    # shellcheck disable=SC2086
    {
      $H bench 3 $NEW2 --root /root/q1 $S --workers 1 --inflight 64 --label "defaults distinct 1x64" --out "$j"
      $H bench 3 $NEW2 --root /root/q3 $S --workers 1 --inflight 64 --label "defaults 3/video 1x64" --out "$j"
      $H bench 3 $NEW2 --root /root/q1 --skip 600 $S --workers 4 --inflight 32 --label "defaults distinct 4x32" --out "$j"
      $H bench 3 $NEW2 --root /root/q3 --skip 600 $S --workers 4 --inflight 32 --label "defaults 3/video 4x32" --out "$j"
    } 2>&1 | tee "$out/defaults.log" ;;
  help|-h|--help) sed -n '2,/^set -/p' "$0" | sed '$d; s/^# \{0,1\}//' ;;
  *) echo "start|step3|steps12|real-start|real|real-defaults" >&2; exit 2 ;;
esac
