"""Runs that spike or fall behind: a rule declared in the claims file, the runs it marks, and each
verdict again without them. Marked runs are never dropped silently: the verdicts keep them, and
say beside each how many each arm has and whether the verdict holds without them.

    instability:          # the claims file's top level; every key optional (DEFAULTS)
      spike: 1.0          # nats: the training loss rose this far above its best so far (loss_spike)
      laggard: 5          # robust s.d.s: the final loss is this far behind its candidate's median ...
      laggard_min: 0.05   # ... and at least this many nats behind it

A laggard is judged among the seeds of its own candidate (the same architecture at the same
setting), by the median and the median absolute deviation (MAD x 1.4826, the normal's s.d.), which
one bad seed cannot drag as it drags a mean and an s.d.; `laggard_min` keeps seeds that agree to
the third decimal from marking a seed that differs in the fourth. A spike is read off every step's
loss (the row's loss_spike; curve.largest_rise): in the first reference study a run that fell
0.3 nats behind had spiked from 6.38 to 10.10 at step 22 (fair-comparisons.md, §2; Wortsman et
al. 2023, arXiv 2309.14322, §3)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import pandas as pd

from benchmark.leaderboard.claims.check import evaluate
from benchmark.leaderboard.claims.file import error, only_known
from benchmark.leaderboard.formats import Column, Table
from benchmark.leaderboard.stats import DEFAULT_ADJUSTMENT
from benchmark.leaderboard.tuning import SPIKE
from benchmark.space import select
from benchmark.store import PHASES

KEY = "instability"  # the claims file's top-level key
TUNE = PHASES[0]  # a row's phase: a tuning run (space/tuning.py), which no claim or rank reads
MAD_SD = 1.4826  # the normal's s.d. per median absolute deviation


@dataclass(frozen=True, kw_only=True)
class Rule:
    spike: float = SPIKE
    laggard: float = 5.0
    laggard_min: float = 0.05
    metric: str = "val_loss"  # the final loss a laggard is judged by

    def describe(self) -> str:
        return (
            f"a training loss that rose more than {self.spike:g} nats above its best so far (spike), or a final "
            f"{self.metric} more than {self.laggard:g} robust s.d. and {self.laggard_min:g} nats behind its "
            "candidate's median over seeds (laggard)"
        )


DEFAULTS = {f.name: f.default for f in fields(Rule)}


def rule_of(claims) -> Rule:
    """The claims file's `instability:` (ClaimsError, located, for a bad key or value), else DEFAULTS."""
    src = claims.origin
    raw = (src.doc.data or {}).get(KEY) if src.doc is not None else None
    if raw is None:
        return Rule()
    if not isinstance(raw, dict):
        raise error(src, (KEY,), f"expected a mapping like {{spike: 1.0, laggard: 5}}, got {raw!r}")
    only_known(src, (KEY,), raw, tuple(DEFAULTS))
    values = {}
    for key, value in raw.items():
        if key == "metric":
            values[key] = str(value)
        elif isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
            raise error(src, (KEY, key), f"expected a number >= 0, got {value!r}")
        else:
            values[key] = float(value)
    return Rule(**values)


def final(trials: pd.DataFrame) -> pd.DataFrame:
    """The rows claims and ranks read: every row but the tuning runs."""
    if "phase" not in trials:
        return trials
    return trials[(trials["phase"] != TUNE).to_numpy()]


def mark(trials: pd.DataFrame, rule: Rule) -> pd.Series:
    """Why each ok row is marked ("" when it is not): `spike 3.72` and/or `laggard +0.31 (z 12)`,
    indexed as `trials`. Laggards are judged per (study, candidate) among ok rows."""
    why = pd.Series("", index=trials.index, dtype=object)
    ok = (trials["status"] == "ok").to_numpy()
    if "loss_spike" in trials:
        rise = trials["loss_spike"].to_numpy(float)
        spiked = ok & (rise > rule.spike)
        why[spiked] = [f"spike {r:.2f}" for r in rise[spiked]]
    if rule.metric not in trials:
        return why
    value = trials[rule.metric].to_numpy(float)
    usable = ok & np.isfinite(value)
    rows = trials[usable]
    keys = [k for k in ("study", "candidate") if k in rows] or ["study"]
    median = rows.groupby(keys)[rule.metric].transform("median")
    mad = (rows[rule.metric] - median).abs().groupby([rows[k] for k in keys]).transform(
        "median"
    ) * MAD_SD
    behind = (rows[rule.metric] - median).to_numpy(float)
    z = np.divide(
        behind, mad.to_numpy(float), out=np.full(len(rows), np.inf), where=mad.to_numpy(float) > 0
    )
    lagging = (behind > rule.laggard_min) & (z > rule.laggard)
    for index, b, score in zip(rows.index[lagging], behind[lagging], z[lagging]):
        z_text = f"z {score:.0f}" if math.isfinite(score) else "the other seeds agree exactly"
        why[index] = ", ".join(filter(None, [why[index], f"laggard +{b:.2f} ({z_text})"]))
    return why


@dataclass(frozen=True, kw_only=True)
class Stability:
    """One claim in one study: its marked runs per arm, and its verdict without them."""

    claim: str
    study: str
    marked: Mapping[str, list[str]]  # arm -> "t0003-s0: spike 3.72" for each marked run
    runs: Mapping[str, int]  # arm -> ok runs
    verdict: str
    without: str  # the verdict with the marked runs left out


def assess(claims, results: list, trials: pd.DataFrame) -> tuple[Rule, list[Stability], pd.Series]:
    """The rule, each result's marked runs and its verdict without them (the claims checked again
    on the unmarked rows, adjusted as the verdicts were, over the same family), and why each row of `trials` is marked."""
    rule = rule_of(claims)
    trials = final(trials)
    why = mark(trials, rule)
    method = next(
        (p.adjustment for r in results for p in r.pairs), DEFAULT_ADJUSTMENT
    )  # the verdicts' own rule
    again = (
        {
            (r.claim.index, r.study): r
            for r in evaluate(claims, trials[(why == "").to_numpy()], method)
        }
        if (why != "").any()
        else {}
    )
    out = []
    for r in results:
        c = r.claim
        rows = trials[(trials["study"] == r.study).to_numpy()]
        rows = rows[select.mask(rows, c.where)] if len(rows) else rows
        marked, runs = {}, {}
        for name in c.order:
            arm = rows[select.mask(rows, c.groups[name])] if len(rows) else rows
            arm = arm[(arm["status"] == "ok").to_numpy()]
            runs[name] = len(arm)
            marked[name] = [f"{t}: {why[i]}" for i, t in zip(arm.index, arm["trial_id"]) if why[i]]
        other = again.get((c.index, r.study))
        out.append(
            Stability(
                claim=c.claim,
                study=r.study,
                marked=marked,
                runs=runs,
                verdict=r.verdict,
                without=other.verdict if other is not None else r.verdict,
            )
        )
    return rule, out, why


def table(rule: Rule, assessed: list[Stability]) -> Table:
    heads = {
        "claim": "Claim",
        "study": "Study",
        "marked": "Marked runs per arm",
        "verdict": "Verdict",
        "without": "Without marked runs",
        "which": "Marked runs",
    }
    cells: dict[str, list[str]] = {k: [] for k in heads}
    for s in assessed:
        any_marked = any(s.marked.values())
        row = {
            "claim": s.claim,
            "study": s.study,
            "marked": ", ".join(f"{arm} {len(m)} of {s.runs[arm]}" for arm, m in s.marked.items()),
            "verdict": s.verdict,
            "without": (s.without + (" (holds)" if s.without == s.verdict else " (changes)"))
            if any_marked
            else "— (none marked)",
            "which": "; ".join(x for m in s.marked.values() for x in m) or "—",
        }
        for k, v in row.items():
            cells[k].append(v)
    return Table(
        title="Unstable runs",
        columns=[Column(header=h, cells=cells[k]) for k, h in heads.items()],
        caption=f"marked: {rule.describe()} (the claims file's `{KEY}:`); marked runs stay in every verdict "
        "above; 'without marked runs' checks each claim again with them left out",
    )


def to_json(rule: Rule, assessed: list[Stability]) -> dict[str, Any]:
    return {
        "rule": {f.name: getattr(rule, f.name) for f in fields(rule)},
        "claims": [
            {
                "claim": s.claim,
                "study": s.study,
                "verdict": s.verdict,
                "without": s.without,
                "marked": dict(s.marked),
                "runs": dict(s.runs),
            }
            for s in assessed
        ],
    }
