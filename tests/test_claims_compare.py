"""Two studies' verdicts compared claim by claim (benchmark.leaderboard.claims.compare): two board
reports built from synthetic rows whose differences are known give every "what changed" label; a
reworded claim is matched by its pairs and source, an ambiguous one is not; the table goes into a
README between its markers; a file that is not a board report in Markdown is refused in one line."""

from __future__ import annotations

import contextlib
import io
import json
import re
from pathlib import Path

import pandas as pd
import pytest
from synthetic_studies import seed_rows

from benchmark.leaderboard import command as board
from benchmark.leaderboard.claims import compare

# Per-seed noise of each family (4 seeds): hyperloop - looped at one offset is offset + (0.005,
# 0.004, -0.008, -0.006), mean offset - 0.00125 with s.e. 0.0033: a 0.2-nat gap is decided at
# p < 1e-4 (paired t, 3 df) after Holm over every pair, no gap is not (p 0.73).
NOISE = {
    "hyperloop": (0.0, 0.012, -0.008, 0.005),
    "lora-looped": (0.006, -0.004, 0.01, -0.009),
    "looped": (-0.005, 0.008, 0.0, 0.011),
}
# Each study's offset per family above a loss of 5.9 nats (lower is better).
STUDIES = {
    "strong": {"hyperloop": 0.0, "lora-looped": 0.1, "looped": 0.2},
    "reversed": {"hyperloop": 0.2, "lora-looped": 0.1, "looped": 0.0},
    "tie": {"hyperloop": 0.0, "lora-looped": 0.0, "looped": 0.0},
    "mixed": {"hyperloop": 0.0, "lora-looped": 0.1, "looped": 0.1},
}


def study_rows(study: str) -> pd.DataFrame:
    return seed_rows(
        study,
        {
            family: [5.9 + offset + n for n in NOISE[family]]
            for family, offset in STUDIES[study].items()
        },
        loops=2,
    )


def claim(text: str, study: str, where: str, chain: bool = False) -> str:
    order = "[hyperloop, lora-looped, looped]" if chain else "[hyperloop, looped]"
    lora = "\n      lora-looped: {family: lora-looped}" if chain else ""
    return f"""
  - claim: {text}
    source: {{paper: A paper, where: "{where}"}}
    study: {study}
    metric: val_loss
    order: {order}
    groups:
      hyperloop: {{family: hyperloop}}{lora}
      looped: {{family: looped}}
"""


# (claim, source's where, the first study's, the second's; None: not in that claims file)
CLAIMS = [
    ("Survives", "§1", "strong", "strong"),
    ("Lost", "§2", "strong", "tie"),
    ("Gained", "§3", "tie", "strong"),
    ("Flips", "§4", "strong", "reversed"),
    ("Undecided", "§5", "tie", "tie"),
    ("Contradicted", "§6", "reversed", "reversed"),
    ("Waits for its rows", "§7", "strong", "later"),  # no study `later`: no data
    ("Was not run before", "§8", "later", "strong"),
    ("Dropped", "§9", "strong", None),
    ("Added", "§10", None, "strong"),
]
WORDED = ("Reworded, the old words", "Reworded, the new words", "§11")  # first, second, where
CHAIN = "Hyperloop beats LoRA-looped, which beats Looped"  # strong, then mixed
HL = "hyperloop − looped (val_loss)"
EXPECTED = [  # (claim cell, pair, what changed), in the table's order
    ("Survives", HL, "survived"),
    ("Lost", HL, "lost (reproduced → not decided)"),
    ("Gained", HL, "gained (not decided → reproduced)"),
    ("Flips", HL, "sign flipped (reproduced → contradicted)"),
    ("Undecided", HL, "unchanged: not decided"),
    ("Contradicted", HL, "unchanged: contradicted"),
    ("Waits for its rows", HL, "no data in the second study"),
    ("Was not run before", HL, "no data in the first study"),
    ("Dropped", HL, "not run in the second study"),
    ("Reworded, the old words → Reworded, the new words", HL, "survived"),
    (CHAIN, "hyperloop − lora-looped (val_loss)", "survived"),
    (CHAIN, "lora-looped − looped (val_loss)", "lost (reproduced → not decided)"),
    ("Added", HL, "new in the second study"),
]


@pytest.fixture(scope="module")
def reports(tmp_path_factory) -> tuple[Path, Path]:
    """The first and the second study's reports, as `shapebench board --format md` prints them
    (the board run twice: the tests that read them are marked slow)."""
    root = tmp_path_factory.mktemp("compare")
    for study in STUDIES:
        folder = root / "results" / study / "trials"
        folder.mkdir(parents=True)
        study_rows(study).to_parquet(folder / "rows.parquet", index=False)
    paths = []
    for side, name in enumerate(("first", "second")):
        listed = [(text, where, pick[side]) for text, where, *pick in CLAIMS]
        text = "claims:" + "".join(claim(c, s, w) for c, w, s in listed if s is not None)
        text += claim(WORDED[side], "strong", WORDED[2])
        text += claim(CHAIN, ("strong", "mixed")[side], "§12", chain=True)
        (root / f"{name}.yaml").write_text(text)
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            args = [str(root / "results"), "--claims", str(root / f"{name}.yaml"), "--format", "md"]
            assert board.main(args) == 0
        paths.append(root / f"{name}.md")
        paths[-1].write_text(printed.getvalue())
    return paths[0], paths[1]


def cells(table) -> list[dict[str, str]]:
    return [dict(zip((c.header for c in table.columns), row)) for row in table.rows()]


@pytest.mark.slow
def test_every_change_is_named_pair_by_pair(reports):
    first, second = map(compare.read, reports)
    rows = cells(compare.table(first, second))
    assert [(r["Claim"], r["Better − worse (metric)"], r["What changed"]) for r in rows] == EXPECTED
    # each study's cells are its report's own, the difference with its interval and method
    survives = rows[0]
    assert survives["First: verdict"] == survives["Second: verdict"] == "reproduced"
    estimate, lo, hi = re.findall(r"−?\d\.\d+", survives["First: difference [95% CI]"])
    assert float(estimate.replace("−", "-")) == pytest.approx(-0.20125, abs=1e-4)
    assert survives["First: difference [95% CI]"].endswith("(paired)")
    assert float(survives["First: p (Holm)"].lstrip("< ")) < 0.05
    assert rows[1]["Second: verdict"] == "not decided" and float(rows[1]["Second: p (Holm)"]) > 0.05
    assert rows[6]["Second: verdict"].startswith("no data: no study later here")
    dropped, added = rows[8], rows[-1]
    assert [dropped[k] for k in ("Second: difference [95% CI]", "Second: verdict")] == ["—", "—"]
    assert [added[k] for k in ("First: p (Holm)", "First: verdict")] == ["—", "—"]
    assert (first.claims_file, second.claims_file, first.adjustment) == (
        "first.yaml",
        "second.yaml",
        "Holm",
    )


def test_a_reworded_claim_matches_only_where_one_candidate_is_left():
    def report(*claims: tuple[str, str]) -> compare.Report:
        rows = tuple(
            compare.Row(
                claim=text,
                source=source,
                study="s",
                pair="a − b (val_loss)",
                difference="−0.1000 [−0.2000, −0.0100] (paired)",
                p="0.010",
                verdict="reproduced",
            )
            for text, source in claims
        )
        return compare.Report(path="r.md", claims_file="c.yaml", adjustment="Holm", rows=rows)

    def changes(first, second):
        return [(a and a.text, b and b.text) for a, b in compare.matched(first, second)]

    old, new, twin = ("A beats B", "P, §1"), ("A beats B, reworded", "P, §1"), ("A tops B", "P, §1")
    assert changes(report(old), report(new)) == [("A beats B", "A beats B, reworded")]
    # another source is another claim
    assert changes(report(old), report(("A beats B, reworded", "P, §2"))) == [
        ("A beats B", None),
        (None, "A beats B, reworded"),
    ]
    # two left over with the same pairs and source: which is which is not known, so neither matches
    assert changes(report(old, twin), report(new)) == [
        ("A beats B", None),
        ("A tops B", None),
        (None, "A beats B, reworded"),
    ]


@pytest.mark.slow
def test_the_command_prints_the_table_and_writes_it_between_a_readmes_markers(
    reports, tmp_path, capsys
):
    first, second = map(str, reports)
    assert compare.main([first, second]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("| Claim | Better − worse (metric) | First: difference [95% CI] |")
    assert "| Flips | hyperloop − looped (val_loss) |" in printed
    assert f"_first study: {first} (first.yaml); second study: {second} (second.yaml);" in printed

    readme = tmp_path / "README.md"
    other = f"<!-- comparison: {first} vs elsewhere.md -->\nkept\n<!-- /comparison -->\n"
    quoted = "<!-- verdicts: x.md -->\nkept too\n<!-- /verdicts -->\n"
    readme.write_text(
        f"# A record\n\n<!-- comparison: {first} vs {second} -->\nold\n<!-- /comparison -->\n\n"
        + other
        + quoted
    )
    assert compare.main([first, second, "--readme", str(readme)]) == 0
    assert capsys.readouterr().out == ""  # written, not printed
    assert readme.read_text() == (
        f"# A record\n\n<!-- comparison: {first} vs {second} -->\n{printed}<!-- /comparison -->\n\n"
        + other
        + quoted
    )
    # a README without the block of these two reports: one line, and no file is written
    bare = tmp_path / "BARE.md"
    bare.write_text(other)
    assert compare.main([first, second, "--readme", str(readme), "--readme", str(bare)]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"{compare.PROG}: {bare}: no block between <!-- comparison: {first} vs {second} --> "
        "and <!-- /comparison -->\n"
    )
    assert bare.read_text() == other


@pytest.mark.slow
def test_a_file_that_is_not_a_board_report_in_markdown_is_refused_in_one_line(
    reports, tmp_path, capsys
):
    first = str(reports[0])
    as_json = tmp_path / "claims.json"
    as_json.write_text(json.dumps({"file": "first.yaml", "claims": []}))
    brief = tmp_path / "brief.md"  # the verdicts alone, as a README quotes them: no claims table
    text = reports[0].read_text()
    brief.write_text(text[: text.index("## Claims (")])
    for path, reason in [
        (as_json, "no `## Verdicts (...)` table"),
        (brief, "no `## Claims (...)` table"),
    ]:
        assert compare.main([first, str(path)]) == 2
        err = capsys.readouterr().err
        assert err == (
            f"{compare.PROG}: {path}: not a board report in Markdown ({reason}; write one with "
            "shapebench board RESULTS --claims FILE --format md)\n"
        )
    assert compare.main([first, str(tmp_path / "nope.md")]) == 2
    assert capsys.readouterr().err.count("\n") == 1
