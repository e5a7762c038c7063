"""The settings reference in docs/deployment.md is made from `Settings.model_fields`: every field described,
the page current, a secret's default never written, each flag a command's own --help lists."""

from __future__ import annotations

import re
from importlib.metadata import entry_points
from pathlib import Path

import pytest
from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from pool_queue.settings import OTHER_VARIABLES, Settings, env_names
from pool_queue.settings_doc import BEGIN, END, block, flags, main, reference_markdown, undescribed

PAGE = Path(__file__).resolve().parents[2] / "docs" / "deployment.md"


class Toy(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="TOY_")

    token: SecretStr = Field(default=SecretStr("hunter2-default"), description="a secret with a default")
    size: int = Field(default=3, ge=1, le=9, description="a count | with a bar")
    bare: str = "x"


def test_every_setting_says_what_it_does():
    assert undescribed() == []
    assert undescribed(Toy) == ["bare"]


def test_the_deployment_page_shows_the_settings_as_the_code_has_them():
    page = PAGE.read_text(encoding="utf-8")
    start, end = block(page, PAGE)
    assert page[start:end] == reference_markdown(), "docs/deployment.md is stale: run `make docs`"
    assert len(page[start:end].splitlines()) == len(Settings.model_fields) + 2  # header, rule, one row a field


def test_a_secrets_default_is_never_written():
    table = reference_markdown(Toy)
    assert "hunter2" not in table
    assert "| `TOY_TOKEN` |  | never shown | secret |" in table
    assert "| `TOY_SIZE` |  | `3` | int ≥ 1, ≤ 9 | a count \\| with a bar |" in table  # a bar cannot split the row


def test_every_flag_named_is_one_its_command_takes(capsys: pytest.CaptureFixture[str]):
    commands = {e.name: e for e in entry_points(group="console_scripts") if e.name.startswith("pool-")}
    named = [f for name, info in Settings.model_fields.items() for f in flags(name, info) if " " in f]
    assert len(named) >= 6  # the command-specific flags were read, not found empty
    for flag in named:
        prog, option = flag.split()
        with pytest.raises(SystemExit) as e:
            commands[prog].load()(["--help"])
        assert e.value.code == 0
        assert option in capsys.readouterr().out, flag


def test_make_docs_rewrites_only_the_block(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    page = tmp_path / "page.md"
    page.write_text(f"# Title\n\nprose\n\n{BEGIN}\n| stale |\n{END}\n\nmore prose\n", encoding="utf-8")
    with pytest.raises(SystemExit) as e:
        main(["--check", str(page)])
    assert e.value.code == 1
    assert "not current; run `make docs`" in capsys.readouterr().err
    assert "| stale |" in page.read_text(encoding="utf-8")  # --check rewrites nothing
    main([str(page)])
    assert page.read_text(encoding="utf-8") == (
        f"# Title\n\nprose\n\n{BEGIN}\n{reference_markdown()}{END}\n\nmore prose\n"
    )
    main(["--check", str(page)])  # current now: exit 0, nothing said about it
    assert "not current" not in capsys.readouterr().err


def test_a_page_without_the_markers_is_one_line_and_left_as_it_was(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    page = tmp_path / "page.md"
    page.write_text("# Title\n", encoding="utf-8")
    with pytest.raises(SystemExit) as e:
        main([str(page)])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no settings reference to rewrite" in err
    assert page.read_text(encoding="utf-8") == "# Title\n"


def test_every_pool_variable_the_project_sets_or_reads_is_known_so_none_is_warned_of():
    """The deployment's files and the code's own reads of the environment use only names that a setting or
    OTHER_VARIABLES knows: `check_env` warns of any other POOL_ variable as a likely misspelling."""
    root = Path(__file__).resolve().parents[2]
    files = [root / "docker-compose.yml", root / "Makefile", root / ".ci" / "run", *(root / "deploy").rglob("*")]
    text = "".join(f.read_text(errors="replace") for f in files if f.is_file())
    for package in ("pool_queue", "workers", "tests"):
        for f in sorted((root / package).rglob("*.py")):
            text += " " + " ".join(re.findall(r"environ(?:\.get\(|\[)\"(POOL_\w+)", f.read_text()))
    used = set(re.findall(r"\bPOOL_[A-Z0-9_]*[A-Z0-9]\b", text))
    known = {n for field in Settings.model_fields for n in env_names(field)} | OTHER_VARIABLES
    assert len(used) > 10 and used <= known, sorted(used - known)
