"""The reference studies' reports (results/reference*/REPORT.md) are
the tool's own output on the committed rows: regenerating each with the command its record names
gives the committed file, so every number in it comes from the rows (each record's README)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from benchmark.leaderboard.command import main
from benchmark.leaderboard.quote import quoted, verdicts_table

ROOT = Path(__file__).resolve().parents[1]
# Each record, its claims file and the board's other flags its REPORT.md and README name, from the
# repository's root.
RECORDS = {
    "reference": ("search_spaces/claims/reference.yaml", ["--predict", "113M"]),
    "reference-2": ("search_spaces/claims/reference-2.yaml", ["--predict", "113M"]),
    "reference-3": ("search_spaces/claims/reference-3.yaml", []),
}


def command(record: str) -> list[str]:
    claims, flags = RECORDS[record]
    return [f"results/{record}", "--claims", claims, *flags, "--format", "md"]


@pytest.mark.parametrize("record", RECORDS)
def test_the_committed_report_is_what_the_committed_rows_give(record, capsys, monkeypatch):
    report = ROOT / "results" / record / "REPORT.md"
    how = f"shapebench board {' '.join(command(record))} > results/{record}/REPORT.md"
    if not report.exists():
        pytest.fail(f"results/{record}/REPORT.md is missing: {how}")
    monkeypatch.chdir(ROOT)
    capsys.readouterr()
    assert main(command(record)) == 0
    assert capsys.readouterr().out == report.read_text(), (
        f"results/{record}/REPORT.md is stale: {how}"
    )


@pytest.mark.parametrize("record", RECORDS)
def test_the_record_names_the_command(record):
    readme = (ROOT / "results" / record / "README.md").read_text()
    assert "shapebench board " + " ".join(command(record)) in readme


BLOCK = re.compile(r"<!-- verdicts: (\S+) -->\n")


@pytest.mark.parametrize("readme", ["README.md", "results/reference/README.md"])
def test_the_readmes_quote_the_reports_verdicts(readme):
    """Each README's verdicts are a report's, written by benchmark.leaderboard.quote: no figure in
    them is copied by hand."""
    text = (ROOT / readme).read_text()
    reports = BLOCK.findall(text)
    assert reports and "<!-- /verdicts -->" in text, (
        f"{readme} quotes a reference study's verdicts between <!-- verdicts: REPORT --> and "
        "<!-- /verdicts -->"
    )
    for name in reports:
        report = (ROOT / name).read_text()
        assert text == quoted(text, report), (
            f"{readme}'s verdict table differs from {name}'s: "
            f"python -m benchmark.leaderboard.quote {name} {readme}"
        )
        assert "| Verdict | Size | Arms |" in verdicts_table(report)


def test_the_comparison_with_the_second_study_lists_every_first_study_row(
    capsys, monkeypatch, tmp_path
):
    """Every row of the first study's verdicts appears, with its cells, in the comparison with the
    second study's claims (reference-2.yaml, read here on its pilot record, whose rows no claim's
    study holds): its reworded hourglass claims matched by their pairs and source, its float32
    claims not run again."""
    from benchmark.leaderboard.claims import compare

    monkeypatch.chdir(ROOT)
    capsys.readouterr()
    pilot = ["results/reference-2-pilot", "--claims", "search_spaces/claims/reference-2.yaml"]
    assert main([*pilot, "--format", "md"]) == 0
    (tmp_path / "REPORT.md").write_text(capsys.readouterr().out)
    first = compare.read(ROOT / "results" / "reference" / "REPORT.md")
    table = compare.table(first, compare.read(tmp_path / "REPORT.md"))
    rows = [dict(zip((c.header for c in table.columns), row)) for row in table.rows()]
    assert len(first.rows) == 19 == len(rows)
    assert [(r.claim, r.pair, r.difference, r.p, r.verdict) for r in first.rows] == [
        (
            row["Claim"].split(" → ")[0],
            row["Better − worse (metric)"],
            row["First: difference [95% CI]"],
            row["First: p (Holm)"],
            row["First: verdict"],
        )
        for row in rows
    ]
    changed = {row["Claim"]: row["What changed"] for row in rows}
    assert {c for c, what in changed.items() if what == "not run in the second study"} == {
        "HC with n = 4 beats n = 1 (trained in float32)",
        "HC with n = 4 beats the plain residual (trained in float32)",
    }
    assert [c for c in changed if " → " in c] == [
        "An hourglass FFN (K = 4, d_h/d_model 0.405) beats the conventional FFN at a matched "
        "non-embedding budget → An hourglass FFN (K = 4) beats the conventional FFN at fixed "
        "attention and a matched non-embedding budget",
        "An hourglass FFN (K = 2 at L = 12) beats the conventional FFN at a matched non-embedding "
        "budget → An hourglass FFN (K = 2 at L = 12) beats the conventional FFN at fixed attention "
        "and a matched non-embedding budget",
    ]
    assert set(changed.values()) == {"no data in the second study", "not run in the second study"}


# Each later record's README compares its pass with those before it: every record's REPORT.md up
# to its own, in RECORDS' order.
COMPARED = {
    record: [f"results/{r}/REPORT.md" for r in list(RECORDS)[: i + 1]]
    for i, record in enumerate(RECORDS)
    if i
}


@pytest.mark.parametrize("record", COMPARED)
def test_the_records_quote_the_comparison_with_the_passes_before(record, tmp_path, monkeypatch):
    """A record's table of its pass against those before is the one
    benchmark.leaderboard.claims.compare writes from the committed reports."""
    from benchmark.leaderboard.claims import compare

    readme = ROOT / "results" / record / "README.md"
    copy = tmp_path / "README.md"
    copy.write_text(readme.read_text())
    monkeypatch.chdir(ROOT)
    reports = COMPARED[record]
    assert compare.main([*reports, "--readme", str(copy)]) == 0
    assert copy.read_text() == readme.read_text(), (
        f"results/{record}/README.md's comparison is stale: python -m "
        f"benchmark.leaderboard.claims.compare {' '.join(reports)} --readme {readme.relative_to(ROOT)}"
    )


def test_a_third_report_adds_its_columns_and_what_it_changed_against_the_one_before():
    """The committed first and second reference reports, and the first again as a third: the third
    columns are the first's cells, and what the third changed reads the second's change backwards
    (a pair the second study did not run is compared with the first study, where it is)."""
    from benchmark.leaderboard.claims import compare

    first, second = (compare.read(ROOT / path) for path in COMPARED["reference-2"])
    two = _cells(compare.table(first, second))
    three = _cells(compare.table(first, second, first))
    assert (
        len(three) == len(two) and "Third: verdict" in three[0] and "What changed" not in three[0]
    )
    for a, b in zip(two, three):
        assert b["Second: what changed"] == a["What changed"]
        assert [b[f"Third: {k}"] for k in ("difference [95% CI]", "p (Holm)", "verdict")] == [
            b[f"First: {k}"] for k in ("difference [95% CI]", "p (Holm)", "verdict")
        ]
    twice = next(
        r for r in three if r["Better − worse (metric)"] == "hyperloop − transformer (val_loss)"
    )
    assert twice["Second: what changed"] == "gained (not decided → contradicted)"
    assert twice["Third: what changed"] == "lost (contradicted → not decided)"
    int4 = next(r for r in three if "int4" in r["Better − worse (metric)"])
    assert int4["Third: what changed"] == "sign flipped (reproduced → contradicted)"
    # the first study's float32 HC pairs, not run in the second: the third is compared with the first
    fp32 = [r for r in three if "float32" in r["Claim"]]
    assert fp32 and all(r["Second: what changed"] == "not run in the second study" for r in fp32)
    assert all(r["Third: what changed"].startswith("unchanged") for r in fp32)
    assert compare.table(first, second, first).title == (
        f"Verdicts: {first.path} → {second.path} → {first.path}"
    )


def _cells(table) -> list[dict[str, str]]:
    return [dict(zip((c.header for c in table.columns), row)) for row in table.rows()]


CLAIM_TWICE = (
    "Hyperloop beats a Transformer of the same unrolled depth with about twice its parameters"
)


def test_the_passes_plot_draws_each_pair_in_every_pass_that_has_its_difference(tmp_path, capsys):
    """`compare --plot`: each pair's difference and interval as each pass's report prints it, in
    the colour of that pass's verdict; a pass without the pair's rows draws nothing for it."""
    from benchmark.leaderboard.claims import compare

    paths = [ROOT / f"results/{r}/REPORT.md" for r in ("reference", "reference-2", "reference-3")]
    reports = [compare.read(p) for p in paths]
    rows = {
        (claim, pair): (metric, points) for claim, pair, metric, points in compare.drawn(reports)
    }
    assert rows[CLAIM_TWICE, "hyperloop − transformer"][0] == "val_loss"
    twice = rows[CLAIM_TWICE, "hyperloop − transformer"][1]
    # the reports' cells: −0.0975 [−0.1450, −0.0500]; 0.0867 [0.0657, 0.1077]; −0.0083 [...]
    assert twice == [
        ((-0.0975, -0.1450, -0.0500), "not decided"),
        ((0.0867, 0.0657, 0.1077), "contradicted"),
        ((-0.0083, -0.0285, 0.0119), "not decided"),
    ]
    fp32 = rows["HC with n = 4 beats n = 1 (trained in float32)", "hc4 − hc1"][1]
    assert fp32[0] is not None and fp32[1:] == [None, None]  # the first study's alone
    metric, int4 = rows[
        "INT4 GPTQ (group 128) costs Looped more perplexity than Hyperloop", "hyperloop − looped"
    ]
    assert metric == "int4_ppl_increase" and [p[1] for p in int4[:2]] == [
        "contradicted",
        "reproduced",
    ]

    figure = compare.plot(*reports).draw()
    markers = [line for ax in figure.axes for line in ax.lines if line.get_marker() != "None"]
    assert len(markers) == sum(p is not None for _, points in rows.values() for p in points)
    assert len(figure.axes) == len({metric for metric, points in rows.values() if any(points)})

    out = tmp_path / "passes.svg"
    assert compare.main([*map(str, paths), "--plot", str(out)]) == 0
    svg = out.read_text()
    assert "third pass" in svg and "depth with about… (hyperloop − transformer)" in svg
    assert compare.main([*map(str, paths), "--plot", str(tmp_path / "passes.pdf")]) == 2
    assert capsys.readouterr().err.endswith(
        f"--plot {tmp_path / 'passes.pdf'}: a .png or .svg file\n"
    )
