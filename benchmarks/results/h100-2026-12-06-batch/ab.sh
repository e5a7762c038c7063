#!/usr/bin/env bash
# The batch path against one request per forward, through the system's own launcher on one GPU: the same
# pool screened twice by `pool-launch --burst`, first with POOL_BATCH=off (one request per forward, and the
# server options of a release without the batch endpoint), then with the defaults (a video's items as one
# /v1/chat/completions/batch request, siblings' frames by uuid from the processor cache; step 1's four
# orders as one). Per run: every step's rate; over step 3's span the GPU busy and the CPU of every vLLM
# process (from /proc) per item; then the two runs' top-20 compared item by item (summary.py).
#
# On the GPU machine, after ../../../../shared/gpu's bundle is stashed (calls 1-6 of e2e.sh), back to back:
#   7: carry [".gpu/c07", ".gpu/base", ".whl"]:  bash .gpu/base/e2e.sh setup && bash benchmarks/results/h100-2026-12-06-batch/ab.sh run 3000
#   8+: bash benchmarks/results/h100-2026-12-06-batch/ab.sh watch 560   (until DONE; results under $OUT/ab)
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
export PYTHONPATH=/tmp/site:/tmp/ours:$PWD PYTHONUNBUFFERED=1 PATH=/tmp/site/bin:/tmp/ours/bin:$PATH
export VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
export VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 VLLM_DO_NOT_TRACK=1 TOKENIZERS_PARALLELISM=false
export HF_HOME=/root/hfhome POOL_ROOT=/root/pool REDIS_URL=redis://127.0.0.1:6379/0 VLLM=/root/vllm-dummy
E=/root/ab
cmd() { local m=$1; shift; python3 -c "import sys; from pool_queue.commands.$m import main; sys.argv[0] = 'pool-$m'; main(sys.argv[1:])" "$@"; }

case "${1:?run|watch}" in
  run)
    mkdir -p $E && setsid nohup bash "$0" _run "${2:-3000}" > $E/run.log 2>&1 < /dev/null &
    echo "started (log $E/run.log)" ;;
  _run)
    n=$2
    rb=$(python3 -c "from pool_queue.procs import redis_binary; print(redis_binary())")
    mkdir -p /root/redis && (cd /root/redis && setsid nohup "$rb" --port 6379 --appendonly yes --save '' > /root/redis/log 2>&1 < /dev/null &)
    python3 - <<PY
from pathlib import Path
from pool_queue.synth import generate, SynthConfig
print(generate(Path("/root/pool"), SynthConfig(n_items=$n, n_videos=int($n / 2.7), seed=11, k_fraction=0.3,
      missing_fraction=0.05, frames=(32, 48), frame_formats=(("jpeg448", 1.0),))))
PY
    for mode in off auto; do
      export POOL_BATCH=$mode POOL_RESULTS=/root/pool/results/$mode
      python3 "$here/sampler.py" "$E/samples-$mode.txt" &
      sampler=$!
      echo "=== POOL_BATCH=$mode pool-launch --burst at $(date +%T)"
      t=$(date +%s)
      python3 -m pool_queue.commands.launch --burst 2>&1 | while IFS= read -r l; do echo "$(date +%T) $l"; done
      echo "LAUNCH_RC ${PIPESTATUS[0]} WALL_S $(( $(date +%s) - t ))"
      kill $sampler
      cmd export --out $E/export-$mode > $E/export-$mode.log 2>&1
      cmd audit --complete > $E/audit-$mode.txt 2>&1; echo "AUDIT_RC $?" >> $E/audit-$mode.txt
      tail -2 $E/audit-$mode.txt
    done
    bash "$here/step3_variant.sh" auto64 WORKERS=64 MAX_SEQS=64  # step 3 again, 64 in flight (the H200's plan)
    python3 "$here/summary.py" $E off auto auto64 | tee $E/summary.txt
    echo DONE ;;
  watch)
    lim=${2:-560} t0=$SECONDS
    while [ $((SECONDS - t0)) -lt "$lim" ]; do
      grep -q '^DONE' $E/run.log 2>/dev/null && break
      sleep 10
    done
    grep -E '===|LAUNCH|healthy|server options|batch|MAX_SEQS|AUDIT|Error|error|DONE' $E/run.log | tail -30
    if grep -q '^DONE' $E/run.log; then
      mkdir -p "$OUT/ab" && cp $E/run.log $E/summary.txt "$OUT/ab/"
      (cd $E && tar czf "$OUT/ab/raw.tgz" run.log summary.txt samples-*.txt audit-*.txt export-*/parquet)
      echo "copied to OUT"
    fi ;;
esac
