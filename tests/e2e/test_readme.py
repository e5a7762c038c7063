"""The README's claims about the commands, checked against the commands themselves."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()
BIN = Path(sys.executable).parent
SHARED = ("--root", "--results", "--redis-url", "--protocol-file")
OWN_FLAGS = {"pool-synth", "pool-sim", "pool-demo", "pool-upload"}  # the README names these as exceptions


def command_rows() -> dict[str, str]:
    """Command -> its row's first cell, from the table under "## Commands"."""
    section = README.split("## Commands", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `pool-")]
    return {re.match(r"\| `(pool-[a-z]+)", r).group(1): r.split(" | ")[0] for r in rows}  # type: ignore[union-attr]


def fenced_lines(after: str) -> list[str]:
    """The lines of the first ```bash block after the text `after`."""
    block = README.split(after, 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    return [line.split("#", 1)[0].strip() for line in block.splitlines() if line.split("#", 1)[0].strip()]


def test_the_table_lists_every_console_script():
    scripts = set(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"])
    assert set(command_rows()) == scripts


@pytest.mark.parametrize("command", sorted(command_rows()))
def test_every_flag_in_the_table_is_in_the_commands_help(command):
    out = subprocess.run([str(BIN / command), "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "usage:" in out.stdout, out.stderr
    row = command_rows()[command]
    for flag in re.findall(r"--[a-z][a-z-]*", row):
        assert flag in out.stdout, f"{command}: the README names {flag}, its --help does not"
    if command not in OWN_FLAGS:
        for flag in SHARED:
            assert flag in out.stdout, f"{command} lacks {flag}, which the README says it takes"


def test_the_demo_follow_up_block_is_what_the_demo_test_runs():
    lines = fenced_lines("afterwards the bare commands find the demo:")
    assert lines == ["pool-status", "pool-report", "pool-export --out demo-export"]
