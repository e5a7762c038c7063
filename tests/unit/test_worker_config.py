"""A worker's configuration is made in one place, from the settings with pool-worker's flags over them."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from pool_queue.cli import settings as cli_settings
from workers.config import WorkerConfig
from workers.main import _parser, worker_config

SERVER = "http://127.0.0.1:8001"


def _config(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, *flags: str) -> WorkerConfig:
    for name, value in {
        "POOL_ROOT": str(tmp_path),
        "POOL_REDIS_URL": "redis://127.0.0.1:6390/0",
        "REDIS_PASSWORD": "hunter2",
        "POOL_WORKERS": "24",
        "POOL_METRICS_PORT": "9400",
        "POOL_LEASE_S": "40",
        "POOL_HEARTBEAT_S": "4",
        "POOL_WAIT_NOTE_S": "30",
    }.items():
        monkeypatch.setenv(name, value)
    args = _parser().parse_args(["--server", SERVER, *flags])
    return worker_config(args, cli_settings(args), SERVER, [2, 1], wait_redis_s=12.0)


def test_the_settings_make_the_configuration(monkeypatch, tmp_path):
    config = _config(monkeypatch, tmp_path)
    assert config.name.startswith("127.0.0.1-8001.")  # the server's host-port, the host, a random suffix
    assert (config.server, config.steps, config.max_inflight, config.burst) == (SERVER, (2, 1), 24, False)
    assert (config.metrics_port, config.note_s, config.wait_redis_s) == (9400, 30.0, 12.0)
    assert (config.timing.lease_s, config.timing.heartbeat_s) == (40, 4.0)
    assert config.frames_dir == tmp_path / "frames" / "pool_frames"
    assert "6390" in config.redis and "hunter2" not in config.redis  # what messages say: no password


def test_the_flags_go_over_the_settings(monkeypatch, tmp_path):
    config = _config(monkeypatch, tmp_path, "--inflight", "7", "--metrics-port", "0", "--name", "gpu0", "--burst")
    assert (config.max_inflight, config.metrics_port, config.burst) == (7, 0, True)
    assert config.name.startswith("gpu0.") and config.name != _config(monkeypatch, tmp_path, "--name", "gpu0").name


def test_the_configuration_is_one_value_that_does_not_change(monkeypatch, tmp_path):
    config = _config(monkeypatch, tmp_path)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.max_inflight = 1  # type: ignore[misc]
    assert dataclasses.replace(config, max_inflight=1).max_inflight == 1 and config.max_inflight == 24
