#!/usr/bin/env bash
# Both models on one H200 at once (8B at 0.55, 2B at 0.30 of its memory) against one model at a time.
#   bash benchmarks/coserve.sh start     start both servers (background, setsid) and wait for both
#   bash benchmarks/coserve.sh measure   step-1 load alone, step-3 load alone, both together (GPU busy per phase)
#   bash benchmarks/coserve.sh help
# On the lent GPU machine, from the project root, with shared/gpu's bundle carried as .gpu/ and its chunks
# stashed (as for gpu_run.sh): `bash benchmarks/coserve.sh start`, then `measure` in the next call; the
# collection comes back as $OUT/cos.tgz. The machine's paths, as environment variables with their defaults:
#   GPU_BASE=.gpu/base (shared/gpu's device_install.sh, loadgen.py, step3_prefix.py)
#   VLLM_ENV=/root/vllm_env.sh (the bundle's environment, written by its install)  WORK=/root/cos
set -uo pipefail
B=${GPU_BASE:-.gpu/base}
R=${WORK:-/root/cos}
case "${1:-help}" in start|measure) ;; help|-h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
  *) echo "coserve.sh: start|measure|help" >&2; exit 2 ;; esac
# shellcheck disable=SC1090
source "${VLLM_ENV:-/root/vllm_env.sh}"
mkdir -p "$R"
busy() {  # mean SM busy over the dmon file's non-header lines
  python3 - "$1" <<'PY'
import sys
v=[int(l.split()[1]) for l in open(sys.argv[1]) if l.strip() and not l.startswith("#") and l.split()[1].isdigit()]
print(f"SM_BUSY {sum(v)/max(1,len(v)):.1f} over {len(v)} s")
PY
}
step1() { local p=""; for k in 1 2 3 4; do python3 $B/loadgen.py --port 8000 --mode text -n 3000 -c 64 --seed $k --out $R/s1_$1.jsonl > $R/s1_$1_$k.log 2>&1 & p="$p $!"; done; wait $p; }
step3() { python3 $B/step3_prefix.py --port ${2:-8001} --items 480 --k 3 --conc 64 --modes warmup,adjacent > $R/s3_$1.log 2>&1; }
phase() {  # name, then the command
  local name=$1; shift
  nvidia-smi dmon -s u -d 1 > $R/dmon_$name.txt 2>&1 & local d=$!
  local t0=$SECONDS; "$@"; local t=$((SECONDS - t0)); kill $d
  echo "PHASE $name WALL_S $t $(busy $R/dmon_$name.txt)"
}
case "$1" in
start)
  OMP_NUM_THREADS=1 PORT=8000 GPU_UTIL=0.55 WAIT=560 bash $B/device_install.sh serve 8b --api-server-count 4 --max-num-seqs 256 > $R/serve8.out 2>&1 &
  sleep 20
  OMP_NUM_THREADS=1 PORT=8001 GPU_UTIL=0.30 WAIT=540 bash $B/device_install.sh serve 2b --api-server-count 8 --max-num-seqs 64 --renderer-num-workers 3 > $R/serve2.out 2>&1 &
  wait; tail -n 3 $R/serve8.out $R/serve2.out; nvidia-smi --query-gpu=memory.used,memory.total --format=csv ;;
measure)
  phase s1alone step1 alone
  phase s3alone step3 alone
  phase both bash -c "$(declare -f step1 step3); R=$R B=$B; step1 both & p=\$!; step3 both; wait \$p"
  for f in $R/s1_alone.jsonl $R/s1_both.jsonl; do echo "$f"; cut -c1-200 $f; done
  grep -h -i "items/s\|adjacent" $R/s3_alone.log $R/s3_both.log | head -8 ;;
esac
tar czf $OUT/cos.tgz -C $R . 2>/dev/null; true
