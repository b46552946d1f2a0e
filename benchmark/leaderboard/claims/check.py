"""Reading a claims file and checking its claims against a study's rows (the format: __init__)."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pandas as pd

from benchmark.arch import did_you_mean
from benchmark.leaderboard import stats
from benchmark.leaderboard.claims.arms import Arms, candidates_of, compare
from benchmark.leaderboard.objectives import Objective
from benchmark.leaderboard.studies import LeaderboardError
from benchmark.space import select, Source, YamlError, load_yaml
from benchmark.store import MetricError

TOP_KEYS = ("description", "claims", "instability")   # instability: stability.py
CLAIM_KEYS = ("claim", "source", "study", "metric", "order", "groups", "where", "published", "note")
SOURCE_KEYS = ("paper", "where")
GROUP_METRIC = "metric"              # in a group's mapping: its metric, not a column filter
ONE_SEED, NO_DATA = "not decided (1 seed)", "no data"
REPRODUCED, CONTRADICTED, UNDECIDED = "reproduced", "contradicted", "not decided"
# A paper's difference these seeds are less likely than not to decide (the test's power at it) is
# "far below" what they detect: a verdict then says so (Gelman and Carlin 2014: an effect measured
# significant at low power is exaggerated, "type M").
UNDERPOWERED = 0.5


class ClaimsError(LeaderboardError):
    """A claims file the user must fix: `file:line:col: key: reason`."""


Filters = Mapping[str, tuple]  # column -> the values it may take


@dataclass(frozen=True, kw_only=True)
class Claim:
    index: int                       # its position in the file's `claims` list
    claim: str
    source: str
    study: str | None                # None: every study read
    metric: Objective
    order: tuple[str, ...]           # group names, best first
    groups: Mapping[str, Filters]
    where: Filters
    note: str = ""
    group_metrics: Mapping[str, Objective] = field(default_factory=dict)  # a group's own metric
    published: tuple[float, ...] | None = None  # the paper's better - worse, per adjacent pair

    @property
    def expected(self) -> str:
        """The sign of better - worse the order expects: '< 0' for a metric minimised."""
        return _side(self.metric)

    def metric_of(self, group: str) -> Objective:
        return self.group_metrics.get(group, self.metric)

    def metric_text(self) -> str:
        """'val_loss:min', or 'val_loss_r4 vs val_loss_r2 (min)' when groups name their own."""
        if not self.group_metrics:
            return str(self.metric)
        return f"{' vs '.join(self.metric_of(g).column for g in self.order)} ({self.metric.direction})"


@dataclass(frozen=True, kw_only=True)
class ClaimsFile:
    path: str
    description: str
    claims: tuple[Claim, ...]
    origin: Source                   # positions of every key, for errors found against the rows


# --- reading ------------------------------------------------------------------------------------

def load(path: str | os.PathLike) -> ClaimsFile:
    path = os.fspath(path)
    try:
        doc = load_yaml(path)
    except OSError as err:
        raise ClaimsError(f"{path}: cannot be read ({err.strerror or err})") from None
    except YamlError as err:
        raise ClaimsError(f"{path}:{err}") from None
    src = Source(path, doc)
    top = doc.data
    if not isinstance(top, dict):
        raise _error(src, (), "expected a mapping with a `claims:` list")
    _known(src, (), top, TOP_KEYS)
    listed = top.get("claims")
    if not isinstance(listed, list) or not listed:
        raise _error(src, ("claims",), "expected a non-empty list of claims")
    claims = tuple(_claim(src, i, raw) for i, raw in enumerate(listed))
    return ClaimsFile(path=path, description=str(top.get("description") or ""), claims=claims, origin=src)


def _error(src: Source, path: tuple, reason: str) -> ClaimsError:
    return ClaimsError(str(src.error(path, reason)))


def _known(src: Source, at: tuple, raw: dict, allowed: Sequence[str]) -> None:
    for key in raw:
        if key not in allowed:
            hint = did_you_mean(key, allowed) or f"; allowed: {', '.join(allowed)}"
            raise ClaimsError(str(src.error((*at, key), f"unknown key{hint}", value=False)))


def _text(src: Source, at: tuple, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise _error(src, at, f"expected text, got {value!r}")
    return value.strip()


def _claim(src: Source, i: int, raw: Any) -> Claim:
    at = ("claims", i)
    if not isinstance(raw, dict):
        raise _error(src, at, f"expected a mapping (claim, source, study, metric, order, groups), got {raw!r}")
    _known(src, at, raw, CLAIM_KEYS)
    for key in ("claim", "source", "metric", "order", "groups"):
        if key not in raw:
            raise _error(src, at, f"missing key {key!r}")
    metric = _metric(src, (*at, "metric"), raw["metric"])
    groups = raw["groups"]
    if not isinstance(groups, dict) or len(groups) < 2:
        raise _error(src, (*at, "groups"), "expected a mapping of 2 or more group names to column filters")
    order = raw["order"]
    if not isinstance(order, list) or len(order) < 2 or len(set(map(str, order))) != len(order):
        raise _error(src, (*at, "order"), "expected a list of 2 or more distinct group names, best first")
    for k, name in enumerate(order):
        if name not in groups:
            raise _error(src, (*at, "order", k), f"no group {name!r} under groups ({', '.join(groups)})")
    for name in groups:
        if name not in order:
            raise ClaimsError(str(src.error((*at, "groups", name), "group not in `order`", value=False)))
    own = {g: _group_metric(src, (*at, "groups", g, GROUP_METRIC), f[GROUP_METRIC], metric)
           for g, f in groups.items() if isinstance(f, dict) and GROUP_METRIC in f}
    filters = {g: {k: v for k, v in f.items() if k != GROUP_METRIC} if isinstance(f, dict) else f
               for g, f in groups.items()}
    return Claim(index=i, claim=_text(src, (*at, "claim"), raw["claim"]), source=_source(src, at, raw["source"]),
                 study=_text(src, (*at, "study"), raw["study"]) if "study" in raw else None, metric=metric,
                 order=tuple(order),
                 groups={g: _filters(src, (*at, "groups", g), f, empty=g in own) for g, f in filters.items()},
                 where=_filters(src, (*at, "where"), raw.get("where") or {}, empty=True),
                 note=str(raw.get("note") or "").strip(), group_metrics=own,
                 published=_published(src, (*at, "published"), raw["published"], order, metric)
                 if "published" in raw else None)


def _published(src: Source, at: tuple, raw: Any, order: list, metric: Objective) -> tuple[float, ...]:
    """The paper's differences, one per adjacent pair of the order (a bare number for one pair),
    each on the side the order expects (a slip of sign would say the paper found the opposite)."""
    pairs = len(order) - 1
    values = raw if isinstance(raw, list) else [raw]
    if len(values) != pairs or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                                       for v in values):
        want = "a number" if pairs == 1 else f"a list of {pairs} numbers"
        raise _error(src, at, f"expected {want} (the paper's better - worse for each adjacent pair of "
                              f"`order`), got {raw!r}")
    for k, v in enumerate(values):
        if (v > 0) != metric.maximize and v != 0:
            raise _error(src, at, f"{order[k]} - {order[k + 1]} = {v:g} is not {_side(metric)}, the side the order "
                                  f"expects for {metric} ({order[k]} better): check the sign, or the order")
    return tuple(float(v) for v in values)


def _side(metric: Objective) -> str:
    return "> 0" if metric.maximize else "< 0"


def _metric(src: Source, at: tuple, raw: Any) -> Objective:
    try:
        return Objective.parse(_text(src, at, raw))
    except MetricError as err:
        raise _error(src, at, str(err)) from None


def _group_metric(src: Source, at: tuple, raw: Any, claim: Objective) -> Objective:
    """A group's own metric: one the claim's difference can be taken with (same kind, unit and
    direction as the claim's metric)."""
    own = _metric(src, at, raw)
    a, b = own.metric, claim.metric
    if (a.kind, a.unit, own.maximize) != (b.kind, b.unit, claim.maximize):
        raise _error(src, at, f"{own} cannot be compared with the claim's metric {claim}: a group's metric shares "
                              "its kind, unit and direction (val_loss_r4 with val_loss, val_ppl_int4 with val_ppl)")
    return own


def _source(src: Source, at: tuple, raw: Any) -> str:
    if not isinstance(raw, dict):
        raise _error(src, (*at, "source"), "expected {paper: ..., where: ...} (the section or table)")
    _known(src, (*at, "source"), raw, SOURCE_KEYS)
    return ", ".join(_text(src, (*at, "source", k), raw.get(k)) for k in SOURCE_KEYS)


def _filters(src: Source, at: tuple, raw: Any, empty: bool) -> dict[str, tuple]:
    if not isinstance(raw, dict) or (not raw and not empty):
        raise _error(src, at, f"expected a mapping of results columns to values (e.g. {{family: hyperloop}}), got {raw!r}")
    out = {}
    for column, value in raw.items():
        values = value if isinstance(value, list) else [value]
        if not values or any(isinstance(v, (dict, list)) or v is None for v in values):
            raise _error(src, (*at, column), f"expected a value or a list of values, got {value!r}")
        out[column] = tuple(values)
    return out


# --- checking against the rows ------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class Group:
    name: str
    filters: str                     # "family=hyperloop"
    metric: str                      # the column its values are read from
    values: dict[int, float]         # seed -> the group's mean over its candidates with that seed
    mean: float
    se: float


@dataclass(frozen=True, kw_only=True)
class Pair:
    better: str                      # expected better
    worse: str
    expected: str                    # "< 0" or "> 0": the sign of better - worse the claim expects
    difference: stats.Difference | None
    verdict: str                     # the direction: reproduced / contradicted / not decided, at the adjusted p
    published: float | None = None   # the paper's better - worse
    p_adjusted: float = math.nan     # the difference's p-value, adjusted over every pair evaluated together
    adjustment: str = "holm"         # how (stats.ADJUSTMENTS)
    seeds: int = 0                   # the fewer seeds of the two groups

    @property
    def below_detectable(self) -> bool:
        """The paper's difference is smaller than what these seeds detect with 80% power."""
        d = self.difference
        return (self.published is not None and d is not None and math.isfinite(d.detectable)
                and abs(self.published) < d.detectable)

    @property
    def power(self) -> float:
        """The chance these seeds decide the paper's difference, were it the true one (NaN without one)."""
        d = self.difference
        if self.published is None or d is None:
            return math.nan
        return float(stats.power(self.published, d.se, d.df))

    @property
    def underpowered(self) -> bool:
        """Less likely than not to decide the paper's difference (power below UNDERPOWERED)."""
        return self.power < UNDERPOWERED

    @property
    def size(self) -> str:
        """Where the paper's difference lies against the interval: 'consistent' (inside it),
        'larger' (the whole interval beyond it on the expected side), 'smaller' (short of it, or on
        the other side of 0); '' without a published value or an interval."""
        d = self.difference
        if self.published is None or d is None or not math.isfinite(d.lo):
            return ""
        if d.lo <= self.published <= d.hi:
            return "consistent"
        beyond = d.hi < self.published if self.expected == "< 0" else d.lo > self.published
        return "larger" if beyond else "smaller"


@dataclass(frozen=True, kw_only=True)
class Result:
    claim: Claim
    study: str
    groups: tuple[Group, ...]
    pairs: tuple[Pair, ...]
    verdict: str
    why: str = ""                    # for "no data": what is missing
    count: str = ""                  # the parameter count the groups' budgets matched (budget_count)
    arms: Arms | None = None         # what the groups' models differ in (arms.compare); None without specs


def evaluate(claims: ClaimsFile, trials: pd.DataFrame, adjust: str = "holm",
             declared: Mapping[str, dict] | None = None) -> list[Result]:
    """Every claim checked against `trials` (a board's trials: every row read, any status), in its
    study, or in each study when it names none; verdicts at the p-values adjusted by `adjust`
    (stats.ADJUSTMENTS). `declared`: each study's declaration (_study.json), which says what its
    space solved and what its variants set, for the arms' check."""
    studies = list(pd.unique(trials["study"]))
    results = [_evaluate(claims.origin, c, study, trials, (declared or {}).get(study) or {})
               for c in claims.claims for study in ([c.study] if c.study else studies)]
    return _adjusted(results, adjust)


def _adjusted(results: list[Result], method: str) -> list[Result]:
    """Each pair's p-value adjusted over every pair of the file, and its direction decided by the
    adjusted p: many claims checked at 5% each find some "reproduced" or "contradicted" by chance,
    and a verdict states the error rate it was decided at (Holm: the family-wise rate)."""
    pairs = [p for r in results for p in r.pairs]
    # a pair without data, or with one seed a side (no standard error), has no p and is no test
    adjusted = iter(stats.adjust([p.difference.p if p.difference is not None else math.nan for p in pairs], method))
    out = []
    for r in results:
        decided = tuple(_decide(replace(p, p_adjusted=float(next(adjusted)), adjustment=method)) for p in r.pairs)
        out.append(replace(r, pairs=decided, verdict=_overall([p.verdict for p in decided])))
    return out


def _decide(p: Pair) -> Pair:
    """The direction at the adjusted p: decided below stats.ALPHA, on the side the estimate is."""
    if p.verdict in (NO_DATA, ONE_SEED) or not math.isfinite(p.p_adjusted):
        return p
    if p.p_adjusted >= stats.ALPHA:
        return replace(p, verdict=UNDECIDED)
    agrees = (p.difference.estimate < 0) == (p.expected == "< 0")
    return replace(p, verdict=REPRODUCED if agrees else CONTRADICTED)


def _evaluate(src: Source, claim: Claim, study: str, trials: pd.DataFrame, declared: Mapping[str, Any]) -> Result:
    rows = trials[trials["study"] == study]
    published = claim.published or (None,) * (len(claim.order) - 1)
    if rows.empty:
        found = ", ".join(pd.unique(trials["study"]))
        pairs = tuple(Pair(better=a, worse=b, expected=claim.expected, difference=None, verdict=NO_DATA, published=p)
                      for a, b, p in zip(claim.order, claim.order[1:], published))
        return Result(claim=claim, study=study, groups=(), pairs=pairs, verdict=NO_DATA,
                      why=f"no study {study} here ({found})")
    at = ("claims", claim.index)
    for name in claim.order:
        if (col := claim.metric_of(name).column) not in rows:
            key = (*at, "groups", name, GROUP_METRIC) if name in claim.group_metrics else (*at, "metric")
            raise _error(src, key, f"the results have no column {col}")
    shared = rows[_match(src, (*at, "where"), rows, claim.where)]
    every = {name: shared[_match(src, (*at, "groups", name), shared, claim.groups[name])] for name in claim.order}
    matched = {name: m[(m["status"] == "ok").to_numpy()] for name, m in every.items()}
    groups = tuple(_group(name, matched[name], claim) for name in claim.order)
    pairs = tuple(_pair(a, b, claim, p) for a, b, p in zip(groups, groups[1:], published))
    empty: dict[str, list[str]] = {}
    for g in groups:
        if not g.values:
            empty.setdefault(g.metric, []).append(g.name)
    why = "; ".join(f"no ok rows with a finite {col} in group {', '.join(names)}" for col, names in empty.items())
    if empty:  # what the empty groups' rows were instead (a pruned candidate, a failed one)
        statuses = pd.concat([every[n]["status"] for names in empty.values() for n in names])
        statuses = statuses[statuses != "ok"].value_counts()
        if len(statuses):
            why += f" ({', '.join(f'{status} {n}' for status, n in statuses.items())})"   # most first
    counts = sorted({str(c) for rows in matched.values() if "budget_count" in rows
                     for c in rows["budget_count"].dropna()})
    arms = None
    if "spec" in rows and all(len(m) for m in matched.values()):
        cands = {name: candidates_of(m, counts[0] if len(counts) == 1 else None) for name, m in matched.items()}
        arms = compare(cands, {n: {**claim.where, **claim.groups[n]} for n in claim.order}, declared)
    return Result(claim=claim, study=study, groups=groups, pairs=pairs, verdict=_overall([p.verdict for p in pairs]),
                  why=why, count=", ".join(counts), arms=arms)


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
    return Group(name=name, filters=filters, metric=col, values=values, mean=float(mean), se=float(se))


def _pair(a: Group, b: Group, claim: Claim, published: float | None) -> Pair:
    diff = stats.compare(a.values, b.values) if a.values and b.values else None
    seeds = min(len(a.values), len(b.values))
    # decided once every pair's p is adjusted (_adjusted)
    verdict = NO_DATA if diff is None else ONE_SEED if seeds < 2 else UNDECIDED
    return Pair(better=a.name, worse=b.name, expected=claim.expected, difference=diff, verdict=verdict,
                published=published, seeds=seeds)


def _overall(verdicts: list[str]) -> str:
    """A claim of more than two groups holds when every adjacent pair does."""
    for worst in (NO_DATA, CONTRADICTED):
        if worst in verdicts:
            return worst
    if all(v == REPRODUCED for v in verdicts):
        return REPRODUCED
    return ONE_SEED if ONE_SEED in verdicts else UNDECIDED
