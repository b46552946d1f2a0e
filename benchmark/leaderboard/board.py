"""The leaderboard's data: trials -> seed-aggregated candidates, budget bands, ranks, frontiers and
hypervolumes. Everything the tables, plots and page show is computed here, once."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import orjson
import pandas as pd

from benchmark.arch import describe
from benchmark.leaderboard import frontier, objectives, tuning
from benchmark.leaderboard.bands import DEFAULT_TOLERANCE, bands, cohorts
from benchmark.leaderboard.loading import LeaderboardError, NoResults
from benchmark.leaderboard.objectives import Objective
from benchmark.store import METRICS

# The registry's results columns; the study-dependent `params_{count}` is one of the two params
# columns, listed on its own.
COLUMNS = tuple(m.column for m in METRICS if "{" not in m.column)
KEY = ["study", "candidate"]


def aggregated(frame: pd.DataFrame) -> list[str]:
    """The registry's numeric columns present in `frame`: what seeds are averaged over."""
    return [c for c in COLUMNS if c in frame and pd.api.types.is_numeric_dtype(frame[c])]


@dataclass(frozen=True, kw_only=True)
class Settings:
    # The primary objectives: frontier flags, ranking (by the last one) and the first plot.
    # None: those the studies declared (objectives.declared), else objectives.DEFAULT.
    objectives: tuple[Objective, ...] | None = None
    ref: tuple[float, ...] | None = None  # hypervolume reference for the primary objectives
    tolerance: float = DEFAULT_TOLERANCE

    def __post_init__(self):
        if self.objectives is not None:
            _check(self.objectives, self.ref)


def _check(objs: tuple[Objective, ...], ref: tuple[float, ...] | None) -> None:
    if len(objs) not in (2, 3):
        raise LeaderboardError(f"need 2 or 3 objectives, got {len(objs)}")
    if ref is not None and len(ref) != len(objs):
        raise LeaderboardError(
            f"--ref has {len(ref)} values for {len(objs)} objectives "
            f"({' vs '.join(map(str, objs))})"
        )


@dataclass(frozen=True, kw_only=True)
class Board:
    settings: Settings
    objectives: tuple[
        Objective, ...
    ]  # the primary objectives: the settings', else declared or default
    trials: pd.DataFrame  # every trial read, any status, with `candidate` and descriptor columns
    candidates: pd.DataFrame  # one row per (study, candidate) with a usable trial, ranked per band
    excluded: pd.DataFrame  # trials kept off every frontier, with a `reason`
    hypervolumes: (
        pd.DataFrame
    )  # objectives, study, family ('all' = whole study), points, hypervolume, reference
    pairs: tuple[tuple[Objective, ...], ...]  # objective sets reported, primary first
    notes: tuple[str, ...] = field(default=())
    defaulted: bool = False  # the objectives are objectives.DEFAULT: none given, none declared
    tuning: pd.DataFrame = field(
        default_factory=pd.DataFrame
    )  # a tuned study's tuning runs (leaderboard/tuning.py)

    @property
    def studies(self) -> list[str]:
        return self.trials["study"].unique().tolist()  # in order of appearance

    @property
    def metric(self) -> Objective:
        return self.objectives[-1]


def build(
    trials: pd.DataFrame,
    settings: Settings = Settings(),
    declared: Mapping[str, dict] | None = None,
    notes: Sequence[str] = (),
) -> Board:
    """`declared`: each study's declaration (loading.read_declarations), whose objectives the board
    takes when the settings name none; None when the trials come from no study folder. `notes`:
    what reading the studies left out (studies.skipped_notes), said first among the board's notes."""
    objs, said, defaulted = _objectives(settings, declared)
    missing = [o.column for o in objs if o.column not in trials]
    if "status" not in trials or missing:
        raise LeaderboardError(f"results lack column(s): {', '.join(missing or ['status'])}")
    trials, tuning_runs = tuning.split(trials)  # tuning runs are neither ranked nor judged
    trials, specs, spec_notes = _with_candidates(trials)
    values = trials[[o.column for o in objs]].to_numpy(dtype=float)
    usable = (trials["status"] == "ok").to_numpy() & np.isfinite(values).all(axis=1)
    if not usable.any():
        statuses = ", ".join(f"{n} {s}" for s, n in trials["status"].value_counts().items())
        raise NoResults(
            f"no results: none of the {len(trials)} trials finished with finite "
            f"{' and '.join(o.column for o in objs)} ({statuses})"
        )
    lean = [
        c for c in trials if c not in ("spec", "val_ppl_by_loops", "error")
    ]  # skip copying long strings
    candidates = _candidates(
        trials.loc[usable, lean].assign(
            cohort=cohorts(trials.loc[usable], tuning.grids(tuning_runs, declared))
        ),
        objs,
        settings.tolerance,
    )
    candidates["spec"] = specs[candidates["candidate"].to_numpy()]
    candidates = tuning.with_tuning(candidates, trials, tuning_runs, declared)
    pairs, skipped = _pairs(candidates, objs, _budget_tolerance(declared, settings.tolerance))
    return Board(
        settings=settings,
        objectives=objs,
        trials=trials,
        candidates=candidates,
        excluded=_excluded(
            trials.loc[~usable, [c for c in trials if c not in ("spec", "val_ppl_by_loops")]], objs
        ),
        hypervolumes=_hypervolumes(candidates, pairs, settings.ref),
        pairs=pairs,
        notes=(*notes, *said, *spec_notes, *skipped),
        defaulted=defaulted,
        tuning=tuning_runs,
    )


def _objectives(
    settings: Settings, declared: Mapping[str, dict] | None
) -> tuple[tuple[Objective, ...], list[str], bool]:
    """The settings' objectives, else the studies' declared ones, else the default; notes; and
    whether it is the default."""
    notes = objectives.counted(declared)[1] if declared else []
    if settings.objectives is not None:
        return settings.objectives, notes, False
    objs, said = objectives.declared(declared) if declared is not None else (None, [])
    _check(objs or objectives.DEFAULT, settings.ref)
    return objs or objectives.DEFAULT, notes + said, objs is None


def _with_candidates(trials: pd.DataFrame) -> tuple[pd.DataFrame, np.ndarray, list[str]]:
    """Adds `candidate` (an integer id: seeds of one architecture share it), `family` when absent,
    and the columns of describe.COLUMNS; returns as well each candidate id's canonical spec."""
    # drop/reset_index return a new frame (copy-on-write: no data copied), so the columns added
    # below never leak into the caller's.
    trials = trials.drop(columns=[c for c in describe.COLUMNS if c in trials]).reset_index(
        drop=True
    )
    if "trial_id" not in trials:
        trials["trial_id"] = trials.index.astype(str)
    if "family" not in trials:
        trials["family"] = None  # filled from the spec below
    if "spec" not in trials:
        trials = trials.assign(
            candidate=np.arange(len(trials)),
            family=trials["family"].fillna("unknown"),
            **{c: None for c in describe.COLUMNS},
        )
        return (
            trials,
            np.full(len(trials), None, dtype=object),
            ["no spec column: seeds are not aggregated"],
        )
    # Each distinct spec string is parsed once; rows pick their values by code (-1: no spec).
    codes, raw = pd.factorize(trials["spec"])
    parsed = [_parse(s) for s in raw]
    ids, specs = _canonical(raw, parsed)
    # Rows without a spec cannot be matched to others: each is its own candidate, numbered after.
    missing = codes < 0
    trials["candidate"] = np.where(
        missing, len(specs) + np.cumsum(missing) - 1, np.append(ids, -1)[codes]
    )
    info = pd.DataFrame([describe.describe(d) for d in parsed] + [dict.fromkeys(describe.COLUMNS)])
    for col in describe.COLUMNS:
        trials[col] = info[col].to_numpy()[codes]  # code -1 takes the appended empty row
    families = np.array([d.get("family") for d in parsed] + [None], dtype=object)[codes]
    trials["family"] = trials["family"].fillna(pd.Series(families)).fillna("unknown")
    return trials, np.append(specs, np.full(missing.sum(), None, dtype=object)), []


def _canonical(raw, parsed: list[dict]) -> tuple[np.ndarray, np.ndarray]:
    """Candidate id of each distinct spec string, and each id's spec as sorted-key JSON: the same
    architecture written with its keys in another order is the same candidate."""
    # orjson: parsing and re-encoding 25,000 specs took a fifth of a large board's build with json.
    canon = pd.Series(
        [
            orjson.dumps(d, option=orjson.OPT_SORT_KEYS).decode() if d else s
            for s, d in zip(raw, parsed)
        ],
        dtype=object,
    )
    ids, specs = pd.factorize(canon)
    return ids, np.asarray(specs, dtype=object)


def _parse(spec: str) -> dict:
    try:
        parsed = orjson.loads(spec)
    except (TypeError, orjson.JSONDecodeError):
        return {}
    return parsed if isinstance(parsed, dict) else {}


def _candidates(ok: pd.DataFrame, objs: tuple[Objective, ...], tolerance: float) -> pd.DataFrame:
    stats = frontier.aggregate_seeds(ok, KEY, aggregated(ok))
    first = ok.drop_duplicates(KEY)
    # the space's own name for a candidate it declares under `variants:` (its `variant` axis,
    # e.g. K4-L12: what claims filter by), which the shape columns alone may not tell apart
    named = first["axes"].map(lambda a: _parse(a).get("variant")) if "axes" in first else None
    first = first[[*KEY, "family", "cohort", *describe.COLUMNS]].assign(space_variant=named)
    cands = first.merge(stats, on=KEY, validate="one_to_one")
    cands["band"] = bands(cands, tolerance)
    metric = objs[-1]
    # ranked among the candidates counted and trained alike (bands.cohorts), within a budget
    cands["rank"] = (
        cands.groupby(["band", "cohort"], dropna=False)[metric.column]
        .rank(method="min", ascending=not metric.maximize)
        .astype(int)
    )
    cands["front"] = frontier.frontier_mask(cands, objs, by=["study"])
    cands["family_front"] = frontier.frontier_mask(cands, objs, by=["study", "family"])
    return cands.sort_values(["band", "cohort", "rank"], kind="stable").reset_index(drop=True)


def _excluded(bad: pd.DataFrame, objs) -> pd.DataFrame:
    reason = bad["status"].astype(str)
    for o in objs:
        lacking = (bad["status"] == "ok") & ~np.isfinite(bad[o.column].to_numpy(dtype=float))
        reason = reason.mask(lacking, f"ok, but {o.column} is not finite")
    error = bad["error"] if "error" in bad else pd.Series("", index=bad.index)
    cols = [c for c in ("study", "trial_id", "family", "structure", "seed") if c in bad]
    return bad[cols].assign(
        reason=reason, error=error.fillna("").astype(str).str.split("\n").str[0]
    )


def _pairs(cands: pd.DataFrame, primary, tolerance: float) -> tuple[tuple, list[str]]:
    """The primary objectives (as asked or declared: kept, with a note where one is flat), then the
    secondary frontiers whose columns exist and vary by more than the budget `tolerance`: an
    objective that varies less over the whole board varies by the budget's rounding, and a frontier
    over it orders rounding, not architectures."""
    pairs = [tuple(primary)]
    skipped = [
        f"{o.column} varies by {spread:.2%} only, within the budget tolerance {tolerance:.1%}: its "
        "frontier orders the budget's rounding (declare other objectives in the space)"
        for o in primary
        if (spread := _spread(cands, o.column)) <= tolerance
    ]
    for pair in objectives.secondary(primary):
        if pair in pairs:
            continue
        absent = [o.column for o in pair if o.column not in cands or cands[o.column].isna().all()]
        flat = [
            (o.column, spread)
            for o in pair
            if not absent and (spread := _spread(cands, o.column)) <= tolerance
        ]
        if absent:
            skipped.append(
                f"frontier {pair[0].column} vs {pair[1].column} skipped: no {', '.join(absent)}"
            )
        elif flat:
            skipped.append(
                f"frontier {pair[0].column} vs {pair[1].column} skipped: {flat[0][0]} varies by "
                f"{flat[0][1]:.2%} only, within the budget tolerance {tolerance:.1%}"
            )
        else:
            pairs.append(pair)
    return tuple(pairs), skipped


def _spread(cands: pd.DataFrame, column: str) -> float:
    """(max - min) / max |value| of a column over the candidates: 0 for a constant, inf for none."""
    values = cands[column].to_numpy(dtype=float)
    values = values[np.isfinite(values)]
    scale = np.abs(values).max() if len(values) else 0.0
    return (
        float((values.max() - values.min()) / scale)
        if scale > 0
        else (0.0 if len(values) else np.inf)
    )


def _budget_tolerance(declared: Mapping[str, dict] | None, default: float) -> float:
    """How far the studies let a candidate's parameters sit from its budget: the largest `tolerance`
    they declare, else `default` (the board's banding tolerance)."""
    found = [
        t
        for info in (declared or {}).values()
        if isinstance(t := info.get("tolerance"), (int, float))
    ]
    return float(max(found, default=default))


def _hypervolumes(cands: pd.DataFrame, pairs, ref) -> pd.DataFrame:
    """Per objective set: one reference point shared by every study and family (so their numbers
    compare), then the hypervolume of each study's and each study-family's points."""
    rows = []
    for i, objs in enumerate(pairs):
        cols, maximize = [o.column for o in objs], [o.maximize for o in objs]
        sub = cands[np.isfinite(cands[cols].to_numpy(dtype=float)).all(axis=1)]
        point = np.asarray(
            ref
            if (i == 0 and ref is not None)
            else frontier.reference_point(sub[cols].to_numpy(), maximize),
            dtype=float,
        )
        for study, group in sub.groupby("study", sort=False):
            scopes = [("all", group), *group.groupby("family", sort=True)]
            for family, part in scopes:
                pts = part[cols].to_numpy(dtype=float)
                pts = pts[frontier.non_dominated(pts, maximize)]
                rows.append(
                    {
                        "objectives": " vs ".join(map(str, objs)),
                        "study": study,
                        "family": family,
                        "points": len(pts),
                        "hypervolume": frontier.hypervolume(pts, point, maximize),
                        "reference": tuple(float(v) for v in point),
                    }
                )
    return pd.DataFrame(rows)
