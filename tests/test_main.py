"""`shapebench`: one command, one --help tree, each subcommand the entry point it stands for (the
same flags, the same output), and the older entry points still working."""

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from synthetic_studies import synthetic_trials, write_study

from benchmark import cli
from benchmark.leaderboard import command
from benchmark.main import COMMANDS, main
from benchmark.perf import timing

ROOT = Path(__file__).resolve().parent.parent
QUICKSTART = str(ROOT / "search_spaces" / "quickstart.yaml")


def _help(capsys, *argv) -> str:
    with pytest.raises(SystemExit) as stop:
        main([*argv, "--help"])
    assert stop.value.code == 0
    return capsys.readouterr().out


def test_the_console_script_is_declared():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["shapebench"] == "benchmark.main:main"


def test_help_lists_every_command(capsys):
    text = _help(capsys)
    assert text.startswith("usage: shapebench [-h] COMMAND ...")
    assert list(COMMANDS) == ["plan", "search", "board", "perf", "tasks", "lmeval"]
    for name, command in COMMANDS.items():
        assert f"    {name} " in text and command.summary.split()[0] in text


@pytest.mark.parametrize(("name", "flags", "absent"), [
    ("plan", ["--budget", "--json", "--set", "--precision {auto,bf16,fp32}"], ["--resume", "--results", "--spec"]),
    ("search", ["--budget", "--resume", "--results", "--spec", "--sampler"], ["--json", "--plan "]),
    ("board", ["--objectives", "--claims", "--predict", "--export", "(default: 0.5%)"], []),
    ("perf", ["{models,scale}", "--precisions", "default, bf16, fp32"], []),
    ("tasks", ["out_dir", "--source", "--max-words"], []),
])
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
    assert "invalid choice: 'train' (choose from 'plan', 'search', 'board', 'perf', 'tasks', 'lmeval')" in \
        capsys.readouterr().err


def test_a_flag_error_is_said_under_the_command_name(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["search", "--trials", "0"])
    assert stop.value.code == 2
    assert "shapebench search: error: argument --trials: expected a positive integer, got '0'" in \
        capsys.readouterr().err


def test_plan_is_run_search_py_plan(capsys, monkeypatch):
    monkeypatch.setattr(timing, "machine_flops", lambda: 5e10)  # no probe of this machine
    assert main(["plan", QUICKSTART, "--json"]) == 0
    ours = capsys.readouterr()
    assert cli.main([QUICKSTART, "--plan", "--json"]) == 0
    theirs = capsys.readouterr()
    assert ours.out == theirs.out and "median |Δ budget|" in ours.err  # (the err says how long planning took)
    rows = [json.loads(line) for line in ours.out.splitlines()]
    assert [r["family"] for r in rows] == ["transformer", "looped", "hyperloop"]
    assert main(["plan", QUICKSTART, "--resume"]) == 2  # the search's flags are refused, as with --plan
    assert "--resume applies only to a search" in capsys.readouterr().err


def test_board_is_leaderboard_py(capsys, tmp_path):
    write_study(tmp_path, synthetic_trials("cmd", shapes=2, seeds=2))
    assert main(["board", str(tmp_path), "--format", "md", "--top", "2"]) == 0
    ours = capsys.readouterr().out
    assert command.main([str(tmp_path), "--format", "md", "--top", "2"]) == 0
    assert ours == capsys.readouterr().out and "| # |" in ours


@pytest.mark.parametrize("entry", [
    ["run_search.py", "--help"], ["leaderboard.py", "--help"],
    ["-m", "benchmark.perf", "--help"], ["-m", "benchmark.tasks", "--help"], ["-m", "benchmark.main", "--help"],
])
def test_the_older_entry_points_still_work(entry):
    args = [str(ROOT / entry[0]), *entry[1:]] if entry[0].endswith(".py") else entry
    run = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    prog = {"run_search.py": "run_search.py", "leaderboard.py": "leaderboard.py"}.get(
        entry[0], "shapebench" if entry[-2] == "benchmark.main" else f"python -m {entry[1]}")
    assert run.stdout.startswith(f"usage: {prog} ")
