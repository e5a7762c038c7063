"""One settings object for every command: environment, `.env` and flags, in rising priority.

The run package's knobs (NGPU, WORKERS, PORT0, GPU_UTIL, MAX_SEQS, PY, VLLM) keep their plain
names so existing habits (`STEP=1 NGPU=2 bash run_remote.sh`) carry over; our own settings use the
`POOL_` prefix. Secrets are `SecretStr`: printing the settings never shows them.
"""

from __future__ import annotations

import difflib
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit, urlunsplit

from dotenv import dotenv_values
from dotenv.parser import parse_stream
from pydantic import AliasChoices, Field, PrivateAttr, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict
from redis import Redis

from .errors import SetupError
from .proc.hostlock import is_held
from .text import steps_label

PositiveCount = Annotated[int, Field(ge=1)]
DEMO_ENV_MARK = "# written by pool-demo: bare pool-* commands in this folder find the demo; delete it to stop that\n"
BURST_WAIT_S = 30.0  # how long a one-off run (`pool-worker --burst`, `pool-launch --sim`) waits for Redis or a server


class Settings(BaseSettings):
    """Every field's description is its line in the settings reference (docs/deployment.md, made by `make docs`
    through `pool_queue.settings_doc`), so each says what the field does; `json_schema_extra={"flags": [...]}`
    names the command flags of its own that set it (a unit test checks them against that command's --help)."""

    model_config = SettingsConfigDict(env_file=".env", env_prefix="POOL_", extra="ignore", populate_by_name=True)

    root: Path = Field(
        default_factory=lambda: default_root(),
        description="package root: items/, frames/, results/, logs/; default the current folder where it holds "
        "items/ (run_remote.sh runs inside the package), else ./pool",
    )
    results: Path | None = Field(default=None, description="results root; default `<root>/results/pool`")
    logs: Path | None = Field(default=None, description="log folder; default `<root>/logs`")
    redis_url: str = Field(
        default="redis://127.0.0.1:6379/0",
        validation_alias=AliasChoices("POOL_REDIS_URL", "REDIS_URL"),
        description="the queue's Redis, redis://HOST:PORT/DB (rediss:// for TLS, unix:// for a socket); its password "
        "goes in REDIS_PASSWORD, never in the URL, so a printed address shows no secret",
    )
    redis_url_file: Path | None = Field(
        default=None,
        description="a file holding the Redis URL (a Slurm Redis job writes it), read again while pool-launch waits",
    )
    redis_password: SecretStr | None = Field(
        default=None,
        validation_alias=AliasChoices("POOL_REDIS_PASSWORD", "REDIS_PASSWORD"),
        description="Redis's password (requirepass); never printed",
    )
    servers: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="vLLM base URLs, comma-separated; pool-worker takes the first (or --server)"
    )
    vllm_api_key: SecretStr | None = Field(
        default=None,
        validation_alias=AliasChoices("POOL_VLLM_API_KEY", "VLLM_API_KEY"),
        description="the bearer key a worker sends its vLLM server (one started with --api-key); never printed",
    )
    hf_token: SecretStr | None = Field(
        default=None,
        validation_alias=AliasChoices("HF_TOKEN", "POOL_HF_TOKEN"),
        description="Hugging Face token for pool-fetch's downloads and pool-upload; never printed",
    )
    protocol_file: Path | None = Field(default=None, description="protocol JSON replacing the built-in v1")
    allow_missing_frames: bool = Field(
        default=False,
        description="steps with frames run (and pool-audit --complete passes) although videos that are not `k:` "
        "have no frame folder in a cache that is absent, empty or short of its manifest: they are meant to be missing",
        json_schema_extra={"flags": ["pool-enqueue --allow-missing-frames", "pool-launch --allow-missing-frames"]},
    )

    # The run package's launcher knobs, with its defaults.
    ngpu: int | None = Field(
        default=None,
        validation_alias=AliasChoices("NGPU", "POOL_NGPU"),
        ge=0,
        description="pool-launch uses this node's first N GPUs (CUDA_VISIBLE_DEVICES, else nvidia-smi); default all "
        "of them (with --sim: N simulated servers, default 1)",
    )
    workers: int | None = Field(
        default=None,
        validation_alias=AliasChoices("WORKERS", "POOL_WORKERS"),
        ge=1,
        description="forwards in flight per server; default from MAX_SEQS and the step (pool_queue.launch.sizing)",
        json_schema_extra={"flags": ["pool-worker --inflight"]},
    )
    port0: int = Field(
        default=8001,
        validation_alias=AliasChoices("PORT0", "POOL_PORT0"),
        ge=1,
        le=65535,
        description="pool-launch's first vLLM server listens here, the next on PORT0+1, and so on",
    )
    gpu_util: float = Field(
        default=0.85,
        validation_alias=AliasChoices("GPU_UTIL", "POOL_GPU_UTIL"),
        gt=0,
        le=1,
        description="vLLM --gpu-memory-utilization for a server alone on its GPU (servers sharing one split it)",
    )
    max_seqs: Annotated[PositiveCount | dict[int, PositiveCount] | None, NoDecode] = Field(
        default=None,
        validation_alias=AliasChoices("MAX_SEQS", "POOL_MAX_SEQS"),
        description="vLLM --max-num-seqs: one number for every server, or per step (`3:64`, `1:256,3:64`) for the "
        "servers of those steps' model, the others derived; default per model group from the GPU's memory "
        "(pool_queue.launch.sizing)",
    )
    max_batched_tokens: int | Literal["derived"] | None = Field(
        default=None,
        validation_alias=AliasChoices("MAX_BATCHED_TOKENS", "POOL_MAX_BATCHED_TOKENS"),
        description="vLLM --max-num-batched-tokens for every server; `derived`: step 3's from its frames and the "
        "vLLM release (pool_queue.launch.sizing.step_budget); default 32768 for steps with many images, else 16384",
    )
    py: str = Field(
        default="python3",
        validation_alias=AliasChoices("PY", "POOL_PY"),
        description="the Python that deploy/run_remote.sh and the Slurm jobs run pool_queue with (read by the scripts)",
    )
    vllm: str = Field(
        default="vllm",
        validation_alias=AliasChoices("VLLM", "POOL_VLLM"),
        description="the vLLM command pool-launch runs (`$VLLM serve ...`), split like a shell line",
    )
    api_servers: int | None = Field(default=None, ge=1, description="vLLM --api-server-count; default from cores/GPU")
    renderer_workers: int | None = Field(
        default=None, ge=1, description="vLLM --renderer-num-workers; default from cores/GPU"
    )

    # Worker behaviour.
    max_attempts: int = Field(default=4, ge=1, description="attempts per forward for transient failures")
    request_timeout_s: float = Field(
        default=120.0, gt=0, description="one forward's HTTP timeout; a timeout is a transient failure, retried"
    )
    server_silent_s: float | None = Field(
        default=None,
        gt=0,
        description="a worker whose server answered no forward this long gives its jobs back (2 x request timeout)",
    )
    retry_backoff_s: float = Field(default=0.5, ge=0, description="first retry's backoff; doubles per attempt")
    chunk_size: int = Field(
        default=64,
        ge=1,
        le=10_000,
        description="items per queued job: the unit a dead worker's lease gives back and a rescue re-queues",
        json_schema_extra={"flags": ["pool-enqueue --chunk-size"]},
    )
    max_frame_pixels: int = Field(default=50_000_000, ge=1, description="a larger frame is an error row, never decoded")
    video_send: Literal["adjacent", "serial"] = Field(
        default="adjacent",  # H200, 448-px JPEG frames, 3 items per video: 29.8 items/s adjacent, 21.1 serial (h200.md)
        description="steps with frames: a video's items all at once; or its first, then its siblings once answered",
    )
    batch: Literal["auto", "off"] = Field(
        default="auto",
        description="auto: where the server lists /v1/chat/completions/batch, a video's items (step 1: an item's "
        "orders) go as one batch request, siblings' frames by uuid from its processor cache; off: one per forward",
    )
    metrics_port: int | None = Field(
        default=None,
        ge=0,
        le=65535,
        description="a worker serves Prometheus /metrics on this port; 0: any free port; default none",
        json_schema_extra={"flags": ["pool-worker --metrics-port"]},
    )

    # Recovery: a dead worker's jobs are back within lease_s + rescue_s of its last heartbeat.
    lease_s: int = Field(default=30, ge=2, description="a running job's lease; renewed every heartbeat_s")
    heartbeat_s: float = Field(
        default=5.0, gt=0, description="how often a worker renews its leases and presence; at most half of lease_s"
    )
    rescue_s: float = Field(default=15.0, gt=0, description="how often each worker re-queues expired leases")
    job_max_failures: int = Field(default=3, ge=1, description="runs that raised before a job is failed for good")
    wait_redis_s: float = Field(
        default=3600.0,
        ge=0,
        description="how long a worker or pool-launch waits out a Redis outage",
        json_schema_extra={"flags": ["pool-worker --wait-redis"]},
    )
    wait_server_s: float = Field(
        default=3600.0,
        ge=0,
        description="how long a starting worker waits for its server",
        json_schema_extra={"flags": ["pool-worker --wait-server"]},
    )
    wait_note_s: float = Field(default=60.0, gt=0, description="a worker's wait that lasts says so this often")

    _flags: dict[str, Any] = PrivateAttr(default_factory=dict)  # the values given as flags (load_settings)

    def origin(self, name: str) -> Source | None:
        """Where the value in force of field `name` was given (a flag, the environment, the env file); None for
        a default or a value a command put in its place (an embedded Redis, POOL_REDIS_URL_FILE's address)."""
        src = source(name, self._flags)
        value = getattr(self, name)
        if src is None or src.raw is None or not (src.raw == str(value) or Path(src.raw) == value):
            return None
        return src

    def results_named(self) -> str:
        """How the results folder in force was chosen, for an error that names it: its flag or variable (and
        the `.env` file that holds it), else the package root it is the default under."""
        if (src := self.origin("results")) is not None:
            return str(src)
        root = self.origin("root")
        return "the default under the package root" + (f", {root}" if root else "")

    def root_named(self) -> str:
        """How the package root in force was chosen, for an error that names it: its flag or variable (and the
        `.env` file that holds it), else the default's rule, so a user in the wrong folder learns why."""
        if (src := self.origin("root")) is not None:
            return str(src)
        if self.root == Path("."):
            return "the default: this folder, as it holds items/"
        return f"the default, ./{self.root}, as this folder holds no items/: run from the package root, or give --root"

    def redis_said(self) -> str:
        """The Redis address for a message; where it was read from a file, that file too (a `.env` a demo
        left), and whether that demo still runs: a user who never typed the address learns where it lives."""
        src = self.origin("redis_url")
        if src is None or src.file is None:
            return self.redis_where()
        demo = demo_env_root(src.file)
        if demo is not None:
            state = "runs" if is_held("pool-demo", demo) else "is not running"
            return f"{self.redis_where()} ({src}, written by pool-demo for a demo that {state})"
        return f"{self.redis_where()} ({src})"

    def demo_gone(self) -> str | None:
        """Where the Redis URL came from a `.env` that pool-demo wrote and that demo no longer runs, the line that
        says so and what to do: its Redis stopped with it, so no wait for it can help. None otherwise."""
        src = self.origin("redis_url")
        if src is None or src.file is None or (demo := demo_env_root(src.file)) is None or is_held("pool-demo", demo):
            return None
        return (f"Redis at {self.redis_said()} unreachable (it stopped with the demo): delete {src.file} (or run "
                "pool-demo again), or set REDIS_URL to a running Redis")  # fmt: skip

    @property
    def silent_bound_s(self) -> float:
        """Two full request timeouts: a healthy server answers some forward within one, and a forward has
        (by default) 4 attempts before its item is charged, so the jobs move before any item is."""
        return self.server_silent_s or 2 * self.request_timeout_s

    @model_validator(mode="after")
    def _beats_within_lease(self) -> Settings:
        if self.heartbeat_s * 2 > self.lease_s:
            raise ValueError(f"heartbeat_s ({self.heartbeat_s}) must be at most half of lease_s ({self.lease_s})")
        return self

    @field_validator("max_batched_tokens", mode="before")
    @classmethod
    def _budget(cls, v: Any) -> Any:
        """A whole number of tokens above 0, or `derived`; anything else is named as it was given."""
        text = str(v).strip()
        if v is None or text == "derived":
            return None if v is None else "derived"
        if isinstance(v, bool) or not text.isdigit() or int(text) < 1:
            raise ValueError(f"{v!r} is neither a number of tokens above 0 nor derived")
        return int(text)

    @field_validator("redis_url")
    @classmethod
    def _redis_url(cls, v: str) -> str:
        return check_redis_url(v)

    @field_validator("max_seqs", mode="before")
    @classmethod
    def _per_step(cls, v: Any) -> Any:
        """`3:64` or `1:256,3:64`: a batch for the servers of the steps named; a bare number stays one for all."""
        if not isinstance(v, str) or ":" not in v:
            return v
        out: dict[int, int] = {}
        for part in filter(None, (p.strip() for p in v.split(","))):
            step, seqs = (x.strip() for x in part.partition(":")[::2])
            if not all(x.isascii() and x.isdigit() and int(x) >= 1 for x in (step, seqs)):
                raise ValueError(f"{v!r}: give one number, or STEP:NUMBER pairs of whole numbers from 1, such as "
                                 "3:64 or 1:256,3:64")  # fmt: skip
            if int(step) in out:
                raise ValueError(f"{v!r}: step {int(step)} is given twice")
            out[int(step)] = int(seqs)
        return out

    def max_seqs_for(self, steps: tuple[int, ...]) -> int | None:
        """MAX_SEQS as set for the server of these steps' model: one number for all, or the number given for
        one of its steps (None: derived). Two different numbers for one server's steps are one line, exit 2."""
        if not isinstance(self.max_seqs, dict):
            return self.max_seqs
        given = {self.max_seqs[s] for s in steps if s in self.max_seqs}
        if len(given) > 1:
            raise SetupError(f"MAX_SEQS gives {steps_label(steps)}, which one server serves, different batches "
                             f"({', '.join(map(str, sorted(given)))}): give them one")  # fmt: skip
        return given.pop() if given else None

    @field_validator("servers", mode="before")
    @classmethod
    def _split_servers(cls, v: Any) -> Any:
        if isinstance(v, str):
            return [s.strip().rstrip("/") for s in v.split(",") if s.strip()]
        return v

    @property
    def items_dir(self) -> Path:
        return self.root / "items"

    @property
    def frames_dir(self) -> Path:
        return self.root / "frames" / "pool_frames"

    @property
    def frames_tar_dir(self) -> Path:
        """The frame shards and their manifest (`frames_manifest.json`), as the run package downloads them."""
        return self.root / "frames_tar"

    @property
    def results_dir(self) -> Path:
        return self.results if self.results is not None else default_results(self.root)

    @property
    def logs_dir(self) -> Path:
        return self.logs if self.logs is not None else self.root / "logs"

    def redis_kwargs(self) -> dict[str, Any]:
        pw = self.redis_password.get_secret_value() if self.redis_password else None
        return {"password": pw} if pw else {}

    def redis(self) -> Redis:
        """A client that gives up on a silent Redis in seconds instead of hanging (an outage is then
        an error the caller waits out, not a stuck thread)."""
        return Redis.from_url(
            self.redis_url, socket_connect_timeout=5, socket_timeout=15, health_check_interval=15, **self.redis_kwargs()
        )

    def redis_where(self) -> str:
        """The Redis address without credentials, for messages."""
        return self.redis_url.split("@")[-1]


def check_redis_url(v: str) -> str:
    """A URL that cannot be right fails at once, with what is wrong (never a traceback, never a guess, never
    its password: the message shows the URL with it masked)."""
    u = urlsplit(v)
    masked = urlunsplit(u._replace(netloc=f"{u.username or ''}:***@{u.netloc.rpartition('@')[2]}"))
    shown = repr(masked if u.password else v)
    if u.scheme not in ("redis", "rediss", "unix"):
        raise ValueError(f"{shown} is not a Redis URL: write redis://HOST:PORT/DB (password in REDIS_PASSWORD)")
    try:
        port = u.port
    except ValueError as e:
        raise ValueError(f"{shown}: bad port ({str(e).replace(u.password or chr(0), '***')})") from None
    if u.scheme != "unix" and (not u.hostname or port == 0):
        raise ValueError(f"{shown}: needs a host (and a port from 1 to 65535)")
    db = u.path.strip("/") if u.scheme != "unix" else ""
    if db and not db.isdigit():
        raise ValueError(f"{shown}: the database after the last / must be a number, not {db!r}")
    try:
        # what redis-py itself refuses (an unknown query option), said in one line; no socket is opened
        Redis.from_url(v).connection_pool.make_connection()
    except (TypeError, ValueError) as e:
        raise ValueError(f"{shown}: {str(e).replace(u.password or chr(0), '***')}") from None
    return v


@dataclass(frozen=True)
class Source:
    """Where a setting was given, as its user can go and change it."""

    name: str  # as given: "--redis-url", "REDIS_URL", "POOL_RESULTS"
    file: Path | None  # the env file that holds it; None: a flag or the environment
    raw: str | None  # the text given (None: a flag whose value is not text)

    def __str__(self) -> str:
        if self.file is not None:
            return f"{self.name} from {self.file}"
        return self.name if self.name.startswith("--") else f"{self.name} in the environment"


def env_names(field: str, model: type[BaseSettings] = Settings) -> list[str]:
    """The variables that set field `field`, in the order pydantic-settings tries them: its aliases, else
    the prefix (POOL_) and its name."""
    prefix = model.model_config.get("env_prefix") or ""
    choices = getattr(model.model_fields[field].validation_alias, "choices", None) or [f"{prefix}{field.upper()}"]
    return [c for c in choices if isinstance(c, str)]


def source(name: str, flags: Mapping[str, Any]) -> Source | None:
    """Where field `name` (or one of its variable names, as a validation error locates it) was given: the flag,
    else the variable set in the environment, else the one in the env file, by the name the user wrote there
    (REDIS_URL rather than its alias POOL_REDIS_URL); None where nothing gave it."""
    for field in Settings.model_fields:
        names = env_names(field)
        if name != field and name not in names:
            continue
        if flags.get(field) is not None:
            v = flags[field]
            return Source("--" + field.replace("_", "-"), None, str(v) if isinstance(v, str | Path) else None)
        if (env := next((c for c in names if c in os.environ), None)) is not None:
            return Source(env, None, os.environ[env])
        path = env_file()
        if path and os.path.isfile(path):
            found = dotenv_values(path)
            if (var := next((c for c in names if c in found), None)) is not None:
                return Source(var, Path(os.path.abspath(path)), found[var])
        return None
    return None


def demo_env_root(env: Path) -> Path | None:
    """The demo root a `.env` written by pool-demo points at (its first line is pool-demo's mark); None for
    any other file."""
    try:
        text = env.read_text(errors="replace")
    except OSError:
        return None
    if not text.startswith(DEMO_ENV_MARK):
        return None
    root = dotenv_values(env).get("POOL_ROOT")
    return Path(root) if root else None


def url_from_file(settings: Settings) -> tuple[Settings, str | None]:
    """The settings with the Redis URL that POOL_REDIS_URL_FILE holds now, where no REDIS_URL is given (flag,
    environment or .env), and why there is none to use yet (no file, or not a Redis URL)."""
    f = settings.redis_url_file
    if f is None or "redis_url" in settings.model_fields_set:
        return settings, None
    try:
        url = check_redis_url(f.read_text().strip())
    except OSError:
        return settings, f"no Redis address in {f} yet (the Redis job writes it)"
    except ValueError as e:
        return settings, f"{f}: {e}"
    return settings.model_copy(update={"redis_url": url}), None


def default_root() -> Path:
    """One rule for every command and script: the current folder when it holds items/ (run_remote.sh is
    run from inside the package root), else ./pool."""
    return Path(".") if Path("items").is_dir() else Path("pool")


def default_results(root: Path) -> Path:
    """Where a root's rows go unless a results folder is named: the run package's layout."""
    return root / "results" / "pool"


def redis_data(root: Path, results: Path) -> Path:
    """An embedded Redis's folder (pool-demo, `pool-launch --sim`): one per results root, so a fresh results
    root starts with an empty queue instead of one mixed with an older run's."""
    return root / "redis-data" / results.name


def env_file() -> str | None:
    """The env file every command reads: `.env` here, or POOL_ENV_FILE ("" for none)."""
    return os.environ.get("POOL_ENV_FILE", ".env") or None


# POOL_ variables that are not settings: read by the deployment (compose, the Slurm job, the images), by
# `load_settings` itself, or by the test suite and its tools (docs/testing.md)
OTHER_VARIABLES = frozenset({
    "POOL_DIR", "POOL_IMAGE", "POOL_SIM", "POOL_KEEP_RUNNING",  # docker-compose.yml, deploy/
    "POOL_ENV_FILE",
    "POOL_VLLM_PYTHON", "POOL_RECORD", "POOL_REQUIRE_DOCKER",  # the test suite
})  # fmt: skip
_warned: set[tuple[str, str]] = set()  # (name, where) said already


def check_env(path: str | None) -> None:
    """Refuse an env file line that is not NAME=VALUE (python-dotenv would skip it with a warning that names
    no file, and the setting it meant to give would silently be its default), and warn once per process of
    each POOL_ variable, in that file or the environment, that no setting reads: a misspelt name
    (POOL_RUUT) is otherwise ignored without a word."""
    given = [(name, "in the environment") for name in os.environ]
    if path and os.path.isfile(path):
        shown = os.path.abspath(path)
        with open(path, encoding="utf-8", errors="replace") as f:
            for b in parse_stream(f):
                if b.error:  # named by its number only: any of its words may be a secret
                    raise SetupError(f"{shown}, line {b.original.line} is not NAME=VALUE: fix or delete that line")
                if b.key is not None:
                    given.append((b.key, f"in {shown}"))
    known = {name for field in Settings.model_fields for name in env_names(field)} | OTHER_VARIABLES
    for name, where in given:
        if not name.startswith("POOL_") or name in known or (name, where) in _warned:
            continue
        _warned.add((name, where))
        near = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.75)
        hint = f" (did you mean {near[0]}?)" if near else ""
        print(f"warning: {name} {where} is read by no pool-* command{hint}", file=sys.stderr)


def load_settings(**overrides: Any) -> Settings:
    """Settings from env/.env with command-line overrides; flags left unset (None) do not override.
    POOL_ENV_FILE names another env file ("" reads none: the test suite, so a demo's .env cannot leak in).

    One root, one store: a results folder follows its root unless it is given at least as explicitly
    (a flag over the environment over the `.env` file), so `--root B` never screens against the store
    that a `.env` left for root A."""
    given = {k: v for k, v in overrides.items() if v is not None}
    check_env(env_file())
    settings = Settings(_env_file=env_file(), **given)  # type: ignore[call-arg]
    if settings.results is not None and _explicitness("results", given) < _explicitness("root", given):
        settings = settings.model_copy(update={"results": None})
    settings._flags = given
    return settings


def _explicitness(name: str, flags: dict[str, Any]) -> int:
    """3 for a flag, 2 for the environment, 1 for the `.env` file or the default."""
    return 3 if name in flags else 2 if f"POOL_{name.upper()}" in os.environ else 1
