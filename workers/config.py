"""A worker's configuration: every value it runs with, as one frozen object made once from the settings and
pool-worker's flags (`workers.main.worker_config`). The loop (`runtime`) and its background duties (`upkeep`)
read it from here, so no value is kept twice."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pool_queue.inputs.frames import DEFAULT_MAX_PIXELS
from pool_queue.jobs import lease as leases

from .screen import VideoSend


@dataclass(frozen=True, kw_only=True)
class WorkerConfig:
    """What a worker is configured with, apart from the live parts (Redis, the client, the store) it is given
    beside it."""

    name: str  # unique: `unique_name`
    server: str  # the vLLM base URL it feeds
    steps: tuple[int, ...]  # the steps it takes jobs of
    max_inflight: int  # forwards in flight to the server
    frames_dir: Path
    redis: str  # the Redis URL as messages say it (no password)
    wait_redis_s: float  # how long an outage of Redis is waited out
    timing: leases.Timing
    silent_s: float  # Settings.silent_bound_s: one rule, kept there
    burst: bool = False  # exit once the queues of its steps are empty
    poll_s: float = 0.5  # how often an idle worker looks for a job
    note_s: float = 60.0  # a wait that lasts says so this often
    metrics_port: int | None = None  # serve /metrics here (0: any free port)
    max_frame_pixels: int = DEFAULT_MAX_PIXELS
    video_send: VideoSend = "adjacent"
