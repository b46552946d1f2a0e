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
COMMAND = [
    "results/reference",
    "--claims",
    "search_spaces/claims/reference.yaml",
    "--predict",
    "113M",
    "--format",
    "md",
]


def test_the_committed_report_is_what_the_committed_rows_give(capsys, monkeypatch):
    if not (RECORD / "REPORT.md").exists():
        pytest.fail(
            "results/reference/REPORT.md is missing: shapebench board "
            + " ".join(COMMAND)
            + " > results/reference/REPORT.md"
        )
    monkeypatch.chdir(ROOT)
    capsys.readouterr()
    assert main(COMMAND) == 0
    assert capsys.readouterr().out == (RECORD / "REPORT.md").read_text(), (
        "results/reference/REPORT.md is stale: shapebench board "
        + " ".join(COMMAND)
        + " > results/reference/REPORT.md"
    )


def test_the_record_names_the_command():
    assert "shapebench board " + " ".join(COMMAND) in (RECORD / "README.md").read_text()


BEGIN, END = "<!-- verdicts: results/reference/REPORT.md -->", "<!-- /verdicts -->"


@pytest.mark.parametrize("readme", ["README.md", "results/reference/README.md"])
def test_the_readmes_quote_the_reports_verdicts(readme):
    """Each README's verdicts are the report's, written by benchmark.leaderboard.quote: no figure in
    them is copied by hand."""
    from benchmark.leaderboard.quote import quoted, verdicts_table

    text = (ROOT / readme).read_text()
    assert BEGIN in text and END in text, (
        f"{readme} quotes the reference verdicts between {BEGIN} and {END}"
    )
    report = (RECORD / "REPORT.md").read_text()
    assert text == quoted(text, report), (
        f"{readme}'s verdict table differs from results/reference/REPORT.md's: "
        f"python -m benchmark.leaderboard.quote results/reference/REPORT.md {readme}"
    )
    assert "| Verdict | Size | Arms |" in verdicts_table(report)
