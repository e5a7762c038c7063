#!/usr/bin/env bash
# Step 3's server CPU per item on one H200, and the cuts tried, in one lease (benchmarks/step3_cpu.py).
# Three 2B servers on the one GPU, started at once (a fixed KV cache each), every other argument
# pool-launch's (benchmarks/serve.py): A as pool-launch starts it; C with vLLM's shared-memory processor
# cache (one renderer thread: 0.26 refuses the cache beside more). Then, one server at a time, fresh frames every run: distinct videos and 3 items per video,
# with and without image identifiers, py-spy --native profiles, and same-numbers checks.
# After `benchmarks/h200.sh deps` and `install` (the vLLM bundle), from the repo root on the GPU machine:
#   bash benchmarks/step3_cpu.sh start             # servers in the background
#   bash benchmarks/step3_cpu.sh measure /root/s3  # in the background: runs.jsonl, same.jsonl, prof-*.txt.gz
#   bash benchmarks/step3_cpu.sh watch /root/s3 560   # until DONE, then copies the results to $OUT
set -uo pipefail
H="bash benchmarks/h200.sh"
export PYTHONPATH="/tmp/site:/tmp/ours:$PWD" PYTHONUNBUFFERED=1
KV="--kv-cache-memory-bytes $((28 * 1024 ** 3))"
declare -A SETS=(
  [8101]=""
  [8102]="--renderer-num-workers 1 --mm-processor-cache-gb 4 --mm-processor-cache-type shm"
)
R="python3 benchmarks/step3_cpu.py"

case "${1:?start|measure|watch}" in
  start)
    export GPU_UTIL=0.22 MAX_SEQS=64
    for p in 8101 8102; do
      # shellcheck disable=SC2086
      $H serve 2b "$p" $KV ${SETS[$p]}
    done ;;
  measure)
    out=${2:?OUTDIR}
    mkdir -p "$out" && setsid nohup bash "$0" _measure "$out" > "$out/measure.log" 2>&1 < /dev/null &
    echo "measuring in the background: $out/measure.log" ;;
  _measure)
    out=$2 J="--out $2/runs.jsonl" S="--out $2/same.jsonl"
    for p in 8101 8102; do $H wait "$p" 500 || echo "SERVER $p DID NOT COME UP"; done
    nvidia-smi --query-gpu=memory.used,memory.total --format=csv
    for p in 8101 8102; do $R run --port "$p" --label warm --items 30 --k 3; done
    # A: pool-launch's server
    $R run --port 8101 --label A --mode distinct --items 150 $J
    $R run --port 8101 --label A --items 300 $J
    $R run --port 8101 --label A+uuid --items 300 --uuid $J
    $R run --port 8101 --label prof-A-distinct --mode distinct --items 150 --profile 8 --profile-out "$out/prof-A-distinct.txt" $J
    $R run --port 8101 --label prof-A-k3 --items 300 --profile 10 --profile-out "$out/prof-A-k3.txt" $J
    $R run --port 8101 --label prof-A-k3-uuid --items 300 --uuid --profile 10 --profile-out "$out/prof-A-k3-uuid.txt" $J
    # C: shared-memory processor cache
    $R run --port 8102 --label C+uuid --items 300 --uuid $J
    $R run --port 8102 --label C --items 300 $J
    $R run --port 8102 --label C+uuid --mode distinct --items 150 --uuid $J
    $R run --port 8102 --label C+uuid-serial-noresend --mode serial --items 300 --uuid --no-resend $J
    $R run --port 8102 --label prof-C-k3-uuid --items 300 --uuid --profile 10 --profile-out "$out/prof-C-k3-uuid.txt" $J
    # the same numbers: A plain against each shape
    $R same --a 8101 --b 8101 --b-uuid --n 8 $S
    $R same --a 8101 --b 8102 --b-uuid --n 8 $S
    $R same --a 8101 --b 8102 --b-uuid --b-no-resend --n 8 $S
    # repeats, for the spread within this lease
    $R run --port 8101 --label A --items 300 $J
    $R run --port 8102 --label C+uuid --items 300 --uuid $J
    $R run --port 8101 --label A+uuid --items 300 --uuid $J
    for f in "$out"/prof-*.txt; do [ -f "$f" ] && $R parts "$f" --unclassified 25 > "${f%.txt}.parts.txt" && gzip -f "$f"; done
    for p in 8101 8102; do grep -E "Error|error|non-default|Using|cache" "/root/vllm-$p.log" | tail -n 15 > "$out/log-$p.txt"; done
    echo DONE ;;
  watch)
    out=${2:?OUTDIR} lim=${3:-560} t0=$SECONDS
    while [ $((SECONDS - t0)) -lt "$lim" ] && ! grep -q '^DONE' "$out/measure.log" 2>/dev/null; do sleep 5; done
    tail -n 40 "$out/measure.log" | cut -c1-400
    if [ -n "${OUT:-}" ]; then   # three files back: the two tables and everything in one archive
      cp "$out"/runs.jsonl "$out"/same.jsonl "$OUT/" 2>/dev/null
      (cd "$out" && tar -czf "$OUT/s3.tgz" --exclude='*.txt.gz.tmp' ./*)
    fi ;;
  help|-h|--help) sed -n '2,/^set -/p' "$0" | sed '$d; s/^# \{0,1\}//' ;;
  *) echo "start|measure|watch" >&2; exit 2 ;;
esac
