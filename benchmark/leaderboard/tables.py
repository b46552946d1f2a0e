"""What the leaderboard's tables say: the ranked board per budget band, the studies' provenance,
hypervolumes, every trial, and the trials kept off the frontiers. Builders return formats.Table;
formats.py writes them out."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from benchmark.leaderboard import stats, tuning
from benchmark.leaderboard.board import Board
from benchmark.leaderboard.formats import Column, Table
from benchmark.store import DIAGNOSTICS, METRICS, metric

# --- number formats: each maps an array of floats to display strings ---------------------------

MISSING = "—"
_STEPS = np.array([1e3, 1e6, 1e9, 1e12])
_SCALES = np.array([1.0, 1e3, 1e6, 1e9, 1e12])
_SUFFIXES = np.array(["", "K", "M", "B", "T"])


def counts(values: np.ndarray) -> list[str]:
    """135.7M, 1.075B, 786K: counts as papers print them (4 significant digits at most)."""
    step = np.searchsorted(_STEPS, np.abs(values), side="right")
    scaled = (
        values / _SCALES[step]
    ).tolist()  # Python floats format several times faster than numpy's
    return [
        f"{v:.4g}{u}" if math.isfinite(v) else MISSING
        for v, u in zip(scaled, _SUFFIXES[step].tolist())
    ]


def count(value: float) -> str:
    return counts(np.array([value], dtype=float))[0]


def decimals(digits: int) -> Callable[[np.ndarray], list[str]]:
    return lambda values: [
        f"{v:.{digits}f}" if math.isfinite(v) else MISSING for v in values.tolist()
    ]


def integers(values: np.ndarray) -> list[str]:
    return [str(int(v)) if math.isfinite(v) else MISSING for v in values.tolist()]


def general(values: np.ndarray) -> list[str]:
    return [f"{v:.4g}" if math.isfinite(v) else MISSING for v in values.tolist()]


def _as_float(values) -> np.ndarray:
    return pd.to_numeric(pd.Series(values), errors="coerce").to_numpy(dtype=float)


def numeric(
    frame: pd.DataFrame, col: str, header: str, fmt: Callable, tex: str | None = None
) -> Column:
    keys = _as_float(frame[col])
    # Format each distinct value once: seeds repeat params, shapes and seed numbers many times over.
    distinct, position = np.unique(keys, return_inverse=True)
    cells = np.array(fmt(distinct), dtype=object)[position.ravel()].tolist()
    return Column(header=header, cells=cells, keys=keys, tex=tex)


def text(frame: pd.DataFrame, col: str, header: str) -> Column:
    values = frame[col].astype(object)
    return Column(header=header, cells=values.where(values.notna(), MISSING).astype(str).tolist())


def mean_se(frame: pd.DataFrame, col: str, header: str, digits: int = 2) -> Column:
    """`14.40 ± 0.03` over seeds; a single seed has no error bar."""
    means = _as_float(frame[col])
    ses = _as_float(frame[f"{col}_se"]) if f"{col}_se" in frame else np.full(len(frame), np.nan)
    cells = [
        (f"{m:.{digits}f}" + (f" ± {s:.{digits}f}" if math.isfinite(s) else ""))
        if math.isfinite(m)
        else MISSING
        for m, s in zip(means.tolist(), ses.tolist())
    ]
    return Column(header=header, cells=cells, keys=means)


# --- the leaderboard ----------------------------------------------------------------------------

# Column headings as short as the papers' (Hyperloop Table 1, hourglass Table 3), for the wide
# ranked tables; any other metric is headed by its registry label (heading()).
SHORT = {
    "params_total": "Params",
    "params_non_embedding": "Non-emb. params",
    "params_non_embedding_head": "Non-emb. + head params",
    "val_ppl": "PPL",
    "val_ppl_int4": "PPL (INT4)",
    "val_loss": "Loss",
    "tokens_per_s": "Tok/s",
    "flops_per_token_train": "Train FLOPs/tok",
    "flops_per_token_infer": "Infer FLOPs/tok",
    "int4_bytes": "INT4 size (B)",
    "peak_mem_bytes": "Peak mem (B)",
    "wall_s": "Wall (s)",
    "params_attention": "Attn params",
    "params_ffn": "FFN params",
}
# Quality metrics vary over seeds, so they carry an error bar (a loss in nats needs 4 decimals to
# tell candidates apart, as does a relative increase such as INT4's +0.022, a perplexity 2); the rest
# are properties of the architecture.
WITH_SE = {
    m.column: 4 if m.unit in ("nats/token", "fraction") else 2
    for m in METRICS
    if m.kind == "quality"
}
# Shown after the objectives when the study has them, in this order: perplexity, the papers'
# number, beside a loss objective.
OPTIONAL = ("val_ppl", "val_ppl_int4", "tokens_per_s", "params_attention", "params_ffn")
SHAPE = (
    ("d_model", "d_model", r"$d_\mathrm{model}$"),
    ("d_h", "d_h", "$d_h$"),
    ("K", "K", "$K$"),
    ("L", "L", "$L$"),
    ("depth", "Unrolled", None),
)


def heading(col: str) -> str:
    """A metric's column heading: the papers' short one, else the registry's label and unit."""
    if col in SHORT:
        return SHORT[col]
    label = metric(col).axis_label()
    return label[:1].upper() + label[1:]


def metric_column(frame: pd.DataFrame, col: str) -> Column:
    if col in WITH_SE:
        return mean_se(frame, col, heading(col), WITH_SE[col])
    return numeric(frame, col, heading(col), counts)


def leaderboard(board: Board, top: int | None = None) -> list[Table]:
    """One ranked table per budget band and cohort (bands.cohorts: candidates counted and trained
    alike; a board of one study has one per band). Rows come in rank order, `#` being the rank in
    the band and cohort (a tie keeps its `=`); rows of equal rank keep the board's order."""
    cands = board.candidates
    objs = [o.column for o in board.objectives]
    metrics = list(dict.fromkeys(["params_total", *objs, *OPTIONAL]))
    absent = [m for m in metrics if m not in cands or cands[m].isna().all()]
    notes = [f"column {heading(m)} skipped: no {m} in the results" for m in absent]
    several = len(board.studies) > 1
    variants = _has_variants(cands)
    tables = []
    for (band, cohort), rows in cands.groupby(["band", "cohort"], sort=True, dropna=False):
        shown = (
            f"top {top} of {len(rows)}" if top is not None and top < len(rows) else f"{len(rows)}"
        )
        ties = tied(rows, board.metric.column)  # over the whole band, before --top cuts it
        rows = rows if top is None else rows[rows["rank"] <= top]
        rows = rows.assign(_tie=ties).sort_values("rank", kind="stable")
        columns = [
            rank_column(rows),
            *([text(rows, "study", "Study")] if several else []),
            text(rows, "family", "Family"),
            text(rows, "structure", "Structure"),
            *([text(rows, "variant", "Variant")] if variants else []),
            *(metric_column(rows, m) for m in metrics if m not in absent),
            *(numeric(rows, c, h, integers, tex) for c, h, tex in SHAPE),
            numeric(rows, "n_seeds", "Seeds", integers),
            # a tuned study's (leaderboard/tuning.py): the setting each candidate chose on the
            # grid (arms at their own settings rank together) and how far the loss moves over it
            *(
                [
                    Column(header="Tuned", cells=[tuning.settings_label(t) for t in rows["tuned"]]),
                    numeric(rows, "lr_sensitivity", "LR sensitivity", decimals(3)),
                ]
                if "lr_sensitivity" in rows and rows["lr_sensitivity"].notna().any()
                else []
            ),
            Column(header="Pareto", cells=_marks(rows)),
        ]
        title = f"Budget {count(band)}" + (f" ({cohort})" if cohort else "")
        tables.append(
            Table(
                title=title,
                columns=columns,
                notes=notes,
                caption=(
                    f"{shown} candidates ranked by {board.metric.describe()}, mean ± s.e. over seeds; "
                    f"★ on its study's {' / '.join(objs)} frontier, ☆ on its family's only"
                    + (f"; {TIE_NOTE}" if rows["_tie"].any() else "")
                ),
            )
        )
    return tables


def at_a_glance(board: Board, table: Table) -> Table:
    """A ranked table cut to what a reader compares first, narrow enough for a laptop's window: the
    rank, the model, the objectives, perplexity, seeds and the frontier marks (the page shows the
    whole table below it)."""
    keep = {
        "#",
        "Study",
        "Family",
        "Structure",
        "Variant",
        *(heading(o.column) for o in board.objectives),
        heading("val_ppl"),
        "Seeds",
        "Pareto",
    }
    return replace(table, columns=[c for c in table.columns if c.header in keep])


TIE_NOTE = "=: tied with an adjacent rank (their 95% intervals over seeds overlap)"


def tied(rows: pd.DataFrame, metric: str) -> pd.Series:
    """Whether each candidate's rank ties an adjacent rank in `rows` (one band): the two t
    intervals over seeds (stats.LEVEL) overlap. A candidate with one seed has no interval and ties
    nothing. Overlapping intervals are the plain reading of "within noise", and a conservative one:
    two means can differ significantly while their intervals still touch."""
    ordered = rows.sort_values("rank", kind="stable")
    mean = ordered[metric].to_numpy(float)
    se = (
        ordered[f"{metric}_se"].to_numpy(float)
        if f"{metric}_se" in ordered
        else np.full(len(ordered), np.nan)
    )
    n = (
        ordered[f"{metric}_n"].to_numpy(float)
        if f"{metric}_n" in ordered
        else np.full(len(ordered), np.nan)
    )
    lo, hi = stats.interval(mean, se, n - 1)
    overlap = (lo[1:] <= hi[:-1]) & (hi[1:] >= lo[:-1])  # NaN compares False: no interval, no tie
    tie = np.zeros(len(ordered), dtype=bool)
    tie[1:] |= overlap
    tie[:-1] |= overlap
    return pd.Series(tie, index=ordered.index).reindex(rows.index)


def rank_column(rows: pd.DataFrame) -> Column:
    """`#`: the rank in the band, `=2` where it ties a neighbour (`_tie`, from tied())."""
    ranks = rows["rank"].to_numpy(dtype=float)
    cells = [
        f"={r:.0f}" if t else f"{r:.0f}" for r, t in zip(ranks.tolist(), rows["_tie"].tolist())
    ]
    return Column(header="#", cells=cells, keys=ranks)


def _has_variants(frame: pd.DataFrame) -> bool:
    """A Variant column (hyper-connections, LoRA) only where some model has one."""
    return "variant" in frame and bool(frame["variant"].notna().any())


def _marks(rows: pd.DataFrame) -> list[str]:
    return ["★" if f else "☆" if ff else "" for f, ff in zip(rows["front"], rows["family_front"])]


def objectives_line(board: Board) -> str:
    """What the board ranks by, in the registry's names and labels (the page and Markdown say it)."""
    return (
        f"Objectives {' vs '.join(o.describe() for o in board.objectives)}; ranked by "
        f"{board.metric.metric.label} within each budget band, among the studies counted and trained alike; "
        f"mean ± standard error over seeds."
    )


# --- around the board ---------------------------------------------------------------------------


def provenance(board: Board) -> Table:
    """Where each study's numbers come from (modded-nanogpt habit: every result names its code)."""
    rows = [
        _provenance_row(study, trials)
        for study, trials in board.trials.groupby("study", sort=False)
    ]
    frame = pd.DataFrame(rows)
    return Table(
        title="Studies",
        columns=[
            text(frame, "study", "Study"),
            numeric(frame, "trials", "Trials", integers),
            text(frame, "status", "Status"),
            numeric(frame, "candidates", "Candidates", integers),
            text(frame, "seeds", "Seeds"),
            text(frame, "code_version", "Code"),
            text(frame, "dataset_id", "Dataset"),
            text(frame, "tokenizer_id", "Tokenizer"),
            text(frame, "started", "First start"),
            text(frame, "finished", "Last finish"),
        ],
    )


def _seeds(seeds) -> str:
    """How many seeds and which: `1 (seed 0)`, `3 (seeds 0, 1, 2)`; a bare "0" read as no seeds."""
    if not len(seeds):
        return "—"
    values = ", ".join(str(int(s)) for s in seeds)
    return f"{len(seeds)} (seed{'s' if len(seeds) > 1 else ''} {values})"


def _provenance_row(study: str, trials: pd.DataFrame) -> dict:
    def distinct(col):
        return ", ".join(map(str, pd.unique(trials[col].dropna()))) if col in trials else "—"

    def when(col, pick):
        if col not in trials:
            return "—"
        stamps = pd.to_datetime(trials[col], errors="coerce", utc=True, format="ISO8601").dropna()
        return pick(stamps).strftime("%Y-%m-%d %H:%M UTC") if len(stamps) else "—"

    seeds = sorted(pd.unique(trials["seed"].dropna())) if "seed" in trials else []
    return {
        "study": study,
        "trials": len(trials),
        "status": ", ".join(f"{n} {s}" for s, n in trials["status"].value_counts().items()),
        "candidates": trials["candidate"].nunique(),
        "seeds": _seeds(seeds),
        "code_version": distinct("code_version"),
        "dataset_id": distinct("dataset_id"),
        "tokenizer_id": distinct("tokenizer_id"),
        "started": when("started_at", lambda s: s.min()),
        "finished": when("finished_at", lambda s: s.max()),
    }


def hypervolumes(board: Board) -> Table:
    """Hypervolume per study (and per family for the primary objectives), against one reference
    point per objective set shared by all studies, so the numbers compare across studies."""
    hv = board.hypervolumes
    primary = hv["objectives"] == hv["objectives"].iloc[0]
    frame = hv[primary | (hv["family"] == "all")]
    refs = [", ".join(counts(np.array(ref))) for ref in frame["reference"]]
    return Table(
        title="Hypervolume",
        columns=[
            text(frame, "objectives", "Objectives"),
            text(frame, "study", "Study"),
            text(frame, "family", "Family"),
            numeric(frame, "points", "Frontier points", integers),
            numeric(frame, "hypervolume", "Hypervolume", general),
            Column(header="Reference point", cells=refs),
        ],
        caption="reference: the user's --ref, else 1.1 × the worst value of each objective over all studies",
    )


def trials(board: Board) -> Table:
    """Every trial read, any status: the page's one-row-per-trial table."""
    t = board.trials
    objs = [o.column for o in board.objectives]
    shown = dict.fromkeys(
        ["params_total", *objs, "val_ppl", "val_ppl_int4", "tokens_per_s", "seed", "wall_s"]
    )
    return Table(
        title=f"All trials ({len(t)})",
        columns=[
            *([text(t, "study", "Study")] if len(board.studies) > 1 else []),
            text(t, "trial_id", "Trial"),
            text(t, "status", "Status"),
            text(t, "family", "Family"),
            text(t, "structure", "Structure"),
            *([text(t, "variant", "Variant")] if _has_variants(t) else []),
            *(
                numeric(t, c, "Seed" if c == "seed" else heading(c), _trial_format(c))
                for c in shown
                if c in t
            ),
        ],
    )


def _trial_format(col: str) -> Callable:
    return decimals(WITH_SE[col]) if col in WITH_SE else integers if col == "seed" else counts


def diagnostics(board: Board) -> Table:
    """Whether each model's hyper-connections act (analysis.hyper_diagnostics), for the candidates
    that have any: streams that stay copies have a cosine of 1, an H_res that never moves keeps
    its initial |H_res − I|. Empty when no model has hyper-connections."""
    cands = board.candidates
    cols = [c for c in DIAGNOSTICS if c in cands and cands[c].notna().any()]
    rows = cands[cands[cols].notna().any(axis=1)] if cols else cands.iloc[:0]
    return Table(
        title=f"Hyper-connection diagnostics ({len(rows)})",
        columns=[
            *([text(rows, "study", "Study")] if len(board.studies) > 1 else []),
            text(rows, "family", "Family"),
            text(rows, "structure", "Structure"),
            *([text(rows, "variant", "Variant")] if _has_variants(rows) else []),
            # a ladder's rungs share family and structure: the budget tells its rows apart
            *([numeric(rows, "band", "Budget", counts)] if rows["band"].nunique() > 1 else []),
            *(numeric(rows, c, heading(c), decimals(4)) for c in cols),
            numeric(rows, "n_seeds", "Seeds", integers),
        ],
        caption="after training, on held-out text, mean over seeds: mean pairwise cosine of the streams "
        "after the last connection (1: copies), mean |H_res − I| per entry, mean loop-embedding "
        "norm, fraction of sigmoid gate values below 0.01 or above 0.99",
    )


def excluded(board: Board) -> Table:
    """Trials that never enter a frontier: not `ok`, or ok without a finite objective."""
    frame = board.excluded
    shown = ("study",) * (len(board.studies) > 1) + ("trial_id", "family", "structure", "seed")
    cols = [c for c in shown if c in frame]
    return Table(
        title=f"Trials kept off the frontiers ({len(frame)})",
        columns=[
            *(text(frame, c, c.replace("_", " ").capitalize()) for c in cols),
            text(frame, "reason", "Reason"),
            text(frame, "error", "Error"),
        ],
    )


@dataclass(frozen=True, kw_only=True)
class Document:
    """The tables every output shows, built once per run."""

    ranked: list[Table]  # one per budget band
    studies: Table
    hypervolume: Table
    excluded: Table
    diagnostics: Table  # empty without hyper-connections
    scaling: Table | None = None  # scaling fits over budget ladders (scaling.table)
    claims: Table | None = None  # claims checked (claims.table), with --claims
    verdicts: Table | None = None  # the same in brief (claims.verdicts), with --claims
    decision: tuple[Table, Table] | None = (
        None  # decision accuracy over ladders: summary, pairs (decision.tables)
    )
    stability: Table | None = None  # the claims' unstable runs (claims/stability.py), with --claims
    tuning: Table | None = None  # each tuned candidate's choice and budget (leaderboard/tuning.py)


def document(
    board: Board,
    top: int | None = None,
    scaling: Table | None = None,
    claims: Table | None = None,
    decision: tuple[Table, Table] | None = None,
    verdicts: Table | None = None,
) -> Document:
    return Document(
        ranked=leaderboard(board, top),
        studies=provenance(board),
        hypervolume=hypervolumes(board),
        excluded=excluded(board),
        diagnostics=diagnostics(board),
        scaling=scaling,
        claims=claims,
        decision=decision,
        verdicts=verdicts,
    )
