"""The README's and docs/'s claims about the commands, checked against the commands themselves."""

from __future__ import annotations

import functools
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()
OPERATIONS = REPO / "docs" / "operations.md"  # holds the command table under "## Commands"
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
BIN = Path(sys.executable).parent
SCRIPTS = frozenset(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"])
SHARED = ("--root", "--results", "--redis-url", "--protocol-file")
OWN_FLAGS = {"pool-synth", "pool-sim", "pool-demo", "pool-upload"}  # the table's text names these as exceptions
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def command_rows() -> dict[str, str]:
    """Command -> its row's first cell, from the table under "## Commands" in docs/operations.md."""
    section = OPERATIONS.read_text().split("\n## Commands\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `pool-")]
    return {re.match(r"\| `(pool-[a-z]+)", r).group(1): r.split(" | ")[0] for r in rows}  # type: ignore[union-attr]


def fenced_lines(after: str) -> list[str]:
    """The lines of the first ```bash block after the text `after` in the README."""
    block = README.split(after, 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    return [line.split("#", 1)[0].strip() for line in block.splitlines() if line.split("#", 1)[0].strip()]


def bash_lines(page: Path) -> list[tuple[str, str]]:
    """(file:line, text) for every command of every ```bash block of a page, continuation lines joined."""
    found, text = [], page.read_text()
    for block in re.finditer(r"^ *```bash\n(.*?)^ *```", text, flags=re.M | re.S):
        first, pending = text.count("\n", 0, block.start(1)) + 1, ""
        for n, line in enumerate(block.group(1).splitlines()):
            start = first + n - pending.count("\n")
            if line.rstrip().endswith("\\"):
                pending += line.rstrip()[:-1] + "\n"
                continue
            joined, pending = (pending + line).replace("\n", " ").strip(), ""
            if joined:
                found.append((f"{page.relative_to(REPO)}:{start}", joined))
    return found


def invocations(line: str) -> list[tuple[str, list[str]]]:
    """(command, the words after it) for every pool-* word that starts a command of a shell line, after any
    VAR=value words, or that a wrapper runs (`docker compose run --rm tools pool-pack ...`)."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|")  # a comment ends the line, as in bash
    lexer.whitespace_split = True
    parts: list[list[str]] = [[]]
    for word in lexer:
        if set(word) <= set(";&|"):
            parts.append([])
        else:
            parts[-1].append(word)
    out = []
    for words in parts:
        while words and ASSIGNMENT.match(words[0]):
            words = words[1:]
        for i, word in enumerate(words):
            name = word.rsplit("/", 1)[-1]  # .venv/bin/pool-status as pool-status
            if name.startswith("pool-") and (i == 0 or name in SCRIPTS):
                out.append((name, words[i + 1 :]))
                break
    return out


@functools.cache
def help_flags(command: str) -> frozenset[str]:
    out = subprocess.run([str(BIN / command), "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "usage:" in out.stdout, out.stderr
    return frozenset(re.findall(r"(?<![\w-])(?:--[a-z][a-z0-9-]*|-[A-Za-z])\b", out.stdout))


def shell_lines() -> list[tuple[str, str]]:
    """Every bash line of the README and docs/ that runs a pool-* command."""
    return [(where, line) for page in PAGES for where, line in bash_lines(page) if invocations(line)]


def relative_links() -> list[tuple[Path, str]]:
    links = []
    for page in PAGES:
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # a link inside code is no link
        text = re.sub(r"`[^`\n]*`", "", text)
        for target in LINK.findall(text):
            if not re.match(r"[a-z][a-z0-9+.-]*:", target) and not target.startswith("#"):
                links.append((page, target))
            elif target.startswith("#"):
                links.append((page, page.name + target))
    return links


def anchors(page: Path) -> set[str]:
    """GitHub's heading ids: lower case, punctuation but - and _ dropped, spaces to hyphens."""
    heads = re.findall(r"^#+ (.+)$", re.sub(r"```.*?```", "", page.read_text(), flags=re.S), flags=re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in heads}


@pytest.mark.skipif(not (REPO / ".git").exists(), reason="not a git checkout")
@pytest.mark.parametrize("folder", ["demo-pool", "demo-export", "pool"])
def test_the_folders_the_readme_has_you_make_in_the_checkout_are_ignored_by_git(folder):
    assert folder in README  # `make demo`, `pool-export --out demo-export`, `pool-fetch --root pool`
    done = subprocess.run(["git", "check-ignore", "-q", f"{folder}/x"], cwd=REPO)
    assert done.returncode == 0, f"{folder}/ is not in .gitignore"


def test_the_table_lists_every_console_script():
    assert set(command_rows()) == SCRIPTS


@pytest.mark.parametrize("command", sorted(command_rows()))
@pytest.mark.slow
def test_every_flag_in_the_table_is_in_the_commands_help(command):
    shown = help_flags(command)
    for flag in re.findall(r"--[a-z][a-z-]*", command_rows()[command]):
        assert flag in shown, f"{command}: docs/operations.md names {flag}, its --help does not"
    if command not in OWN_FLAGS:
        for flag in SHARED:
            assert flag in shown, f"{command} lacks {flag}, which docs/operations.md says it takes"


def test_the_pages_show_commands_and_links_to_check():
    """The checks below have something to check: the README runs commands, and every page is linked."""
    assert any(where.startswith("README.md") for where, _ in shell_lines())
    linked = {(page.parent / target.split("#", 1)[0]).resolve() for page, target in relative_links()}
    assert {p.resolve() for p in PAGES if p.name != "README.md"} <= linked


@pytest.mark.parametrize(("where", "line"), shell_lines(), ids=[w for w, _ in shell_lines()])
@pytest.mark.slow
def test_every_pool_command_in_a_bash_block_names_only_flags_its_help_shows(where, line):
    for command, words in invocations(line):
        assert command in SCRIPTS, f"{where}: {command} is no console script of pyproject.toml"
        flags = {w.split("=", 1)[0] for w in words if re.match(r"--?[A-Za-z]", w)}
        unknown = flags - help_flags(command)
        assert not unknown, f"{where}: {command} --help shows no {sorted(unknown)}"


@pytest.mark.parametrize(
    ("page", "target"), relative_links(), ids=[f"{p.relative_to(REPO)}->{t}" for p, t in relative_links()]
)
def test_every_relative_link_points_at_a_file_that_exists(page, target):
    path, _, anchor = target.partition("#")
    file = page.parent / path
    assert file.is_file(), f"{page.relative_to(REPO)}: the link {target} points at no file"
    if anchor and file.suffix == ".md":
        assert anchor in anchors(file), f"{page.relative_to(REPO)}: {file.name} has no heading #{anchor}"


def test_the_demo_follow_up_block_is_what_the_demo_test_runs():
    lines = fenced_lines("afterwards the bare commands that read the results find the demo")
    assert lines == ["pool-status", "pool-report", "pool-export --out demo-export"]


def test_make_test_runs_what_needs_no_vllm_before_it_builds_the_vllm_environments(tmp_path):
    """Fast feedback first: ruff and every test that needs no vLLM run before the vLLM environments (~11 GiB)
    are built, each build says what it is and how big, and every test runs once (`-m 'not vllm'`, then `-m vllm`
    on each vLLM, then the RQ tests on the oldest RQ)."""
    venvs = {k: tmp_path / k for k in ("VLLM_VENV", "VLLM_OLDEST_VENV", "RQ_VENV")}  # unbuilt: their builds show
    out = subprocess.run(["make", "-n", "test", *(f"{k}={v}" for k, v in venvs.items())], cwd=REPO,
                         capture_output=True, text=True, timeout=60, check=True).stdout.splitlines()  # fmt: skip

    def first(text: str) -> int:
        return next(i for i, line in enumerate(out) if text in line)

    quick = first("pytest -q -m 'not vllm'")
    assert first("ruff check") < quick < first(f"{venvs['VLLM_VENV']}/bin/pip install")
    for k in venvs:
        build = first(f'echo "building {venvs[k]}:')
        assert quick < build < first(f"{venvs[k]}/bin/pip install") and "GiB" in out[build], out[build]
    tests = [line for line in out if "bin/pytest -q" in line]
    assert [t.split("pytest -q ")[-1] for t in tests] == [
        "-m 'not vllm' -n logical --dist loadgroup",  # spread over the cores; Docker's and Slurm's tests on one each
        "-m vllm",
        "-m vllm",
        "tests/unit/test_lease.py tests/e2e/test_recovery.py \\",
    ]
    busy = "tests/e2e/test_status_view.py::test_rq_shows_a_worker_busy_while_it_holds_jobs_and_idle_once_it_holds_none"
    after = [line.strip() for line in out[out.index(tests[-1]) + 1 :][:2]]
    assert after == [f"{busy} \\", "-n logical --dist loadgroup"]  # RQ's view of a worker, on the oldest RQ too
