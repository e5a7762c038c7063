#!/usr/bin/env bash
# The run package's launcher, now on top of the queue:
#   STEP=N bash deploy/run_remote.sh [--plan-only]
# Same knobs: NGPU (default all visible), WORKERS (requests in flight per server), PORT0 (8001),
# GPU_UTIL (0.85), MAX_SEQS (64), PY (python3), VLLM (vllm). Logs: logs/vllm_s<STEP>_gpu<i>.log and
# logs/client_s<STEP>_gpu<i>.log. It starts one vLLM server per GPU, enqueues step STEP (resuming where
# it stopped), screens until the queues are empty, then prints REMAINING_TOTAL=<n> (0: step complete).
# Redis: REDIS_URL (default redis://127.0.0.1:6379/0); POOL_ROOT is the package root (default: cwd).
set -euo pipefail
: "${STEP:?set STEP=1, 2 or 3}"
PY="${PY:-python3}"
export POOL_ROOT="${POOL_ROOT:-$PWD}"
if [ "${1:-}" = "--plan-only" ]; then
  exec "$PY" -m pool_queue.commands.launch --step "$STEP" --plan-only
fi
exec "$PY" -m pool_queue.commands.launch --step "$STEP" --burst "$@"
