"""`shapebench`: one command, one --help tree, each subcommand the entry point it stands for (the
same flags, the same output), the older scripts aliases of it, and no command shown under another
name in the docs or said by the code."""

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from synthetic_studies import synthetic_trials, write_study

from benchmark.leaderboard import command
from benchmark.main import COMMANDS, main
from benchmark.perf import probe
from benchmark.search import command as search_command
from benchmark.store.speeds import Speed

ROOT = Path(__file__).resolve().parent.parent
QUICKSTART = str(ROOT / "search_spaces" / "quickstart.yaml")


def _help(capsys, *argv) -> str:
    with pytest.raises(SystemExit) as stop:
        main([*argv, "--help"])
    assert stop.value.code == 0
    return capsys.readouterr().out


def test_the_console_script_is_declared():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"shapebench": "benchmark.main:main"}  # one command; the verbs are its own


def test_help_lists_every_command(capsys):
    text = _help(capsys)
    assert text.startswith("usage: shapebench [-h] COMMAND ...")
    assert list(COMMANDS) == ["plan", "search", "board", "replay", "perf", "tasks", "lmeval"]
    for name, verb in COMMANDS.items():
        assert f"    {name} " in text and verb.summary.split()[0] in text


@pytest.mark.parametrize(
    ("name", "flags", "absent"),
    [
        (
            "plan",
            ["--budget", "--json", "--set", "--precision {auto,bf16,fp32}"],
            ["--resume", "--results", "--spec"],
        ),
        (
            "search",
            ["--budget", "--resume", "--results", "--spec", "--sampler"],
            ["--json", "--plan "],
        ),
        ("board", ["--objectives", "--claims", "--predict", "--export", "(default: 0.5%)"], []),
        ("perf", ["{models,scale}", "--precisions", "default, bf16, fp32"], []),
        ("tasks", ["out_dir", "--source", "--max-words"], []),
        ("replay", ["row", "--data", "--tokenizer", "--json"], ["--budget"]),
    ],
)
def test_each_command_has_its_own_help(capsys, name, flags, absent):
    text = _help(capsys, name)
    assert text.startswith(f"usage: shapebench {name} [-h]")
    for flag in flags:
        assert flag in text, flag
    for flag in absent:
        assert flag not in text, flag


def test_lmeval_help_is_lm_evals_own(capsys):
    text = _help(capsys, "lmeval")
    assert "Language Model Evaluation Harness" in text and "run" in text


def test_an_unknown_command_names_the_commands(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["train"])
    assert stop.value.code == 2
    assert (
        "invalid choice: 'train' (choose from 'plan', 'search', 'board', 'replay', 'perf', 'tasks', 'lmeval')"
        in capsys.readouterr().err
    )


def test_a_flag_error_is_said_under_the_command_name(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["search", "--trials", "0"])
    assert stop.value.code == 2
    assert (
        "shapebench search: error: argument --trials: expected a positive integer, got '0'"
        in capsys.readouterr().err
    )


def test_plan_is_the_search_commands_plan(capsys, monkeypatch):
    monkeypatch.setattr(
        probe, "probe_speed", lambda spec, cfg: Speed(5e10, 6.0, 0)
    )  # no probe of this machine
    assert main(["plan", QUICKSTART, "--json"]) == 0
    ours = capsys.readouterr()
    assert search_command.plan_main([QUICKSTART, "--json"]) == 0
    theirs = capsys.readouterr()
    assert (
        ours.out == theirs.out and "median |Δ budget|" in ours.err
    )  # (the err says how long planning took)
    rows = [json.loads(line) for line in ours.out.splitlines()]
    assert [r["family"] for r in rows] == ["transformer", "looped", "hyperloop"]
    assert (
        main(["plan", QUICKSTART, "--resume"]) == 2
    )  # the search's flags are refused, as with --plan
    assert "--resume applies only to a search" in capsys.readouterr().err


def test_board_is_the_leaderboards_command(capsys, tmp_path):
    write_study(tmp_path, synthetic_trials("cmd", shapes=2, seeds=2))
    assert main(["board", str(tmp_path), "--format", "md", "--top", "2"]) == 0
    ours = capsys.readouterr().out
    assert command.main([str(tmp_path), "--format", "md", "--top", "2"]) == 0
    assert ours == capsys.readouterr().out and "| # |" in ours


@pytest.mark.parametrize(
    "entry",
    [
        ["run_search.py", "--help"],
        ["run_search.py", "--plan", "--help"],
        ["leaderboard.py", "--help"],
        ["-m", "benchmark.perf", "--help"],
        ["-m", "benchmark.tasks", "--help"],
        ["-m", "benchmark.main", "--help"],
    ],
)
def test_the_older_entry_points_still_work(entry):
    args = [str(ROOT / entry[0]), *entry[1:]] if entry[0].endswith(".py") else entry
    run = subprocess.run(
        [sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    prog = {
        "run_search.py": "shapebench search",
        "--plan": "shapebench plan",
        "leaderboard.py": "shapebench board",
        "benchmark.main": "shapebench",
        "benchmark.perf": "shapebench perf",
        "benchmark.tasks": "shapebench tasks",
    }[entry[-2]]
    assert run.stdout.startswith(f"usage: {prog} ")


# A command shown under an older name: the scripts, the module entry points, the removed console scripts.
OLDER = re.compile(
    r"run_search\.py|leaderboard\.py|python3? -m benchmark\.(perf|tasks|lmeval)\b|shapebench-(tasks|lmeval)"
)


def test_the_docs_show_every_command_as_shapebench_verb():
    pages = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
    lines = [
        (page.name, line)
        for page in pages
        for line in page.read_text(encoding="utf-8").splitlines()
    ]
    older = [
        f"{name}: {line}"
        for name, line in lines
        if OLDER.search(line.replace("tests/test_leaderboard.py", ""))
    ]
    assert [line for line in older if "alias" not in line.lower()] == []
    assert len(older) == 1  # the README's line that names the aliases
    assert sum("shapebench " in line for _, line in lines) > 50


def test_the_code_says_shapebench_verb_in_its_messages():
    """What the code prints (errors, summaries, resume lines, --help) names the command as a user
    types it; only the dispatcher's docstring mentions the aliases."""
    found = [
        f"{path.relative_to(ROOT)}: {line.strip()}"
        for path in sorted((ROOT / "benchmark").rglob("*.py"))
        if path.name != "main.py"
        for line in path.read_text(encoding="utf-8").splitlines()
        if re.search(r"run_search\.py|leaderboard\.py", line)
    ]
    assert found == []
