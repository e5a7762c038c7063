#!/usr/bin/env bash
# Step 3 (2B, 32 frames) under vLLM server options that change neither the model nor its numbers:
# every option set gets its own server on the one GPU (all started at once, a fixed KV cache each so
# their start-ups cannot upset each other's memory profiling), then, one server at a time: the plain
# client's ceiling with a py-spy profile in its middle, the same-numbers check against the default,
# and the whole system on the default and on the fastest set. After `benchmarks/h200.sh deps` and
# `install`, from the repo root on the GPU machine:
#   bash benchmarks/step3_options.sh start          # servers in the background, a pool in /root/b3
#   bash benchmarks/step3_options.sh measure OUTDIR # throughput.jsonl, prof-*.txt, same-*.txt
set -euo pipefail
H="bash benchmarks/h200.sh"
export PYTHONPATH="/tmp/site:/tmp/ours:$PWD"   # as h200.sh: the bundle and our wheels
KV="--kv-cache-memory-bytes 12884901888"   # 12 GiB: ~110 k tokens, many times one 32768-token batch
declare -A SETS=(
  [8002]="default|"
  [8003]="torch_shm|--mm-tensor-ipc torch_shm"
  [8004]="renderer4|--mm-tensor-ipc torch_shm --renderer-num-workers 4 --mm-processor-cache-gb 0"
  [8005]="vit_graphs|--compilation-config {\"cudagraph_mm_encoder\":true}"
  [8006]="api8|--api-server-count 8 --mm-tensor-ipc torch_shm"
)
PORTS=$(printf '%s\n' "${!SETS[@]}" | sort)
CEIL="--items 0 --ceiling-items ${CEILING_ITEMS:-320} --procs 4 --conc 24"
SYS="--skip ${CEILING_ITEMS:-320} --ceiling-items 40 --items ${SYSTEM_ITEMS:-320} --procs 4 --conc 24 --workers 4 --inflight 32"

case "${1:?start|measure}" in
  start)
    export GPU_UTIL=0.15 MAX_SEQS=256
    for p in $PORTS; do
      # shellcheck disable=SC2086  # the option set is a word list
      $H serve 2b "$p" $KV ${SETS[$p]#*|}
    done
    python3 -c "import sys; sys.path.insert(0, 'benchmarks'); from pathlib import Path; from _pool import pool_items; \
print(len(pool_items(Path('/root/b3'), 3, 760)), 'items in /root/b3')"
    for p in $PORTS; do $H wait "$p" "${WAIT:-450}" || echo "${SETS[$p]%%|*} on :$p did not come up"; done
    nvidia-smi --query-gpu=memory.used,memory.total --format=csv ;;
  measure)
    out=${2:?OUTDIR}
    mkdir -p "$out"
    up="" k=0
    for p in $PORTS; do
      label=${SETS[$p]%%|*}
      python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$p/health', timeout=3)" 2>/dev/null \
        || { echo "skip $label: :$p is not up"; continue; }
      up="$up $p"
      (sleep "${PROFILE_AFTER:-18}"; $H profile "$p" 10 "$out/prof-$label.txt" >/dev/null 2>&1 || true) &
      # shellcheck disable=SC2086
      $H bench 3 "$p" $CEIL --root /root/b3 --label "$label" --out "$out/throughput.jsonl"
      wait
      # fresh items for each pair (past the system runs' items), so neither side answers from its cache
      [ "$p" = 8002 ] || $H same 3 8002 "$p" 10 --root /root/b3 --skip $((680 + 10 * k++)) | tee "$out/same-$label.txt"
    done
    best=$(python3 -c "import json,sys; r=[json.loads(l) for l in open('$out/throughput.jsonl')]; \
b=max(r, key=lambda x: x['ceiling']['fwd_s']); print(b['server'].rsplit(':', 1)[1])")
    echo "fastest: ${SETS[$best]%%|*} (:$best)"
    for p in $(printf '%s\n' 8002 "$best" | sort -u); do
      # shellcheck disable=SC2086
      $H bench 3 "$p" $SYS --root /root/b3 --label "${SETS[$p]%%|*}+system" --out "$out/throughput.jsonl"
    done
    for p in $up; do tail -n 3 "/root/vllm-$p.log" > "$out/log-tail-$p.txt"; done ;;
  help|-h|--help) sed -n '2,/^set -/p' "$0" | sed '$d; s/^# \{0,1\}//' ;;
  *) echo "start|measure" >&2; exit 2 ;;
esac
