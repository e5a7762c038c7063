#!/usr/bin/env bash
# One more step-3 setup on the pool ab.sh screened: its `auto` results without step 3, screened again by
# `pool-launch --burst --step 3` with the environment given (e.g. WORKERS=64 MAX_SEQS=64), exported beside
# the others for summary.py (its steps 1-2 are the `auto` run's).
#   bash step3_variant.sh NAME [VAR=VALUE ...]
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
name=$1; shift
export PYTHONPATH=/tmp/site:/tmp/ours:$PWD PYTHONUNBUFFERED=1 PATH=/tmp/site/bin:/tmp/ours/bin:$PATH
export VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
export VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 VLLM_DO_NOT_TRACK=1 TOKENIZERS_PARALLELISM=false
export HF_HOME=/root/hfhome POOL_ROOT=/root/pool REDIS_URL=redis://127.0.0.1:6379/0 VLLM=/root/vllm-dummy
E=/root/ab R=/root/pool/results
rm -rf "$R/$name" && cp -r "$R/auto" "$R/$name" && rm -rf "$R/$name/step3" "$R/$name/prefix_cache" "$R/$name/PROTOCOL.json"  # a screen of its own
export POOL_RESULTS=$R/$name "$@"
python3 "$here/sampler.py" "$E/samples-$name.txt" &
sampler=$!
python3 -m pool_queue.commands.launch --burst --step 3 2>&1 | grep -E "server options|MAX_SEQS|healthy|REMAINING" | tail -6
kill $sampler
python3 -c "import sys; from pool_queue.commands.export import main; main(sys.argv[1:])" --out "$E/export-$name" > /dev/null 2>&1
