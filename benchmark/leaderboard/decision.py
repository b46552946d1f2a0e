"""Decision accuracy over a budget ladder: does the order of two candidates at a small budget hold
at a larger one?

DataDecide (Magnusson et al. 2025, arXiv 2504.11393) scores a small-scale experiment by its
decision accuracy: the share of pairs of candidates (there, data recipes) whose ranking at the
small scale agrees with their ranking at the target scale. Here a candidate across rungs is a
*recipe*: the point the search sampled without its budget (the `axes` column less what the
budget solver adds, export.DERIVED), so the same family and shape axes solved at 500K and at 2M
are one recipe. Each rung is compared with the next one and with the top rung.

Each pair's difference (a - b, a recipe's seeds averaged) has a 95% t interval at both rungs,
paired by seed where both hold the same seeds, Welch's otherwise (stats.differences). A pair whose
interval includes 0 at either rung is *within noise*: its order at one rung or the other is not
settled by these seeds, so the share is also given over the pairs beyond noise (both intervals
exclude 0). With one seed there is no interval, and a pair is neither.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace

import numpy as np
import orjson
import pandas as pd

from benchmark.leaderboard import stats
from benchmark.leaderboard.board import KEY, Board
from benchmark.leaderboard.export import DERIVED
from benchmark.leaderboard.formats import Column, Table
from benchmark.leaderboard.objectives import Objective
from benchmark.leaderboard.tables import MISSING, WITH_SE, count

DEFAULT = "val_loss"  # the metric when the board ranks by no quality objective
ALL = "all"  # the summary row over every family pair
_TOKENS = ("tokens_trained", "budget_count")  # with the params_* columns: tokens per parameter
# The per-pair table lists at most this many pairs (flips first): a search of hundreds of
# recipes per rung has tens of thousands of pairs, which the JSON holds in full.
SHOWN = 300
SOURCE = "DataDecide (Magnusson et al. 2025, arXiv 2504.11393)"


@dataclass(frozen=True, kw_only=True)
class Decision:
    metric: Objective
    pairs: pd.DataFrame  # one row per (study, from, to, pair of recipes): PAIR_COLUMNS
    summary: pd.DataFrame  # one row per (study, from, to, family pair, and ALL): SUMMARY_COLUMNS
    notes: tuple[str, ...] = ()


PAIR_COLUMNS = [
    "study",
    "from",
    "to",
    "to_top",
    "a",
    "b",
    "family_a",
    "family_b",
    "families",
    "diff_from",
    "lo_from",
    "hi_from",
    "paired_from",
    "diff_to",
    "lo_to",
    "hi_to",
    "paired_to",
    "held",
    "within_noise",
    "beyond_noise",
]
SUMMARY_COLUMNS = [
    "study",
    "from",
    "to",
    "to_top",
    "families",
    "pairs",
    "held",
    "share",
    "within_noise",
    "no_interval",
    "beyond_noise",
    "held_beyond_noise",
    "share_beyond_noise",
    "tokens_per_param_from",
    "tokens_per_param_to",
]


def chosen_metric(board: Board) -> Objective:
    """The first quality objective the studies declared or the user gave (--y, --objectives),
    else val_loss (the scaling fits' metric), not the default board's perplexity."""
    chosen = () if board.defaulted else board.objectives
    return next((o for o in chosen if o.metric.kind == "quality"), Objective.parse(DEFAULT))


def measure(board: Board, metric: Objective | None = None) -> Decision:
    """Every study of the board with two or more budgets: each rung against the next and the top."""
    metric = metric or chosen_metric(board)
    empty = Decision(
        metric=metric,
        pairs=pd.DataFrame(columns=PAIR_COLUMNS),
        summary=pd.DataFrame(columns=SUMMARY_COLUMNS),
    )
    t = board.trials
    if metric.column not in t:
        return replace(empty, notes=(f"no decision accuracy: the results have no {metric.column}",))
    usable = (t["status"] == "ok").to_numpy() & np.isfinite(t[metric.column].to_numpy(float))
    # The columns first: the trials hold every column of every row (as in scaling.fit).
    cols = [
        *KEY,
        "family",
        "structure",
        "variant",
        *(c for c in ("axes", "seed") if c in t),
        metric.column,
        *(c for c in t if c in _TOKENS or c.startswith("params_")),
    ]
    rows = t[cols][usable].merge(board.candidates[[*KEY, "band"]], on=KEY)
    rows = rows[rows.groupby("study", sort=False)["band"].transform("nunique") >= 2]
    if rows.empty:  # the usual study has one budget: nothing to say
        return empty
    rows = rows.assign(
        recipe=_recipes(rows), seed=_seeds(rows), tokens_per_param=_tokens_per_param(rows)
    )
    pairs, notes = [], []
    for study, ours in rows.groupby("study", sort=False):
        found, said = _study(study, ours, metric)
        pairs += found
        notes += said
    frame = pd.concat(pairs, ignore_index=True) if pairs else empty.pairs
    # The data each rung saw per counted parameter: a ladder that holds the tokens fixed gives its
    # larger models less data per parameter, and its orders then mix model size with data regime.
    per_rung = rows.groupby(["study", "band"])["tokens_per_param"].median()
    return Decision(
        metric=metric, pairs=frame, summary=_summary(frame, per_rung), notes=tuple(notes)
    )


def _recipes(rows: pd.DataFrame) -> pd.Series:
    """Each row's recipe as sorted-key JSON: its sampled axes less the budget and what the solver
    derived from it; rows without `axes` (hand-made), their family, structure and variant. Each
    distinct value is encoded once: a search holds 100,000 rows."""
    axes = rows["axes"] if "axes" in rows else pd.Series(None, index=rows.index, dtype=object)
    codes, raw = pd.factorize(axes)
    keys = [
        json.dumps({k: v for k, v in json.loads(a).items() if k not in DERIVED}, sort_keys=True)
        for a in raw
    ]
    recipe = pd.Series(np.append(np.array(keys, dtype=object), None)[codes], index=rows.index)
    missing = recipe.isna().to_numpy()
    if missing.any():
        cols = ["family", "structure", "variant"]
        part = rows.loc[missing, cols].astype(object)
        part = part.where(part.notna(), None)
        codes, described = pd.factorize(
            pd.Series(list(zip(*(part[c] for c in cols))), dtype=object)
        )
        keys = np.array([json.dumps(dict(zip(cols, d))) for d in described], dtype=object)
        recipe[missing] = keys[codes]
    return recipe


def _tokens_per_param(rows: pd.DataFrame) -> pd.Series:
    """Tokens trained over the parameters the row's study counts (`budget_count`; params_total
    where the row names no count or the count has no column): NaN without tokens_trained."""
    if "tokens_trained" not in rows:
        return pd.Series(np.nan, index=rows.index)
    total = rows["params_total"].astype(float) if "params_total" in rows else np.nan
    counted = pd.Series(total, index=rows.index, dtype=float)
    if "budget_count" in rows:
        for rule, group in rows.groupby("budget_count").groups.items():
            column = f"params_{rule}"
            if column in rows:
                counted[group] = rows.loc[group, column].astype(float)
    return rows["tokens_trained"].astype(float) / counted.where(counted > 0)


def _seeds(rows: pd.DataFrame) -> pd.Series:
    """The seed of each row; a row without one is its own sample (negative ids never pair)."""
    seed = rows["seed"] if "seed" in rows else pd.Series(np.nan, index=rows.index)
    own = pd.Series(-1.0 - np.arange(len(rows)), index=rows.index)
    return seed.astype(float).fillna(own)


def _study(
    study: str, rows: pd.DataFrame, metric: Objective
) -> tuple[list[pd.DataFrame], list[str]]:
    """The pairs of every transition of one study's ladder, and notes on recipes left out."""
    notes = []
    # A recipe that is several candidates at one rung (hand-made rows told apart by no axes)
    # cannot be followed up the ladder: it is left out there.
    several = rows.groupby(["band", "recipe"])["candidate"].nunique()
    ambiguous = several[several > 1]
    if len(ambiguous):
        rows = rows[~rows.set_index(["band", "recipe"]).index.isin(ambiguous.index)]
        notes.append(
            f"decision accuracy for {study}: {len(ambiguous)} time(s) a recipe is several candidates at "
            f"one budget, left out there (rows without `axes` are told apart by family, structure and "
            f"variant only)"
        )
    # (band, recipe) x seed: each seed's value, repeats of a seed averaged.
    values = rows.pivot_table(
        index=["band", "recipe"], columns="seed", values=metric.column, aggfunc="mean"
    )
    families = rows.groupby("recipe")["family"].first()
    labels = _labels(families.index.tolist())
    rungs = sorted(values.index.get_level_values("band").unique())
    # Each rung to the next, and to the top.
    steps = sorted([*zip(rungs, rungs[1:]), *((lo, rungs[-1]) for lo in rungs[:-2])])
    found, lacking = [], []
    for lo, hi in steps:
        common = sorted(
            set(values.loc[lo].index) & set(values.loc[hi].index), key=lambda r: labels[r]
        )
        if len(common) < 2:
            lacking.append(f"{count(lo)} → {count(hi)}")
            continue
        found.append(
            _pairs(
                study,
                lo,
                hi,
                hi == rungs[-1],
                values.loc[lo].loc[common].to_numpy(float),
                values.loc[hi].loc[common].to_numpy(float),
                [labels[r] for r in common],
                families.loc[common].astype(str).tolist(),
            )
        )
    if lacking or len(rungs) < 2:
        where = f"at both budgets of {', '.join(lacking)}" if lacking else "at two budgets"
        notes.append(f"decision accuracy for {study}: no two recipes {where}")
    return found, notes


def _labels(recipes: list[str]) -> dict[str, str]:
    """A short name per recipe: its family, then the axes whose values differ between the study's
    recipes (`looped shape.head_dim=32`)."""
    parsed = {r: json.loads(r) for r in recipes}
    keys = dict.fromkeys(k for p in parsed.values() for k in p)
    varying = [
        k
        for k in keys
        if k != "family" and len({json.dumps(p.get(k)) for p in parsed.values()}) > 1
    ]
    return {
        r: " ".join([str(p.get("family") or "?"), *(f"{k}={p.get(k)}" for k in varying)])
        for r, p in parsed.items()
    }


def _pairs(
    study: str,
    lo: float,
    hi: float,
    to_top: bool,
    small: np.ndarray,
    large: np.ndarray,
    labels: list[str],
    families: list[str],
) -> pd.DataFrame:
    """Every pair (i < j) of the recipes whose seeds' values at two rungs are `small` and `large`,
    (recipes, seeds) NaN-padded on one seed axis."""
    i, j = np.triu_indices(len(labels), k=1)
    frame = {
        "study": study,
        "from": lo,
        "to": hi,
        "to_top": to_top,
        "a": np.array(labels, dtype=object)[i],
        "b": np.array(labels, dtype=object)[j],
        "family_a": np.array(families, dtype=object)[i],
        "family_b": np.array(families, dtype=object)[j],
    }
    within = np.zeros(len(i), dtype=bool)
    clear = np.ones(len(i), dtype=bool)
    for at, values in (("from", small), ("to", large)):
        est, se, df, same = stats.differences(values[i], values[j])
        low, high = stats.interval(est, se, df)
        frame.update({f"diff_{at}": est, f"lo_{at}": low, f"hi_{at}": high, f"paired_{at}": same})
        within |= (low <= 0) & (high >= 0)  # NaN (one seed) compares False: not known
        clear &= np.isfinite(low) & ((low > 0) | (high < 0))
    frame = pd.DataFrame(frame)
    # The order holds when a - b has one sign at both rungs (whichever way is better).
    frame["held"] = np.sign(frame["diff_from"]) == np.sign(frame["diff_to"])
    frame["within_noise"], frame["beyond_noise"] = within, clear
    frame["families"] = [" vs ".join(sorted(f)) for f in zip(frame["family_a"], frame["family_b"])]
    return frame[PAIR_COLUMNS]


def _summary(pairs: pd.DataFrame, tokens_per_param: pd.Series) -> pd.DataFrame:
    """Per transition: the counts and shares over every pair, then over each family pair, with
    each rung's tokens per parameter ((study, band) -> median)."""
    if pairs.empty:
        return pd.DataFrame(columns=SUMMARY_COLUMNS)
    key = ["study", "from", "to", "to_top"]
    scoped = pd.concat([pairs.assign(families=ALL), pairs])
    out = (
        scoped.assign(
            held_beyond_noise=scoped["held"] & scoped["beyond_noise"],
            no_interval=~scoped["within_noise"] & ~scoped["beyond_noise"],
        )
        .groupby([*key, "families"], sort=False)
        .agg(
            pairs=("held", "size"),
            held=("held", "sum"),
            within_noise=("within_noise", "sum"),
            no_interval=("no_interval", "sum"),
            beyond_noise=("beyond_noise", "sum"),
            held_beyond_noise=("held_beyond_noise", "sum"),
        )
        .reset_index()
    )
    out["share"] = out["held"] / out["pairs"]
    out["share_beyond_noise"] = out["held_beyond_noise"] / out["beyond_noise"].where(
        out["beyond_noise"] > 0
    )
    for at in ("from", "to"):
        out[f"tokens_per_param_{at}"] = [
            tokens_per_param.get((s, b), math.nan) for s, b in zip(out["study"], out[at])
        ]
    # `all` first in each transition, then the family pairs in name order.
    out = out.assign(_all=out["families"] != ALL).sort_values(
        [*key, "_all", "families"], kind="stable"
    )
    return out[SUMMARY_COLUMNS].reset_index(drop=True)


# --- tables and JSON ------------------------------------------------------------------------------


def _rungs(frame: pd.DataFrame) -> list[str]:
    return [
        f"{count(a)} → {count(b)}" + (" (top)" if top else "")
        for a, b, top in zip(frame["from"], frame["to"], frame["to_top"])
    ]


def _share(held: int, n: int) -> str:
    return f"{held / n:.0%} ({held} of {n})" if n else MISSING


def tables(decision: Decision) -> tuple[Table, Table] | None:
    """The summary (per transition: all pairs, then each family pair) and the pairs themselves;
    None without a ladder."""
    s = decision.summary
    if s.empty:
        return None
    several = s["study"].nunique() > 1
    study = [Column(header="Study", cells=s["study"].tolist())] * several
    tokens = _tokens_column(s)
    summary = Table(
        title=f"Decision accuracy ({decision.metric})",
        columns=[
            *study,
            Column(header="Budgets", cells=_rungs(s)),
            *tokens,
            Column(header="Families", cells=s["families"].tolist()),
            _ints("Pairs", s["pairs"]),
            Column(
                header="Order held",
                cells=[_share(h, n) for h, n in zip(s["held"], s["pairs"])],
                keys=s["share"].to_numpy(float),
            ),
            _ints("Within noise", s["within_noise"]),
            Column(
                header="Held beyond noise",
                cells=[_share(h, n) for h, n in zip(s["held_beyond_noise"], s["beyond_noise"])],
                keys=s["share_beyond_noise"].to_numpy(float),
            ),
            *([_ints("No interval (1 seed)", s["no_interval"])] if s["no_interval"].any() else []),
        ],
        caption=(
            f"{SOURCE}: the share of pairs of recipes (a search point without its budget) whose order by "
            f"{decision.metric.column} at the smaller budget holds at the larger; within noise: the 95% interval of "
            f"the pair's difference (paired by seed, else Welch) includes 0 at either budget; beyond noise: "
            f"both intervals exclude 0"
            + (
                "; tokens per parameter: the tokens each budget's models trained on over the parameters their "
                "study counts (the median over its rows)"
                if tokens
                else ""
            )
        ),
    )
    return summary, _pair_table(decision, several)


def _tokens_column(s: pd.DataFrame) -> list[Column]:
    """`0.8 → 0.4` per transition; no column where no row recorded its tokens."""
    lo, hi = (s[f"tokens_per_param_{at}"].to_numpy(float) for at in ("from", "to"))
    if not (np.isfinite(lo).any() or np.isfinite(hi).any()):
        return []
    shown = [
        " → ".join(f"{v:.3g}" if math.isfinite(v) else MISSING for v in pair)
        for pair in zip(lo, hi)
    ]
    return [Column(header="Tokens per parameter", cells=shown)]


def _ints(header: str, values: pd.Series) -> Column:
    return Column(header=header, cells=[str(int(v)) for v in values], keys=values.to_numpy(float))


def _pair_table(decision: Decision, several: bool) -> Table:
    p = decision.pairs.assign(_flip=~decision.pairs["held"])
    shown = (
        p.sort_values(["_flip"], ascending=False, kind="stable").head(SHOWN)
        if len(p) > SHOWN
        else p
    )
    digits = WITH_SE.get(decision.metric.column, 4)
    noise = np.where(
        shown["within_noise"],
        "within noise",
        np.where(shown["beyond_noise"], "beyond noise", "no interval"),
    )
    return Table(
        title="Decision accuracy by pair"
        + (f" ({len(shown)} of {len(p)}, flips first)" if len(shown) < len(p) else ""),
        columns=[
            *([Column(header="Study", cells=shown["study"].tolist())] if several else []),
            Column(header="Budgets", cells=_rungs(shown)),
            Column(header="A", cells=shown["a"].tolist()),
            Column(header="B", cells=shown["b"].tolist()),
            _difference(shown, "from", "A − B, smaller", digits),
            _difference(shown, "to", "A − B, larger", digits),
            Column(header="Order", cells=["held" if h else "flipped" for h in shown["held"]]),
            Column(header="Noise", cells=noise.tolist()),
        ],
        caption=f"{decision.metric.column}, mean over seeds [95% interval]; "
        f"{'lower' if not decision.metric.maximize else 'higher'} is better",
    )


def _difference(frame: pd.DataFrame, at: str, header: str, digits: int) -> Column:
    cells = []
    for d, lo, hi in zip(frame[f"diff_{at}"], frame[f"lo_{at}"], frame[f"hi_{at}"]):
        shown = f"{d:+.{digits}f}".replace("-", "−")
        cells.append(
            shown
            + (
                f" [{lo:.{digits}f}, {hi:.{digits}f}]".replace("-", "−")
                if math.isfinite(lo)
                else ""
            )
        )
    return Column(header=header, cells=cells, keys=frame[f"diff_{at}"].to_numpy(float))


def to_json(decision: Decision) -> dict:
    """Every number behind the tables, every pair (the tables may show fewer), NaN as null."""

    def records(frame: pd.DataFrame) -> list[dict]:
        # pandas writes NaN as null and numpy scalars as plain numbers, in C: a grid of hundreds of
        # recipes per rung has 100,000 pairs (converted value by value, they dominate the run).
        return orjson.loads(frame.to_json(orient="records", double_precision=15))

    return {
        "metric": decision.metric.column,
        "direction": decision.metric.direction,
        "level": stats.LEVEL,
        "source": SOURCE,
        "summary": records(decision.summary),
        "pairs": records(decision.pairs),
        "notes": list(decision.notes),
    }
