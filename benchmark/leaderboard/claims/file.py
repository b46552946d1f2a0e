"""A claims file read and validated: its claims as dataclasses, and located errors
(`file:line:col: key: reason`) for anything it gets wrong (the format: __init__)."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from benchmark.arch.fields import did_you_mean
from benchmark.leaderboard.loading import LeaderboardError
from benchmark.leaderboard.objectives import Objective
from benchmark.space.source import Source
from benchmark.space.yamlsafe import YamlError, load_yaml
from benchmark.store.metrics import MetricError

TOP_KEYS = ("description", "adjust_within", "claims", "instability")  # instability: stability.py
# The family a verdict's p-value is adjusted in: every pair of the report, of its study, or of its
# claim. A choice the file makes before the rows are read, and the report prints: a wider family
# asks more of each pair (Holm over 19 pairs tests the first at 0.05 / 19).
ADJUST_WITHIN = ("report", "study", "claim")
CLAIM_KEYS = (
    "claim",
    "source",
    "study",
    "metric",
    "order",
    "groups",
    "where",
    "published",
    "tokens",
    "note",
)
# A claim's token rule, as its paper trains its arms (the arms check: claims/arms.py): `same` (every
# arm the same tokens), `own` (each arm the same multiple of its own count), or a group's name.
TOKEN_RULES = ("same", "own")
SOURCE_KEYS = ("paper", "where")
GROUP_METRIC = "metric"  # in a group's mapping: its metric, not a column filter


class ClaimsError(LeaderboardError):
    """A claims file the user must fix: `file:line:col: key: reason`."""


Filters = Mapping[str, tuple]  # column -> the values it may take


@dataclass(frozen=True, kw_only=True)
class Claim:
    index: int  # its position in the file's `claims` list
    claim: str
    source: str
    study: str | None  # None: every study read
    metric: Objective
    order: tuple[str, ...]  # group names, best first
    groups: Mapping[str, Filters]
    where: Filters
    note: str = ""
    group_metrics: Mapping[str, Objective] = field(default_factory=dict)  # a group's own metric
    published: tuple[float, ...] | None = None  # the paper's better - worse, per adjacent pair
    tokens: str = TOKEN_RULES[0]  # TOKEN_RULES, or a group: every arm at that group's tokens

    @property
    def expected(self) -> str:
        """The sign of better - worse the order expects: '< 0' for a metric minimised."""
        return _side(self.metric)

    def metric_of(self, group: str) -> Objective:
        return self.group_metrics.get(group, self.metric)

    def tuned_by_other(self, tuned: str) -> bool:
        """Whether arms tuned on metric `tuned` ('' for none) are judged here by another metric."""
        return bool(tuned) and {self.metric_of(g).column for g in self.order} != {tuned}

    def metric_text(self) -> str:
        """'val_loss:min', or 'val_loss_r4 vs val_loss_r2 (min)' when groups name their own."""
        if not self.group_metrics:
            return str(self.metric)
        return (
            f"{' vs '.join(self.metric_of(g).column for g in self.order)} ({self.metric.direction})"
        )


@dataclass(frozen=True, kw_only=True)
class ClaimsFile:
    path: str
    description: str
    claims: tuple[Claim, ...]
    origin: Source  # positions of every key, for errors found against the rows
    adjust_within: str = ADJUST_WITHIN[0]


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
        raise error(src, (), "expected a mapping with a `claims:` list")
    only_known(src, (), top, TOP_KEYS)
    listed = top.get("claims")
    if not isinstance(listed, list) or not listed:
        raise error(src, ("claims",), "expected a non-empty list of claims")
    claims = tuple(_claim(src, i, raw) for i, raw in enumerate(listed))
    within = top.get("adjust_within", ADJUST_WITHIN[0])
    if within not in ADJUST_WITHIN:
        raise error(
            src, ("adjust_within",), f"expected one of {', '.join(ADJUST_WITHIN)}, got {within!r}"
        )
    return ClaimsFile(
        path=path,
        description=str(top.get("description") or ""),
        claims=claims,
        origin=src,
        adjust_within=within,
    )


def error(src: Source, path: tuple, reason: str) -> ClaimsError:
    """A ClaimsError at the key `path` of the file (stability.py's `instability:` too)."""
    return ClaimsError(str(src.error(path, reason)))


def only_known(src: Source, at: tuple, raw: dict, allowed: Sequence[str]) -> None:
    """A ClaimsError at the first key of `raw` (the mapping at `at`) not in `allowed`."""
    for key in raw:
        if key not in allowed:
            hint = did_you_mean(key, allowed) or f"; allowed: {', '.join(allowed)}"
            raise ClaimsError(str(src.error((*at, key), f"unknown key{hint}", value=False)))


def _text(src: Source, at: tuple, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise error(src, at, f"expected text, got {value!r}")
    return value.strip()


def _claim(src: Source, i: int, raw: Any) -> Claim:
    at = ("claims", i)
    if not isinstance(raw, dict):
        raise error(
            src,
            at,
            f"expected a mapping (claim, source, study, metric, order, groups), got {raw!r}",
        )
    only_known(src, at, raw, CLAIM_KEYS)
    for key in ("claim", "source", "metric", "order", "groups"):
        if key not in raw:
            raise error(src, at, f"missing key {key!r}")
    metric = _metric(src, (*at, "metric"), raw["metric"])
    groups = raw["groups"]
    if not isinstance(groups, dict) or len(groups) < 2:
        raise error(
            src, (*at, "groups"), "expected a mapping of 2 or more group names to column filters"
        )
    order = raw["order"]
    if not isinstance(order, list) or len(order) < 2 or len(set(map(str, order))) != len(order):
        raise error(
            src, (*at, "order"), "expected a list of 2 or more distinct group names, best first"
        )
    for k, name in enumerate(order):
        if name not in groups:
            raise error(
                src, (*at, "order", k), f"no group {name!r} under groups ({', '.join(groups)})"
            )
    for name in groups:
        if name not in order:
            raise ClaimsError(
                str(src.error((*at, "groups", name), "group not in `order`", value=False))
            )
    own = {
        g: _group_metric(src, (*at, "groups", g, GROUP_METRIC), f[GROUP_METRIC], metric)
        for g, f in groups.items()
        if isinstance(f, dict) and GROUP_METRIC in f
    }
    filters = {
        g: {k: v for k, v in f.items() if k != GROUP_METRIC} if isinstance(f, dict) else f
        for g, f in groups.items()
    }
    return Claim(
        index=i,
        claim=_text(src, (*at, "claim"), raw["claim"]),
        source=_source(src, at, raw["source"]),
        study=_text(src, (*at, "study"), raw["study"]) if "study" in raw else None,
        metric=metric,
        order=tuple(order),
        groups={
            g: _filters(src, (*at, "groups", g), f, empty=g in own) for g, f in filters.items()
        },
        where=_filters(src, (*at, "where"), raw.get("where") or {}, empty=True),
        note=str(raw.get("note") or "").strip(),
        group_metrics=own,
        published=_published(src, (*at, "published"), raw["published"], order, metric)
        if "published" in raw
        else None,
        tokens=_tokens(src, (*at, "tokens"), raw.get("tokens", TOKEN_RULES[0]), order),
    )


def _tokens(src: Source, at: tuple, raw: Any, order: list) -> str:
    if raw in TOKEN_RULES or raw in order:
        return str(raw)
    raise error(
        src,
        at,
        f"expected same (every arm the same tokens), own (each arm the same tokens per counted "
        f"parameter) or a group of the claim ({', '.join(map(str, order))}), got {raw!r}",
    )


def _published(
    src: Source, at: tuple, raw: Any, order: list, metric: Objective
) -> tuple[float, ...]:
    """The paper's differences, one per adjacent pair of the order (a bare number for one pair),
    each on the side the order expects (a slip of sign would say the paper found the opposite)."""
    pairs = len(order) - 1
    values = raw if isinstance(raw, list) else [raw]
    if len(values) != pairs or not all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in values
    ):
        want = "a number" if pairs == 1 else f"a list of {pairs} numbers"
        raise error(
            src,
            at,
            f"expected {want} (the paper's better - worse for each adjacent pair of "
            f"`order`), got {raw!r}",
        )
    for k, v in enumerate(values):
        if (v > 0) != metric.maximize and v != 0:
            raise error(
                src,
                at,
                f"{order[k]} - {order[k + 1]} = {v:g} is not {_side(metric)}, the side the order "
                f"expects for {metric} ({order[k]} better): check the sign, or the order",
            )
    return tuple(float(v) for v in values)


def _side(metric: Objective) -> str:
    return "> 0" if metric.maximize else "< 0"


def _metric(src: Source, at: tuple, raw: Any) -> Objective:
    try:
        return Objective.parse(_text(src, at, raw))
    except MetricError as err:
        raise error(src, at, str(err)) from None


def _group_metric(src: Source, at: tuple, raw: Any, claim: Objective) -> Objective:
    """A group's own metric: one the claim's difference can be taken with (same kind, unit and
    direction as the claim's metric)."""
    own = _metric(src, at, raw)
    a, b = own.metric, claim.metric
    if (a.kind, a.unit, own.maximize) != (b.kind, b.unit, claim.maximize):
        raise error(
            src,
            at,
            f"{own} cannot be compared with the claim's metric {claim}: a group's metric shares "
            "its kind, unit and direction (val_loss_r4 with val_loss, val_ppl_int4 with val_ppl)",
        )
    return own


def _source(src: Source, at: tuple, raw: Any) -> str:
    if not isinstance(raw, dict):
        raise error(
            src, (*at, "source"), "expected {paper: ..., where: ...} (the section or table)"
        )
    only_known(src, (*at, "source"), raw, SOURCE_KEYS)
    return ", ".join(_text(src, (*at, "source", k), raw.get(k)) for k in SOURCE_KEYS)


def _filters(src: Source, at: tuple, raw: Any, empty: bool) -> dict[str, tuple]:
    if not isinstance(raw, dict) or (not raw and not empty):
        raise error(
            src,
            at,
            f"expected a mapping of results columns to values (e.g. {{family: hyperloop}}), got {raw!r}",
        )
    out = {}
    for column, value in raw.items():
        values = value if isinstance(value, list) else [value]
        if not values or any(isinstance(v, (dict, list)) or v is None for v in values):
            raise error(src, (*at, column), f"expected a value or a list of values, got {value!r}")
        out[column] = tuple(values)
    return out
