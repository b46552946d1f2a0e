"""The claims' results as tables (in full, and in brief for a reader to quote) and as JSON."""

from __future__ import annotations

import math
import os

from benchmark.leaderboard import stats
from benchmark.leaderboard.claims.check import NO_DATA, Group, Pair, Result
from benchmark.leaderboard.claims.file import ClaimsFile
from benchmark.leaderboard.formats import Column, Table
from benchmark.leaderboard.tables import MISSING, WITH_SE
from benchmark.leaderboard.tuning import setting_label


def _num(value: float, digits: int) -> str:
    return f"{value:.{digits}f}".replace("-", "−") if math.isfinite(value) else MISSING


def _group_cell(g: Group, digits: int) -> str:
    if not g.values:
        return f"{g.name}: no rows"
    se = f" ± {_num(g.se, digits)}" if math.isfinite(g.se) else ""
    at = " | ".join(setting_label(t) for t in g.tuned)
    return (
        f"{g.name}: {_num(g.mean, digits)}{se} ({len(g.values)} seed{'s' * (len(g.values) != 1)}"
        + (f"; tuned: {at})" if at else ")")
    )


def _verdict(r: Result, p: Pair | None) -> str:
    text = p.verdict if p else r.verdict
    if r.why and (
        p is None or p.verdict == NO_DATA
    ):  # what is missing, on the pairs it leaves without data
        text += f": {r.why}"
    return text


def _size(r: Result, p: Pair | None) -> str:
    """Against the paper's difference: inside the interval or not, and whether these seeds could
    have decided it at all."""
    if p is None or p.published is None or p.difference is None:
        return MISSING
    digits = WITH_SE.get(r.claim.metric.column, 4)
    text = {
        "larger": "larger than published",
        "smaller": "smaller than published",
        "opposite": "opposite in sign to published",
        "consistent": "consistent with published",
        "uninformative": f"uninformative at {p.seeds} seeds (the interval holds the paper's difference and 0)",
    }.get(p.size, MISSING)
    if p.underpowered and math.isfinite(p.detectable):
        text += (
            f"; underpowered at {p.seeds} seeds (detects {_num(p.detectable, digits)}; the paper's "
            f"effect is {_num(abs(p.published), digits)}, power {p.power:.0%})"
        )
    return text


def _published_cell(p: Pair | None) -> str:
    """As the claims file gives it (its digits are the paper's)."""
    return (
        f"{p.published:g}".replace("-", "−")
        if p is not None and p.published is not None
        else MISSING
    )


def _pair_cells(r: Result, p: Pair | None) -> dict[str, str]:
    """The cells every table of claims shares: the difference, the paper's, the detectable, the verdict."""
    digits = WITH_SE.get(r.claim.metric.column, 4)
    d = p.difference if p is not None else None
    interval = (
        (f" [{_num(d.lo, digits)}, {_num(d.hi, digits)}]" if math.isfinite(d.lo) else "")
        if d
        else ""
    )
    return {
        "diff": f"{_num(d.estimate, digits)}{interval} ({d.method})" if d else MISSING,
        "published": _published_cell(p),
        "detectable": _num(p.detectable, digits) if d else MISSING,
        "p_adjusted": _p_cell(p.p_adjusted) if p is not None else MISSING,
        "verdict": _verdict(r, p),
        "size": _size(r, p),
        "arms": r.arms.label if r.arms is not None else MISSING,
    }


def differ_cell(r: Result) -> str:
    """Every key whose value is not the same in each group, with each group's values in the
    claim's order: `head_dim 30 / 42; ffn.width_ratio 2.958 / 2.5`."""
    if r.arms is None:
        return MISSING

    def values(key: str) -> str:
        return " / ".join(
            ",".join(dict.fromkeys(str(f.get(key, MISSING)) for f in r.arms.groups[g]))
            for g in r.claim.order
        )

    return "; ".join(f"{k} {values(k)}" for k in r.arms.differ) or "nothing"


def _tuned_by(r: Result) -> str:
    """'; tuned by val_loss' where the arms' setting was chosen on another metric than the claim's."""
    return f"; tuned by {r.tuned_by}" if r.claim.tuned_by_other(r.tuned_by) else ""


def _p_cell(p: float) -> str:
    return MISSING if not math.isfinite(p) else "< 0.001" if p < 0.001 else f"{p:.3f}"


_RULES = {
    "holm": (
        "Holm",
        "Holm-adjusted (the family-wise error rate: the chance of any false verdict among them "
        "is at most 5%)",
    ),
    "bh": (
        "BH",
        "Benjamini-Hochberg-adjusted (the false discovery rate: at most 5% of the decided verdicts "
        "are expected to be false)",
    ),
    "none": (
        "unadjusted",
        "not adjusted (each pair at 5% on its own: among many, some verdicts are chance)",
    ),
}


def _heads(results: list[Result]) -> dict[str, str]:
    name = _RULES[_method(results)][0]
    return {
        "diff": "Difference [95% CI]",
        "published": "Published",
        "detectable": "Detectable (80%)",
        "p_adjusted": "p" if name == "unadjusted" else f"p ({name})",
        "verdict": "Verdict",
        "size": "Size",
        "arms": "Arms",
    }


def _method(results: list[Result]) -> str:
    return next((p.adjustment for r in results for p in r.pairs), stats.DEFAULT_ADJUSTMENT)


def family(claims: ClaimsFile, results: list[Result]) -> str:
    """The adjustment and its family, as the Verdicts and Claims headings print it: 'Holm over the
    all 19 pairs of the report', 'Holm within each study: 2 to 6 pairs'."""
    name = _RULES[_method(results)][0]
    sizes = sorted({p.family for r in results for p in r.pairs if p.family})
    n = (f"{sizes[0]}" if len(sizes) == 1 else f"{sizes[0]} to {sizes[-1]}") if sizes else "0"
    if name == "unadjusted":
        return "unadjusted"
    if claims.adjust_within == "report":
        return f"{name} over all {n} pairs of the report"
    return f"{name} within each {claims.adjust_within}: {n} pairs"


def rule(results: list[Result], within: str = "report") -> str:
    """The verdict rule, printed under every table of claims."""
    method = _method(results)
    where = "this table" if within == "report" else f"its {within} in this table"
    rate = (
        "5% two-sided"
        if method == "none"
        else "two-sided at the pair's adjusted rate, 0.05 / m for a family of m pairs"
    )
    return (
        "verdict: the direction, decided by the pair's two-sided p-value "
        + _RULES[method][1]
        + f" over every pair of {where} with 2 seeds or more a side: reproduced / contradicted where that p is below 0.05 "
        "and the difference is on the expected / the other side, else not decided (the 95% interval beside it "
        "is not adjusted); difference: better − worse, paired by seed where both groups hold the same seeds, "
        "else Welch; published: the paper's own better − worse at its scale; size: consistent with published "
        "where the paper's difference lies inside the 95% interval, larger / smaller where the interval lies "
        "beyond it / short of it, opposite in sign where it lies wholly on the other side of 0, uninformative "
        "where the interval holds both the paper's difference and 0; underpowered (said of a pair not "
        "decided): these seeds are less likely than not (power below 50%) to decide the paper's difference; "
        f"detectable: the smallest true difference these seeds detect with 80% power ({rate}); arms: "
        "controlled where the groups' models differ only in what the claim tests and the dimension its space "
        "solves for the budget and their runs trained alike (tokens, steps, batch, schedule, evaluation, "
        "precision, hardware and threads: the tuned setting aside), else confounded: what also differs"
    )


def table(claims: ClaimsFile, results: list[Result]) -> Table:
    """One row per compared pair (a claim of n groups has n - 1)."""
    heads = {
        "claim": "Claim",
        "source": "Source",
        "study": "Study",
        "count": "Count",
        "metric": "Metric",
        "a": "Expected better",
        "b": "Expected worse",
        "expected": "Expected",
        **_heads(results),
        "differ": "Arms differ in",
    }
    cells: dict[str, list[str]] = {k: [] for k in heads}
    for r in results:
        digits = WITH_SE.get(r.claim.metric.column, 4)
        groups = {g.name: g for g in r.groups}
        for p in r.pairs or (None,):
            row = {
                "claim": r.claim.claim,
                "source": r.claim.source,
                "study": r.study,
                "count": r.count or MISSING,
                "metric": r.claim.metric_text() + _tuned_by(r),
                "a": _group_cell(groups[p.better], digits) if p and p.better in groups else MISSING,
                "b": _group_cell(groups[p.worse], digits) if p and p.worse in groups else MISSING,
                "expected": p.expected if p else MISSING,
                **_pair_cells(r, p),
                "differ": differ_cell(r),
            }
            for k, v in row.items():
                cells[k].append(v)
    return Table(
        title=f"Claims ({os.path.basename(claims.path)}; {family(claims, results)})",
        columns=[Column(header=h, cells=cells[k]) for k, h in heads.items()],
        caption="count: the parameter count the groups' budgets matched (the space's count:, to compare with "
        "the paper's); groups: mean ± s.e. over seeds (a group's candidates averaged per seed), and, in a tuned "
        "study, the setting its final seeds trained at (chosen on the study's grid: the Tuning table); "
        + rule(results, claims.adjust_within),
    )


def verdicts(claims: ClaimsFile, results: list[Result]) -> Table:
    """The claims table in brief, one row per compared pair: what a reader quotes."""
    heads = {"claim": "Claim", "pair": "Better − worse (metric)", **_heads(results)}
    cells: dict[str, list[str]] = {k: [] for k in heads}
    for r in results:
        for p in r.pairs or (None,):
            pair = MISSING
            if p is not None:
                a, b = r.claim.metric_of(p.better).column, r.claim.metric_of(p.worse).column
                pair = f"{p.better} − {p.worse} ({a if a == b else f'{a} − {b}'})"
            for k, v in {"claim": r.claim.claim, "pair": pair, **_pair_cells(r, p)}.items():
                cells[k].append(v)
    return Table(
        title=f"Verdicts ({os.path.basename(claims.path)}; {family(claims, results)})",
        columns=[Column(header=h, cells=cells[k]) for k, h in heads.items()],
        caption=rule(results, claims.adjust_within)
        + "; the groups' means, sources and arms: the claims table",
    )


def _finite(x: float) -> float | None:
    return x if x is not None and math.isfinite(x) else None


def to_json(claims: ClaimsFile, results: list[Result]) -> dict:
    """Every number behind the table, NaN as null."""

    def difference(d: stats.Difference | None):
        if d is None:
            return None
        return {
            "method": d.method,
            "estimate": _finite(d.estimate),
            "se": _finite(d.se),
            "df": _finite(d.df),
            "p": _finite(d.p),
            "interval": [_finite(d.lo), _finite(d.hi)],
            "level": d.level,
            "detectable": _finite(d.detectable),  # at 5% two-sided, unadjusted
            "power": d.power,
        }

    return {
        "file": claims.path,
        "description": claims.description,
        "adjust_within": claims.adjust_within,
        "claims": [
            {
                "claim": r.claim.claim,
                "source": r.claim.source,
                "study": r.study,
                "count": r.count,
                "note": r.claim.note,
                "metric": r.claim.metric.column,
                "direction": r.claim.metric.direction,
                "order": list(r.claim.order),
                "verdict": r.verdict,
                "why": r.why,
                "groups": [
                    {
                        "name": g.name,
                        "filters": g.filters,
                        "metric": g.metric,
                        "seeds": {str(s): v for s, v in g.values.items()},
                        "n": len(g.values),
                        "mean": _finite(g.mean),
                        "se": _finite(g.se),
                        "tuned": list(g.tuned),
                    }
                    for g in r.groups
                ],
                "pairs": [
                    {
                        "better": p.better,
                        "worse": p.worse,
                        "expected": p.expected,
                        "verdict": p.verdict,
                        "difference": difference(p.difference),
                        "p_adjusted": _finite(p.p_adjusted),
                        "adjustment": p.adjustment,
                        "published": p.published,
                        "size": p.size or None,
                        "alpha": p.alpha,
                        "family": p.family,
                        "detectable_at_alpha": _finite(p.detectable),
                        "power_at_published": _finite(p.power),
                        "underpowered": p.underpowered,
                        "seeds": p.seeds,
                        "published_below_detectable": p.below_detectable,
                    }
                    for p in r.pairs
                ],
                "arms": None
                if r.arms is None
                else {
                    "label": r.arms.label,
                    "differ": list(r.arms.differ),
                    "confounded": list(r.arms.confounded),
                    "not_as_set": list(r.arms.not_as_set),
                    "groups": r.arms.groups,
                },
            }
            for r in results
        ],
    }
