"""The reference study's report (results/reference/REPORT.md) is the tool's own output on the
committed rows: regenerating it with the command its record names gives the committed file, so
every number in it comes from the rows (results/reference/README.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmark.leaderboard.command import main

ROOT = Path(__file__).resolve().parents[1]
RECORD = ROOT / "results" / "reference"
# The command REPORT.md and the record's README name, from the repository's root.
COMMAND = ["results/reference", "--claims", "search_spaces/claims/reference.yaml", "--predict", "113M",
           "--format", "md"]


def test_the_committed_report_is_what_the_committed_rows_give(capsys, monkeypatch):
    if not (RECORD / "REPORT.md").exists():
        pytest.fail("results/reference/REPORT.md is missing: python leaderboard.py " + " ".join(COMMAND)
                    + " > results/reference/REPORT.md")
    monkeypatch.chdir(ROOT)
    capsys.readouterr()
    assert main(COMMAND) == 0
    assert capsys.readouterr().out == (RECORD / "REPORT.md").read_text(), (
        "results/reference/REPORT.md is stale: python leaderboard.py " + " ".join(COMMAND)
        + " > results/reference/REPORT.md")


def test_the_record_names_the_command():
    assert "python leaderboard.py " + " ".join(COMMAND) in (RECORD / "README.md").read_text()


BEGIN, END = "<!-- verdicts: results/reference/REPORT.md -->", "<!-- /verdicts -->"


def _verdicts_table(report: str) -> str:
    """The table under the report's `## Verdicts` heading."""
    section = report.split("## Verdicts (reference.yaml)\n\n", 1)[1]
    return section.split("\n\n", 1)[0].strip()


def test_the_readme_quotes_the_reports_verdicts():
    readme = (ROOT / "README.md").read_text()
    assert BEGIN in readme and END in readme, f"README.md quotes the reference verdicts between {BEGIN} and {END}"
    quoted = readme.split(BEGIN, 1)[1].split(END, 1)[0].strip()
    table = _verdicts_table((RECORD / "REPORT.md").read_text())
    assert quoted == table, f"README.md's verdict table differs from results/reference/REPORT.md's; paste:\n{table}"
    assert "(results/reference/REPORT.md)" in readme
