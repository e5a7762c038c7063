#!/bin/sh
# The compose node: pool-launch on this host's GPUs until `docker compose stop` (SIGTERM: the workers finish
# their jobs, rows are written and acknowledged, the servers stop). Every step; sizes, in-flight and server
# options derived from the GPU (NGPU, GPU_UTIL, MAX_SEQS, MAX_BATCHED_TOKENS, WORKERS override); POOL_SIM=1:
# simulated servers.
# Each host writes its own log folder, so hosts sharing the package root never share a log file.
set -eu
export POOL_LOGS="${POOL_LOGS:-/pool/logs/$(hostname)}"
if [ "${POOL_SIM:-0}" = 1 ]; then
  set -- --sim --sim-speed "${SIM_SPEED:-20}" "$@"
fi
exec pool-launch "$@"
