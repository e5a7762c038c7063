#!/usr/bin/env bash
# The run package's launcher, now on top of the queue:
#   bash deploy/run_remote.sh [--plan-only]          # every step: 8B for steps 1-2, then 2B for step 3
#   STEP=N bash deploy/run_remote.sh [--plan-only]   # one step's model only, as the run package did
# Same knobs: NGPU (default all visible), WORKERS (requests in flight per server), PORT0 (8001),
# GPU_UTIL (0.85), MAX_SEQS (derived per model from the GPU; pool_queue/launch/sizing.py), PY (python3), VLLM (vllm);
# MAX_BATCHED_TOKENS (a number, or derived: step 3's from its frames; docs/scale.md). Logs: logs/vllm_s<STEP>_gpu<i>.log and
# logs/client_s<STEP>_gpu<i>.log. It starts one vLLM server per GPU, enqueues (resuming where it
# stopped), screens until the queues are empty, then prints [STEP=N ]REMAINING_TOTAL=<n> (0: complete).
# Redis: REDIS_URL (default redis://127.0.0.1:6379/0); POOL_ROOT is the package root (default: cwd).
set -euo pipefail
PY="${PY:-python3}"
if ! "$PY" -c 'import pool_queue' 2>/dev/null; then  # one line, not Python's "Error while finding module specification"
  echo "error: $PY cannot import pool_queue: run \`source .venv/bin/activate\` in the checkout first, or set PY to the venv's python" >&2
  exit 2
fi
export POOL_ROOT="${POOL_ROOT:-$PWD}"
STEP_ARGS=()
[ -n "${STEP:-}" ] && STEP_ARGS=(--step "$STEP")
if [ "${1:-}" = "--plan-only" ]; then
  exec "$PY" -m pool_queue.commands.launch "${STEP_ARGS[@]}" --plan-only
fi
exec "$PY" -m pool_queue.commands.launch "${STEP_ARGS[@]}" --burst "$@"
