"""A tuned study's tuning runs on the board (space/tuning.py): kept apart from the rows that are
ranked and judged, and read for what they say of each candidate: the setting it chose, the runs
it had to choose it (the tuning budget: the grid's points for every candidate, and the points its
own edge choice added past them, `tune.extend`), and its learning-rate sensitivity over its points.

Learning-rate sensitivity (Wortsman et al. 2023, arXiv 2309.14322, §3.2, eq. 1): the mean over
the grid's points of how far the loss at that point is from the best point's, each point's loss
(its mean over the tuning seeds) capped at the loss of a uniform guess, ln(vocabulary), so that a
point that diverged counts as bad as a model that learned nothing and no worse. Small: the
architecture trains well over the whole grid; large: it needs its setting found."""

from __future__ import annotations

import math

import numpy as np
import orjson
import pandas as pd

from benchmark.leaderboard.formats import Column, Table
from benchmark.space.tuning import NOISE, Tune
from benchmark.store import PHASES

TUNE = PHASES[0]  # a tuning run's phase

COLUMNS = (
    "lr_sensitivity",
    "tuning_runs",
    "tuning_points",
    "tuned",
    "tuning_edge",
    "tuning_seeds",
    "tuning_margin",
    "tuning_tied",
    "tuning_metric",
    "tuning_spiked",
)
METRIC = "val_loss"
# The instability rule's spike (claims/stability.py reads it as its default): a tuning run whose
# training loss rose this many nats above its best so far is marked in the Tuning table.
SPIKE = 1.0


def _number(v) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _label(v) -> str:
    return f"{v:g}" if _number(v) else str(v)


def setting_label(setting: dict) -> str:
    """A tuned setting as the reports print it: "lr 0.006, warmup 61" (the rows hold it as JSON)."""
    return ", ".join(f"{k} {_label(v)}" for k, v in setting.items())


def settings_label(tuned) -> str:
    """A candidate's `tuned` cell (its rows' settings as JSON, " | " between several) as text."""
    if not isinstance(tuned, str):
        return "—"
    try:
        return " | ".join(setting_label(orjson.loads(t)) for t in tuned.split(" | "))
    except (orjson.JSONDecodeError, AttributeError):
        return tuned


def split(trials: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(the rows ranked and judged, the tuning runs)."""
    if "phase" not in trials:
        return trials, trials.iloc[:0]
    tuning = (trials["phase"] == TUNE).to_numpy()
    return trials[~tuning].reset_index(drop=True), trials[tuning].reset_index(drop=True)


def _canonical(spec) -> str | None:
    try:
        return orjson.dumps(orjson.loads(spec), option=orjson.OPT_SORT_KEYS).decode()
    except (TypeError, orjson.JSONDecodeError):
        return None


def per_point(runs: pd.DataFrame, vocab: int | None) -> pd.Series:
    """One candidate's tuning runs -> each grid point's loss (the `tuned` JSON -> the mean over
    the tuning seeds), a run that diverged or failed counted at ln(vocabulary)."""
    cap = math.log(vocab) if vocab else math.inf
    ok = (runs["status"] == "ok") & np.isfinite(runs[METRIC].to_numpy(float))
    return runs.assign(_v=runs[METRIC].where(ok, cap)).groupby("tuned")["_v"].mean().clip(upper=cap)


def sensitivity(points: pd.Series) -> float:
    """One candidate's per-point losses (per_point) -> its learning-rate sensitivity (nats)."""
    return float((points - points.min()).mean()) if len(points) else math.nan


def grid_of(tuning: pd.DataFrame) -> dict[str, list[float]]:
    """A study's tuning runs -> each numeric key of its grid and the values it took, sorted."""
    values: dict[str, set[float]] = {}
    for point in tuning["tuned"].dropna().unique():
        for key, v in (orjson.loads(point) or {}).items():
            if _number(v):
                values.setdefault(key, set()).add(float(v))
    return {k: sorted(v) for k, v in values.items()}


def grids(tuning: pd.DataFrame, declared=None) -> dict[str, dict[str, str]]:
    """Each tuned study's grid, key -> its values as the reports print them ("0.0015, 0.003"): its
    declaration's `tune.grid` (_study.json), else the points its tuning runs took (a study read
    without its folder)."""
    found = (
        {study: grid_of(runs) for study, runs in tuning.groupby("study", sort=False)}
        if not tuning.empty
        else {}
    )
    for study, said in (declared or {}).items():
        grid = ((said or {}).get("tune") or {}).get("grid")
        if isinstance(grid, dict) and grid:
            found[study] = {
                k: sorted(v) if all(map(_number, v)) else sorted(v, key=str)
                for k, v in grid.items()
            }
    return {
        study: {k: ", ".join(map(_label, values)) for k, values in grid.items()}
        for study, grid in found.items()
    }


def edge(points: pd.Series, grid: dict[str, list[float]]) -> str:
    """Where a candidate's best point (of its per-point losses: per_point) lies on an edge of its
    grid: per key, "lr top, 0.062 below 3e-3" (the grid's largest value, and by how much it beat
    the next one along that key, the other keys held), "" where it lies inside on every key of 3
    values or more. An arm chosen at an edge may have its best beyond the grid: its final seeds
    are then tuned less well than an arm whose best lies inside, a bias against it in every
    comparison it is in."""
    if points.empty:
        return ""
    at = {t: orjson.loads(t) for t in points.index}
    best = points.idxmin()
    said = []
    for key, values in grid.items():
        if len(values) < 3 or key not in at[best]:
            continue  # a grid of 2 values along a key has no inside to compare with
        v = float(at[best][key])
        if v not in (values[0], values[-1]):
            continue
        side, nxt = ("top", values[-2]) if v == values[-1] else ("bottom", values[1])
        near = next((t for t, p in at.items() if p == {**at[best], key: nxt}), None)
        by = f", {points[near] - points[best]:.3f} below {nxt:g}" if near is not None else ""
        said.append(f"{key} {side}{by}")
    return "; ".join(said)


def json_field(text, key: str):
    try:
        return orjson.loads(text).get(key)
    except (TypeError, AttributeError, orjson.JSONDecodeError):
        return None


def decision(runs: pd.DataFrame, declared: dict | None) -> dict:
    """How one candidate's choice was made, from its tuning runs and its study's `tune:` (as
    _study.json declares it; the search's own rule, space/tuning.Tune.decide): the tuning seeds,
    the metric, the margin, the points tied with the best, and the runs the instability rule's
    spike marks."""
    said = dict(declared or {})
    metric = said.get("metric") or METRIC
    seeds = sorted(int(s) for s in runs["seed"].dropna().unique()) if "seed" in runs else []
    out = {
        "tuning_seeds": len(seeds),
        "tuning_metric": metric,
        "tuning_spiked": int((runs.get("loss_spike", pd.Series(dtype=float)) > SPIKE).sum()),
        "tuning_margin": math.nan,
        "tuning_tied": math.nan,
    }
    if not said.get("grid") or metric not in runs or not seeds:
        return out
    tune = Tune(
        grid=tuple((k, tuple(v)) for k, v in said["grid"].items()),
        seeds=tuple(said.get("seeds") or seeds),
        metric=metric,
        direction=said.get("direction") or "min",
        margin=said.get("margin", NOISE),
        ties=said.get("ties", "middle"),
    )
    ok = (runs["status"] == "ok").to_numpy()
    values: dict[str, dict[int, float]] = {}
    for t, s, v, good in zip(runs["tuned"], runs["seed"], runs[metric].astype(float), ok):
        values.setdefault(t, {})[int(s)] = float(v) if good else math.nan
    _, margin, tied = tune.decide(
        {t: [v.get(s, math.nan) for s in tune.seeds] for t, v in values.items()}
    )
    return {**out, "tuning_margin": margin, "tuning_tied": len(tied)}


def with_tuning(
    cands: pd.DataFrame, trials: pd.DataFrame, tuning: pd.DataFrame, declared=None
) -> pd.DataFrame:
    """The candidates with COLUMNS where their study tuned them (else the columns are absent);
    `declared`: each study's declaration, whose `tune:` says how the choice was made."""
    if tuning.empty or "tuned" not in trials:
        return cands
    runs = tuning.assign(spec=tuning["spec"].map(_canonical))
    per_candidate = []
    for (study, spec), group in runs.groupby(["study", "spec"], sort=False):
        points = per_point(group, json_field(spec, "vocab_size"))
        said = ((declared or {}).get(study) or {}).get("tune")
        per_candidate.append(
            {
                "study": study,
                "spec": spec,
                "tuning_runs": len(group),
                # its own points: an edge choice extends the grid for that arm alone
                # (space/tuning.py), so arms of one study may have trained different points
                "tuning_points": len(points),
                "lr_sensitivity": sensitivity(points),
                "tuning_edge": edge(points, grid_of(group)),
                **decision(group, said),
            }
        )
    found = pd.DataFrame(per_candidate).set_index(["study", "spec"])
    chosen = (
        trials.dropna(subset=["tuned"])
        .groupby(["study", "candidate"])["tuned"]
        .agg(lambda t: " | ".join(sorted(set(t))))
    )
    out = cands.merge(found, left_on=["study", "spec"], right_index=True, how="left")
    return out.merge(
        chosen.rename("tuned"), left_on=["study", "candidate"], right_index=True, how="left"
    )


def table(board) -> Table | None:
    """Each tuned candidate's choice and budget, and its sensitivity; None without tuning runs."""
    c = board.candidates
    if "tuning_runs" not in c or c["tuning_runs"].isna().all():
        return None
    c = c[c["tuning_runs"].notna()]
    # candidates read without their tuning decision (decision()) show none
    unknown = {"tuning_metric": "—", "tuning_seeds": math.nan, "tuning_margin": math.nan}
    c = c.assign(
        **{
            k: v
            for k, v in {**unknown, "tuning_tied": math.nan, "tuning_spiked": math.nan}.items()
            if k not in c
        }
    )
    # the variant tells apart candidates of one family and structure (H_res diagonal / Sinkhorn);
    # the space's name for it, those its variants declare (hourglass FFNs: K4-L12, K2-L12)
    shown = [v for v in ("space_variant", "variant") if v in c and c[v].notna().any()]
    c = c.sort_values(["study", "family", "structure", *shown], kind="stable", na_position="first")
    headers = {"space_variant": "Space variant", "variant": "Variant"}
    cols = [
        Column(header="Study", cells=c["study"].astype(str).tolist()),
        Column(header="Family", cells=c["family"].astype(str).tolist()),
        Column(header="Structure", cells=c["structure"].astype(str).tolist()),
        *(
            Column(header=headers[v], cells=[x if isinstance(x, str) else "—" for x in c[v]])
            for v in shown
        ),
        Column(header="Chosen setting", cells=[settings_label(t) for t in c["tuned"]]),
        Column(
            header="Tuning runs",
            cells=[
                f"{int(n)} ({int(p)} points)" for n, p in zip(c["tuning_runs"], c["tuning_points"])
            ],
        ),
        Column(
            header="LR sensitivity (nats)",
            cells=[
                f"{v:.3f}" if math.isfinite(v) else "—" for v in c["lr_sensitivity"].astype(float)
            ],
            keys=c["lr_sensitivity"].to_numpy(float),
        ),
        Column(
            header="At the grid's edge",
            cells=[e if isinstance(e, str) and e else "—" for e in c["tuning_edge"]],
        ),
        Column(header="Tuned by", cells=[str(m) for m in c["tuning_metric"]]),
        Column(header="Tuning seeds", cells=[_count(n) for n in c["tuning_seeds"]]),
        Column(
            header="Margin (nats)",
            cells=[
                f"{m:.4f}" if math.isfinite(m) else "—" for m in c["tuning_margin"].astype(float)
            ],
        ),
        Column(header="Tied points", cells=[_count(n) for n in c["tuning_tied"]]),
        Column(header="Spiked tuning runs", cells=[_count(n) for n in c["tuning_spiked"]]),
    ]
    return Table(
        title="Tuning",
        columns=cols,
        caption=(
            "space variant: the name the space's `variants:` gives the candidate (its `axes.variant`, "
            "as claims name it); each candidate trained its points on the tuning seeds (its study's `tune:` grid, the same for every "
            "candidate, and the points its own edge choice added past it: `tune.extend`), chose the point best on the mean over them, and trained its final seeds, which "
            "every rank and verdict reads, at that point; LR sensitivity: the mean over its points of each point's "
            "loss above the best point's, a diverged point counted at ln(vocabulary) (Wortsman et al. 2023); at the "
            "grid's edge: the chosen point is the largest (top) or smallest (bottom) value it trained of a key of 3 "
            "values or more, and by how much it beat the next value along that key: the candidate's best may lie "
            "beyond the grid, its final seeds then tuned less well than an arm whose best lies inside; tuned by: the "
            "metric the choice was made on (a claim judged by another metric says so: the claims table); tuning "
            "seeds: the seeds each point trained on; margin: points whose mean lay this close to the best tied "
            "(the study's `tune.margin`: by default the standard error of two points' difference, from the tuning "
            "seeds' spread, a point whose seeds part far more than the others' left out; 0 with one seed), and "
            "tied points: how many, the declared rule (`tune.ties`) choosing "
            f"among them; spiked tuning runs: runs whose training loss rose more than {SPIKE:g} nats above its best "
            "so far (the instability rule's spike)"
        ),
    )


def _count(n) -> str:
    return f"{int(n)}" if n is not None and math.isfinite(float(n)) else "—"
