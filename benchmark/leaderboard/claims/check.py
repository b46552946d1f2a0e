"""Checking a claims file's claims against a study's rows: groups paired by seed, each adjacent
pair's difference, its p-value adjusted over the file, and the verdicts (the format: __init__;
reading the file: file.py)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import orjson
import pandas as pd

from benchmark.leaderboard import stats
from benchmark.leaderboard.claims.arms import Arms, candidates_of, compare
from benchmark.leaderboard.claims.file import (
    GROUP_METRIC,
    Claim,
    ClaimsError,
    ClaimsFile,
    Filters,
    error,
)
from benchmark.space import Source, select

ONE_SEED, NO_DATA = "not decided (1 seed)", "no data"
REPRODUCED, CONTRADICTED, UNDECIDED = "reproduced", "contradicted", "not decided"
# A paper's difference these seeds are less likely than not to decide (the test's power at it) is
# "far below" what they detect: a verdict then says so (Gelman and Carlin 2014: an effect measured
# significant at low power is exaggerated, "type M").
UNDERPOWERED = 0.5


@dataclass(frozen=True, kw_only=True)
class Group:
    name: str
    filters: str  # "family=hyperloop"
    metric: str  # the column its values are read from
    values: dict[int, float]  # seed -> the group's mean over its candidates with that seed
    mean: float
    se: float
    # the setting its rows trained at, where their study tuned them (a tuned study's `tuned` JSON,
    # e.g. {"lr": 0.006}; several where the group's candidates chose differently)
    tuned: tuple[dict, ...] = ()


@dataclass(frozen=True, kw_only=True)
class Pair:
    better: str  # expected better
    worse: str
    expected: str  # "< 0" or "> 0": the sign of better - worse the claim expects
    difference: stats.Difference | None
    verdict: str  # the direction: reproduced / contradicted / not decided, at the adjusted p
    published: float | None = None  # the paper's better - worse
    p_adjusted: float = (
        math.nan
    )  # the difference's p-value, adjusted over every pair evaluated together
    adjustment: str = stats.DEFAULT_ADJUSTMENT  # how (stats.ADJUSTMENTS)
    seeds: int = 0  # the fewer seeds of the two groups
    # The two-sided rate each pair is tested at once adjusted: 0.05 / m for Holm and BH over a
    # family of m pairs (the rate their smallest p must meet), 0.05 unadjusted. Power and the
    # detectable difference are stated at it: a verdict decided at the adjusted p needs it.
    alpha: float = stats.ALPHA
    family: int = 1  # the pairs adjusted together (the claims file's `adjust_within`)

    @property
    def detectable(self) -> float:
        """The smallest true difference these seeds decide with 80% power at the pair's rate."""
        d = self.difference
        return math.nan if d is None else float(stats.detectable(d.se, d.df, 1 - self.alpha))

    @property
    def below_detectable(self) -> bool:
        """The paper's difference is smaller than what these seeds detect with 80% power."""
        return (
            self.published is not None
            and math.isfinite(self.detectable)
            and abs(self.published) < self.detectable
        )

    @property
    def power(self) -> float:
        """The chance these seeds decide the paper's difference at the pair's rate, were it the
        true one (NaN without one)."""
        d = self.difference
        if self.published is None or d is None:
            return math.nan
        return float(stats.power(self.published, d.se, d.df, 1 - self.alpha))

    @property
    def underpowered(self) -> bool:
        """Less likely than not to decide the paper's difference (power below UNDERPOWERED): said of
        a pair left undecided, where it explains the silence; beside a decided verdict it is no
        reason to doubt the direction (the size then says how the estimate compares)."""
        return self.verdict == UNDECIDED and self.power < UNDERPOWERED

    @property
    def size(self) -> str:
        """Where the paper's difference lies against the interval: 'consistent' (inside it, and 0
        outside: the interval tells the paper's effect from none), 'uninformative' (both the
        paper's difference and 0 inside: consistent with either), 'larger' (the whole interval
        beyond it on the expected side), 'opposite' (the whole interval on the other side of 0: the
        sign reversed, which 'smaller' would understate), 'smaller' (short of it otherwise); ''
        without a published value or an interval."""
        d = self.difference
        if self.published is None or d is None or not math.isfinite(d.lo):
            return ""
        if d.lo <= self.published <= d.hi:
            return "uninformative" if d.lo <= 0 <= d.hi else "consistent"
        lower = self.expected == "< 0"
        if (d.hi < self.published) if lower else (d.lo > self.published):
            return "larger"
        return "opposite" if (d.lo > 0 if lower else d.hi < 0) else "smaller"


@dataclass(frozen=True, kw_only=True)
class Result:
    claim: Claim
    study: str
    groups: tuple[Group, ...]
    pairs: tuple[Pair, ...]
    verdict: str
    why: str = ""  # for "no data": what is missing
    count: str = ""  # the parameter count the groups' budgets matched (budget_count)
    arms: Arms | None = None  # what the groups' models differ in (arms.compare); None without specs


def evaluate(
    claims: ClaimsFile,
    trials: pd.DataFrame,
    adjust: str = stats.DEFAULT_ADJUSTMENT,
    declared: Mapping[str, dict] | None = None,
    tuning: pd.DataFrame | None = None,
) -> list[Result]:
    """Every claim checked against `trials` (a board's trials: every row read, any status), in its
    study, or in each study when it names none; verdicts at the p-values adjusted by `adjust`
    (stats.ADJUSTMENTS). `declared`: each study's declaration (_study.json), which says what its
    space solved and what its variants set, for the arms' check; `tuning`: the tuning runs
    (leaderboard/tuning.split), whose hardware the arms' check compares too."""
    studies = list(pd.unique(trials["study"]))
    results = [
        _evaluate(claims.origin, c, study, trials, (declared or {}).get(study) or {}, tuning)
        for c in claims.claims
        for study in ([c.study] if c.study else studies)
    ]
    return _adjusted(results, adjust, claims.adjust_within)


def family_of(r: Result, within: str):
    """The family a result's pairs are adjusted in: the whole report, its study or its claim."""
    return {"report": None, "study": r.study, "claim": (r.claim.index, r.study)}[within]


def _adjusted(results: list[Result], method: str, within: str = "report") -> list[Result]:
    """Each pair's p-value adjusted over its family (`within`: every pair of the report, of its
    study or of its claim), and its direction decided by the adjusted p: many claims checked at 5%
    each find some "reproduced" or "contradicted" by chance, and a verdict states the error rate
    it was decided at (Holm: the family-wise rate)."""

    # a pair without data, or with one seed a side (no standard error), has no p and is no test
    def p_of(p: Pair) -> float:
        return p.difference.p if p.difference is not None else math.nan

    families: dict[Any, list[tuple[int, int]]] = {}
    for i, r in enumerate(results):
        families.setdefault(family_of(r, within), []).extend((i, j) for j in range(len(r.pairs)))
    decided: dict[tuple[int, int], Pair] = {}
    for members in families.values():
        ps = [p_of(results[i].pairs[j]) for i, j in members]
        m = sum(math.isfinite(x) for x in ps)
        alpha = stats.ALPHA if method == "none" else stats.ALPHA / max(m, 1)
        for (i, j), adjusted in zip(members, stats.adjust(ps, method)):
            p = results[i].pairs[j]
            decided[(i, j)] = _decide(
                replace(p, p_adjusted=float(adjusted), adjustment=method, alpha=alpha, family=m)
            )
    out = []
    for i, r in enumerate(results):
        pairs = tuple(decided[(i, j)] for j in range(len(r.pairs)))
        out.append(replace(r, pairs=pairs, verdict=_overall([p.verdict for p in pairs])))
    return out


def _decide(p: Pair) -> Pair:
    """The direction at the adjusted p: decided below stats.ALPHA, on the side the estimate is."""
    if p.verdict in (NO_DATA, ONE_SEED) or not math.isfinite(p.p_adjusted):
        return p
    if p.p_adjusted >= stats.ALPHA:
        return replace(p, verdict=UNDECIDED)
    agrees = (p.difference.estimate < 0) == (p.expected == "< 0")
    return replace(p, verdict=REPRODUCED if agrees else CONTRADICTED)


def _absent(study: str, found: str, declared: Mapping[str, Any]) -> str:
    """Why a claim's study has no rows: not here, or (its _study.json is) under way."""
    if not declared:
        return f"no study {study} here ({found})"
    tuned = " (tuning runs are not judged)" if declared.get("tune") else ""
    return f"study {study} has no rows to judge yet{tuned}"


def _evaluate(
    src: Source,
    claim: Claim,
    study: str,
    trials: pd.DataFrame,
    declared: Mapping[str, Any],
    tuning: pd.DataFrame | None = None,
) -> Result:
    rows = trials[trials["study"] == study]
    published = claim.published or (None,) * (len(claim.order) - 1)
    if rows.empty:
        found = ", ".join(pd.unique(trials["study"]))
        pairs = tuple(
            Pair(
                better=a,
                worse=b,
                expected=claim.expected,
                difference=None,
                verdict=NO_DATA,
                published=p,
            )
            for a, b, p in zip(claim.order, claim.order[1:], published)
        )
        return Result(
            claim=claim,
            study=study,
            groups=(),
            pairs=pairs,
            verdict=NO_DATA,
            why=_absent(study, found, declared),
        )
    at = ("claims", claim.index)
    for name in claim.order:
        if (col := claim.metric_of(name).column) not in rows:
            key = (
                (*at, "groups", name, GROUP_METRIC)
                if name in claim.group_metrics
                else (*at, "metric")
            )
            raise error(src, key, f"the results have no column {col}")
    shared = rows[_match(src, (*at, "where"), rows, claim.where)]
    every = {
        name: shared[_match(src, (*at, "groups", name), shared, claim.groups[name])]
        for name in claim.order
    }
    matched = {name: m[(m["status"] == "ok").to_numpy()] for name, m in every.items()}
    groups = tuple(_group(name, matched[name], claim) for name in claim.order)
    pairs = tuple(_pair(a, b, claim, p) for a, b, p in zip(groups, groups[1:], published))
    empty: dict[str, list[str]] = {}
    for g in groups:
        if not g.values:
            empty.setdefault(g.metric, []).append(g.name)
    why = "; ".join(
        f"no ok rows with a finite {col} in group {', '.join(names)}"
        for col, names in empty.items()
    )
    if empty:  # what the empty groups' rows were instead (a pruned candidate, a failed one)
        statuses = pd.concat([every[n]["status"] for names in empty.values() for n in names])
        statuses = statuses[statuses != "ok"].value_counts()
        if len(statuses):
            why += (
                f" ({', '.join(f'{status} {n}' for status, n in statuses.items())})"  # most first
            )
    counts = sorted(
        {
            str(c)
            for rows in matched.values()
            if "budget_count" in rows
            for c in rows["budget_count"].dropna()
        }
    )
    arms = None
    tuned_runs = (
        tuning[tuning["study"] == study] if tuning is not None and "study" in tuning else None
    )
    if "spec" in rows and all(len(m) for m in matched.values()):
        cands = {
            name: candidates_of(m, counts[0] if len(counts) == 1 else None, tuned_runs)
            for name, m in matched.items()
        }
        arms = compare(
            cands,
            {n: {**claim.where, **claim.groups[n]} for n in claim.order},
            declared,
            claim.tokens,
        )
    return Result(
        claim=claim,
        study=study,
        groups=groups,
        pairs=pairs,
        verdict=_overall([p.verdict for p in pairs]),
        why=why,
        count=", ".join(counts),
        arms=arms,
    )


def _match(src: Source, at: tuple, rows: pd.DataFrame, filters: Filters) -> np.ndarray:
    try:
        return select.mask(rows, filters)
    except select.FilterError as e:
        raise ClaimsError(str(src.error((*at, e.column), str(e), value=e.value))) from None


def _group(name: str, rows: pd.DataFrame, claim: Claim) -> Group:
    col = claim.metric_of(name).column
    rows = rows[np.isfinite(rows[col].to_numpy(dtype=float))]
    if "seed" in rows and rows["seed"].notna().all():
        per_seed = rows.groupby("seed")[col].mean()
        values = {int(s): float(v) for s, v in per_seed.items()}
    else:  # no seed to pair by: every row is its own sample (and never pairs)
        values = {-1 - i: float(v) for i, v in enumerate(rows[col])}
    mean, se, _ = stats.mean_se(list(values.values()))
    filters = " ".join(f"{k}={'|'.join(map(str, v))}" for k, v in claim.groups[name].items())
    tuned = (
        tuple(orjson.loads(t) for t in sorted(set(rows["tuned"].dropna())))
        if "tuned" in rows
        else ()
    )
    return Group(
        name=name,
        filters=filters,
        metric=col,
        values=values,
        mean=float(mean),
        se=float(se),
        tuned=tuned,
    )


def _pair(a: Group, b: Group, claim: Claim, published: float | None) -> Pair:
    diff = stats.compare(a.values, b.values) if a.values and b.values else None
    seeds = min(len(a.values), len(b.values))
    # decided once every pair's p is adjusted (_adjusted)
    verdict = NO_DATA if diff is None else ONE_SEED if seeds < 2 else UNDECIDED
    return Pair(
        better=a.name,
        worse=b.name,
        expected=claim.expected,
        difference=diff,
        verdict=verdict,
        published=published,
        seeds=seeds,
    )


def _overall(verdicts: list[str]) -> str:
    """A claim of more than two groups holds when every adjacent pair does."""
    for worst in (NO_DATA, CONTRADICTED):
        if worst in verdicts:
            return worst
    if all(v == REPRODUCED for v in verdicts):
        return REPRODUCED
    return ONE_SEED if ONE_SEED in verdicts else UNDECIDED
