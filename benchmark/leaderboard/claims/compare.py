"""Two studies' verdicts on the same claims, pair by pair: what the second study changed.

    python -m benchmark.leaderboard.claims.compare FIRST_REPORT SECOND_REPORT
    python -m benchmark.leaderboard.claims.compare FIRST_REPORT SECOND_REPORT --readme README.md
    python -m benchmark.leaderboard.claims.compare FIRST SECOND THIRD --readme README.md --plot passes.svg

prints a Markdown table and its caption: one row per compared pair of a claim (better − worse, in
the claim's metric; a claim of order [a, b, c] has two) in either report, with each study's
difference [95% CI], adjusted p and verdict, and what changed. With `--readme FILE` the table goes
into FILE instead, between `<!-- comparison: FIRST_REPORT vs SECOND_REPORT -->` and
`<!-- /comparison -->` (the two reports named as on this command line), the way
benchmark.leaderboard.quote writes a report's verdicts into a README, never by hand. With
`--plot FILE` (.png or .svg) it also draws every pair's difference and 95% interval in each study,
one marker per study and coloured by that study's verdict, so how a verdict moved shows at a glance.

What is read: each study's board report in Markdown (`shapebench board ... --claims FILE --format
md`, a record's REPORT.md): the table under `## Verdicts (FILE)`, whose cells are copied as the
report prints them, and the one under `## Claims (FILE)` (the same rows in the same order), for
each row's source and study. Not claims.json: where a claim's study has no rows it holds no
groups, so a group's own metric (AbbIE's `val_loss_r2`), and with it the pair's name, is missing
there; the Markdown names every pair as its claims file does.

How claims match (a claim here: the rows of one claim checked in one study):
1. by their text, where it is the same in both reports (a claim checked in several studies: its
   k-th study in one report with its k-th in the other);
2. a claim left without a match in both reports matches one whose text changed when both have the
   same pairs (`better − worse (metric)`, in order) and the same source (paper and where), and no
   other claim left over in either report has both: the same test, reworded (the hourglass K = 4
   claim lost its "d_h/d_model 0.405"). Two candidates make no match. Its row shows both texts,
   first → second.
Within matched claims, rows pair by `better − worse (metric)`. A pair or claim that one report
lacks is a row of its own. A third report (a third pass of a study) adds its three columns and
what it changed against the second (against the first where the second lacks the claim), its
claims matched with the latest report that has each.

What changed, each verdict read as reproduced, contradicted, not decided (its 1-seed form too) or
no data:
    survived                       reproduced in both
    unchanged: V                   the same verdict V in both, otherwise
    lost (V → not decided)         decided (V) in the first study, not in the second
    gained (not decided → V)       decided in the second study only
    sign flipped (V → W)           reproduced in one study, contradicted in the other
    no data in the second study    the claim is in its claims file, its rows are not (yet) there
    no data in the first study     the other way round
    not run in the second study    the pair is not in the second study's claims file
    new in the second study        the pair is only in the second study's claims file
"""

from __future__ import annotations

import argparse
import itertools
import math
import re
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from benchmark.leaderboard.claims.check import CONTRADICTED, NO_DATA, REPRODUCED, UNDECIDED
from benchmark.leaderboard.formats import Column, Table, markdown
from benchmark.leaderboard.loading import LeaderboardError
from benchmark.leaderboard.quote import filled, table_under
from benchmark.leaderboard.tables import MISSING

PROG = "python -m benchmark.leaderboard.claims.compare"
TAG = "comparison"  # the README's block: <!-- comparison: A vs B --> ... <!-- /comparison -->
PAIR = "Better − worse (metric)"  # the verdicts table's header (claims/render.py: verdicts)
_P_HEAD = re.compile(r"p(?: \((.+)\))?")  # "p (Holm)"; a bare "p" is unadjusted
# What a verdict cell reads as: "not decided (1 seed)" is not decided, "no data: why" no data.
OUTCOMES = (REPRODUCED, CONTRADICTED, NO_DATA, UNDECIDED)
LOST, GAINED = "lost", "gained"
NOT_RUN, NEW = "not run in the second study", "new in the second study"


class ReportError(LeaderboardError):
    """A report that cannot be compared, or a README without its block: one line, exit 2."""


@dataclass(frozen=True, kw_only=True)
class Row:
    """One pair of one claim, as its report prints it."""

    claim: str
    source: str  # the paper, and where in it
    study: str
    pair: str  # "hyperloop − looped (val_loss)"
    difference: str  # "−0.1988 [−0.2663, −0.1314] (paired)"
    p: str  # adjusted over the report's pairs: "0.019"
    verdict: str  # "reproduced", "not decided (1 seed)", "no data: no study ... here"

    @property
    def outcome(self) -> str:
        return next(o for o in OUTCOMES if self.verdict.startswith(o))


@dataclass(frozen=True, kw_only=True)
class Report:
    path: str
    claims_file: str  # the name its headings give: "reference.yaml"
    adjustment: str  # how its p-values were adjusted: "Holm", "BH", "unadjusted"
    rows: tuple[Row, ...]


def read(path: str | Path) -> Report:
    """A board report's verdicts, each row with its source and study from its claims table."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ReportError(f"{path}: cannot be read ({getattr(err, 'strerror', None) or err})")
    try:
        head, verdicts = _table(text, "Verdicts", ("Claim", PAIR, "Difference [95% CI]", "Verdict"))
        p_head = next((h for h in head if _P_HEAD.fullmatch(h)), None)
        if p_head is None:
            raise ValueError("its Verdicts table has no column p")
        claims = _table(text, "Claims", ("Claim", "Source", "Study"))[1]
    except ValueError as err:
        raise ReportError(
            f"{path}: not a board report in Markdown ({err}; write one with shapebench board "
            "RESULTS --claims FILE --format md)"
        ) from None
    if [v["Claim"] for v in verdicts] != [c["Claim"] for c in claims]:
        raise ReportError(f"{path}: its Verdicts and Claims tables list different claims")
    rows = tuple(_row(v, c, p_head) for v, c in zip(verdicts, claims))
    if odd := next((r.verdict for r in rows if not r.verdict.startswith(OUTCOMES)), None):
        raise ReportError(f"{path}: unknown verdict {odd!r}")
    return Report(
        path=str(path),
        claims_file=re.search(r"^## Verdicts \(([^;]+)(?:; .*)?\)$", text, re.M).group(1),
        adjustment=_P_HEAD.fullmatch(p_head).group(1) or "unadjusted",
        rows=rows,
    )


def _table(text: str, title: str, needs: tuple[str, ...]) -> tuple[list[str], list[dict]]:
    """The header and rows (header -> cell) of the Markdown table under `## TITLE (...)`
    (formats.markdown escapes a cell's `|`); a ValueError where it is not there as a board writes it."""
    lines = [line.strip() for line in table_under(text, title)[0].splitlines()]
    cells = [
        [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line[1:-1])]
        for line in lines
        if line.startswith("|") and line.endswith("|")
    ]
    if len(cells) < 2 or any(len(row) != len(cells[0]) for row in cells):
        raise ValueError(f"its {title} table's rows are not its header's width")
    if lacks := [h for h in needs if h not in cells[0]]:
        raise ValueError(f"its {title} table has no column {', '.join(lacks)}")
    return cells[0], [dict(zip(cells[0], row)) for row in cells[2:]]  # [1]: the rule


def _row(verdict: dict[str, str], claim: dict[str, str], p_head: str) -> Row:
    return Row(
        claim=verdict["Claim"],
        source=claim["Source"],
        study=claim["Study"],
        pair=verdict[PAIR],
        difference=verdict["Difference [95% CI]"],
        p=verdict[p_head],
        verdict=verdict["Verdict"],
    )


@dataclass(frozen=True, kw_only=True)
class Checked:
    """One claim checked in one study: its rows, one per pair."""

    text: str
    source: str
    rows: tuple[Row, ...]

    @property
    def key(self) -> tuple:
        """What a reworded claim keeps: its pairs and its source."""
        return tuple(r.pair for r in self.rows), self.source


def checked(report: Report) -> list[Checked]:
    return [
        Checked(text=text, source=rows[0].source, rows=rows)
        for (text, _), group in itertools.groupby(report.rows, lambda r: (r.claim, r.study))
        for rows in [tuple(group)]
    ]


def matched(first: Report, second: Report) -> list[tuple[Checked | None, Checked | None]]:
    """The claims of both reports, matched (module docstring): the first report's in its order,
    then those only the second has."""
    return _pairing(checked(first), checked(second))


def chains(reports: list[Report]) -> list[list[Checked | None]]:
    """Each claim across every report (None where one lacks it): the first two matched, then each
    further report's claims matched with the latest claim of each chain."""
    out = [list(p) for p in matched(reports[0], reports[1])]
    for report in reports[2:]:
        latest = [next(c for c in reversed(chain) if c is not None) for chain in out]
        paired = _pairing(latest, checked(report))
        out = [
            [*out[latest.index(a)], b] if a is not None else [None] * len(out[0]) + [b]
            for a, b in paired
        ]
    return out


def _pairing(a: list[Checked], b: list[Checked]) -> list[tuple[Checked | None, Checked | None]]:
    pending: dict[str, list[int]] = {}
    for j, c in enumerate(b):
        pending.setdefault(c.text, []).append(j)
    match: dict[int, int] = {}
    for i, c in enumerate(a):
        if pending.get(c.text):
            match[i] = pending[c.text].pop(0)
    left_a = [i for i in range(len(a)) if i not in match]
    left_b = [j for j in range(len(b)) if j not in match.values()]
    count = Counter([a[i].key for i in left_a] + [b[j].key for j in left_b])
    by_key = {b[j].key: j for j in left_b}
    for i in left_a:
        if count[a[i].key] == 2 and a[i].key in by_key:  # one left on each side
            match[i] = by_key[a[i].key]
    taken = set(match.values())
    return [(c, b[match[i]] if i in match else None) for i, c in enumerate(a)] + [
        (None, c) for j, c in enumerate(b) if j not in taken
    ]


ORDINALS = ("first", "second", "third", "fourth")


def table(first: Report, second: Report, *later: Report) -> Table:
    """One row per pair of a claim in any report: each study's cells, and what changed (with a
    third report: what the second changed, and what the third changed against the one before)."""
    reports = [first, second, *later]
    names = ORDINALS[: len(reports)]
    heads = [
        "Claim",
        PAIR,
        *(
            f"{side.capitalize()}: {head}"
            for side, report in zip(names, reports)
            for head in ("difference [95% CI]", _p_head(report), "verdict")
        ),
        *(
            ["What changed"]
            if not later
            else [f"{n.capitalize()}: what changed" for n in names[1:]]
        ),
    ]
    rows = []
    for text, pair, cells in pairs(reports):
        changes = [
            change(_before(cells[:k]), cells[k], names[k], _name_before(cells[:k], names))
            for k in range(1, len(cells))
        ]
        rows.append([text, pair, *(x for c in cells for x in _side(c)), *changes])
    return Table(
        title=" → ".join(f"{'Verdicts: ' if not i else ''}{r.path}" for i, r in enumerate(reports)),
        columns=[Column(header=h, cells=[r[k] for r in rows]) for k, h in enumerate(heads)],
        caption=caption(first, second) + "".join(_later(r, n) for r, n in zip(later, names[2:])),
    )


def pairs(reports: list[Report]):
    """Each compared pair of a claim in any report: (the claim's text, first → later where it
    was reworded; the pair; its row in each report, None where one lacks it)."""
    for chain in chains(reports):
        text = " → ".join(dict.fromkeys(c.text for c in chain if c is not None))
        by = [{r.pair: r for r in c.rows} if c else {} for c in chain]
        for pair in dict.fromkeys(p for b in by for p in b):
            yield text, pair, [b.get(pair) for b in by]


_DIFFERENCE = re.compile(r"^(−?[\d.]+)(?: \[(−?[\d.]+), (−?[\d.]+)\])?")


def estimate(row: Row | None) -> tuple[float, float, float] | None:
    """A row's difference and 95% interval as numbers (nan where it prints no interval); None
    where it has no difference (no data)."""
    found = _DIFFERENCE.match(row.difference) if row is not None else None
    if found is None:
        return None
    return tuple(math.nan if x is None else float(x.replace("−", "-")) for x in found.groups())


def drawn(reports: list[Report]) -> list[tuple[str, str, list]]:
    """What the passes' plot draws: per compared pair (its claim, the pair "a − b", its metric,
    per report None or ((estimate, lo, hi), outcome))."""
    rows = []
    for text, pair, cells in pairs(reports):
        label, _, metric = pair.rpartition(" (")
        points = [(e, c.outcome) if (e := estimate(c)) else None for c in cells]
        rows.append((text, label, metric.removesuffix(")"), points))
    return rows


def plot(first: Report, second: Report, *later: Report):
    """The passes' forest plot (forest.passes_plot): each pair's difference and interval in
    every report that has one, coloured by that report's verdict; None when none has one."""
    from benchmark.leaderboard import forest  # matplotlib, only for a plot

    reports = [first, second, *later]
    return forest.passes_plot(drawn(reports), list(ORDINALS[: len(reports)]))


def _before(cells: list) -> Row | None:
    """The latest report's row of a pair before this one (the second's, else the first's)."""
    return next((c for c in reversed(cells) if c is not None), None)


def _name_before(cells: list, names: tuple) -> str:
    return next((n for c, n in zip(reversed(cells), reversed(names[: len(cells)])) if c), names[0])


def _later(report: Report, name: str) -> str:
    return (
        f"; {name} study: {report.path} ({report.claims_file}), its pairs matched with the latest "
        f"study before it that has them, and what changed there read the same way ({name} against "
        "the study before it)"
    )


def _p_head(report: Report) -> str:
    return "p" if report.adjustment == "unadjusted" else f"p ({report.adjustment})"


def _side(row: Row | None) -> list[str]:
    return [row.difference, row.p, row.verdict] if row else [MISSING] * 3


def caption(first: Report, second: Report) -> str:
    """What each column means (the paragraph under the table)."""
    return (
        f"first study: {first.path} ({first.claims_file}); second study: {second.path} "
        f"({second.claims_file}); one row per compared pair of a claim (better − worse in the "
        "claim's metric) in either study, its cells as its report prints them: difference: better "
        "− worse with its 95% interval (paired by seed, else Welch); p: the pair's two-sided "
        "p-value adjusted over every pair of its own report (the adjustment in the header); "
        "verdict: reproduced / contradicted where that p is below 0.05 and the difference is on "
        "the expected / the other side, else not decided; a claim is matched by its text, or, "
        "where the text changed (shown first → second), by the same pairs and source; what "
        "changed: survived (reproduced in both), unchanged (the same verdict in both), lost / "
        "gained (decided in the first study only / in the second only), sign flipped (reproduced "
        "in one, contradicted in the other), no data in the first / second study (claimed there, "
        "without its rows), not run in the second study / new in the second study (a pair only the first "
        "/ only the second study's claims file holds)"
    )


def render(first: Report, second: Report, *later: Report) -> str:
    """The table and its caption in Markdown, as a README quotes it."""
    t = table(first, second, *later)
    return f"{markdown(t)}\n\n_{t.caption}_"


def change(
    first: Row | None, second: Row | None, later: str = "second", earlier: str = "first"
) -> str:
    """What the `later` study changed in a pair's verdict against the `earlier` one (the labels:
    module docstring)."""
    if second is None:
        return NOT_RUN.replace("second", later)
    if first is None:
        return NEW.replace("second", later)
    a, b = first.outcome, second.outcome
    if a == b:
        return "survived" if a == REPRODUCED else f"unchanged: {a}"
    if NO_DATA in (a, b):
        return f"no data in the {later if b == NO_DATA else earlier} study"
    if UNDECIDED in (a, b):
        return f"{LOST if b == UNDECIDED else GAINED} ({a} → {b})"
    return f"sign flipped ({a} → {b})"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("first", metavar="FIRST_REPORT", help="the first study's report (Markdown)")
    p.add_argument("second", metavar="SECOND_REPORT", help="the second study's report (Markdown)")
    p.add_argument(
        "third",
        metavar="THIRD_REPORT",
        nargs="?",
        help="a third study's report: its columns, and what it changed against the one before",
    )
    p.add_argument(
        "--readme",
        action="append",
        default=[],
        type=Path,
        metavar="FILE",
        help=f"write the table into FILE between <!-- {TAG}: FIRST_REPORT vs SECOND_REPORT[ vs THIRD_REPORT] --> "
        f"and <!-- /{TAG} --> instead of printing it (repeatable)",
    )
    p.add_argument(
        "--plot",
        type=Path,
        metavar="FILE",
        help="also draw each pair's difference and interval in every study into FILE (.png or .svg)",
    )
    args = p.parse_args(argv)
    try:
        paths = [x for x in (args.first, args.second, args.third) if x is not None]
        reports = [read(x) for x in paths]
        block = render(*reports)
        named = " vs ".join(map(str, paths))
        written = {path: _filled(path, block, named).encode("utf-8") for path in args.readme}
        if args.plot is not None:
            if args.plot.suffix not in (".png", ".svg"):
                raise ReportError(f"--plot {args.plot}: a .png or .svg file")
            from benchmark.leaderboard import plots

            figure = plot(*reports)
            if figure is None:
                raise ReportError(f"--plot {args.plot}: no study has a difference to draw")
            written[args.plot] = plots.render(figure)[args.plot.suffix[1:]]
    except ReportError as err:
        print(f"{PROG}: {err}", file=sys.stderr)
        return 2
    for path, data in written.items():  # only once every file has its block
        path.write_bytes(data)
        print(f"wrote {path}", file=sys.stderr)
    if not written:
        print(block)
    return 0


def _filled(path: Path, block: str, name: str) -> str:
    try:
        return filled(path.read_text(encoding="utf-8"), TAG, block, name)
    except OSError as err:
        raise ReportError(f"{path}: cannot be read ({err.strerror or err})") from None
    except ValueError as err:
        raise ReportError(f"{path}: {err}") from None


if __name__ == "__main__":
    sys.exit(main())
