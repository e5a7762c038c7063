"""Start one vLLM server with exactly pool-launch's arguments (for benchmarks on a GPU host).

Extra arguments go after the launcher's, e.g. `--load-format dummy` for random weights when the
real ones are not there. Usage:
  python benchmarks/serve.py 1 --port 8001 --model-path /hub/.../snapshots/<rev> [--dry-run] -- --load-format dummy
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys

from pool_queue.launch.plan import Server, cores_per_server
from pool_queue.launch.vllm import Tuning, server_argv, server_env, vllm_flags
from pool_queue.protocol import Protocol
from pool_queue.settings import load_settings

P = Protocol()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("step", type=int, choices=sorted(P.steps), help="serve this step's model (and its other steps)")
    ap.add_argument("--port", type=int, default=8001)
    ap.add_argument("--model-path", required=True, help="snapshot folder of the pinned revision")
    ap.add_argument("--dry-run", action="store_true", help="print the command line only")
    ap.add_argument("--servers", type=int, default=1, help="servers sharing this host's cores (as pool-launch counts)")
    ap.add_argument("--probe", action="store_true", help="leave out flags the installed vLLM does not know")
    argv_in = sys.argv[1:]
    cut = argv_in.index("--") if "--" in argv_in else len(argv_in)
    args = ap.parse_args(argv_in[:cut])
    extra = argv_in[cut + 1 :]  # after --: more vLLM arguments
    settings = load_settings()  # MAX_SEQS, GPU_UTIL, VLLM from the environment, as for pool-launch
    srv = Server(0, os.environ.get("CUDA_VISIBLE_DEVICES", "0"), P.model_group(args.step), args.port)
    tuning = Tuning.for_cores(cores_per_server(args.servers), settings.api_servers, settings.renderer_workers)
    known = vllm_flags(settings.vllm) if args.probe else None
    argv = server_argv(settings, P, srv, args.model_path, False, tuning, known) + extra
    env = server_env(srv, False, tuning)
    print(" ".join(f"{k}={v}" for k, v in env.items() if k == "OMP_NUM_THREADS"), shlex.join(argv), flush=True)
    if not args.dry_run:
        os.execvpe(argv[0], argv, {**os.environ, **env})


if __name__ == "__main__":
    main()
