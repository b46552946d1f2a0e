"""`shapebench plan`: a space's candidates, resolved without training: exact parameter counts,
distance from the budget, FLOPs per token and the time each trial would take on this machine.

Which candidates: every point of the grid when the space is finite (choice / int / fixed axes) and
has at most `trials` points; otherwise `trials` distinct points drawn by Optuna's RandomSampler
seeded with `seed`, through the same define-by-run walk the search uses. Same seed, same plan.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable

from benchmark.arch import count_flops
from benchmark.recipe import fmt_count, fmt_fraction, parse_tokens
from benchmark.space.budget import SOLVE_NONE
from benchmark.space.candidates import Candidate, choose, grid, resolve
from benchmark.space.language import BUDGET_AXIS, SearchSpace
from benchmark.store import PARAM_COLUMNS

# A trial's seconds outside its training steps and their compilation: the evaluations,
# quantisation with its own three evaluations, bookkeeping. A plan adds it to a probe's speed and
# compilation until trials on this machine have measured their own (perf/probe.py,
# store/speeds.py). The quickstart's first trials spent about this on a 2-core CPU, a fifth of it on
# an H100 (results/quickstart-cpu-epyc, results/quickstart-gpu-h100: wall_s - train_s - compile_s).
TRIAL_REST_S = 6.0
# Seconds a search spends outside its trials (starting Ray and the first worker, ending them),
# until a search on this machine has measured its own (store/speeds.py: record_search, timed from
# the search's start, so the interpreter's start and imports are not in it): the quickstart's on a
# 2-core CPU (benchmarks/2026-11-24-quickstart-timings.md, "The plan's estimate").
SEARCH_START_S = 15.0
# The GPU-hours a plan prints, and the cluster-job gate's (search/gate.py), at an assumed achieved
# training rate per GPU, as no GPU is measured here: an H100 SXM at ~40% of its 989 TFLOP/s dense
# bf16 peak. `--gpu-tflops` assumes another.
ASSUMED_GPU_FLOPS = 400e12


@dataclass(frozen=True, kw_only=True)
class Plan:
    space: SearchSpace
    candidates: tuple[Candidate, ...]
    sampled: bool  # False: the whole grid
    seed: int
    seconds: float  # time spent planning


def plan_points(space: SearchSpace, seed: int = 0) -> tuple[list[dict[str, Any]], bool]:
    """(axis values of each candidate, whether they were sampled rather than enumerated)."""
    points = grid(space, limit=space.trials)
    if points is not None:
        return points, False
    import optuna  # only a sampled plan needs it

    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
    for point in ladder_points(space):  # as the search does: each rung of a ladder once first
        study.enqueue_trial(point)
    seen: dict[str, dict[str, Any]] = {}
    for _ in range(
        20 * space.trials
    ):  # distinct points; a small space may have fewer than `trials`
        trial = study.ask()
        values = choose(space, lambda axis, trial=trial: axis.domain.suggest(trial, axis.key))
        seen.setdefault(repr(sorted(values.items())), values)
        if len(seen) == space.trials:
            break
    return list(seen.values()), True


def first_points(space: SearchSpace) -> list[dict[str, Any]]:
    """The points a new study starts with: the whole grid of a finite space, else each budget of a
    ladder once (the other axes left to the sampler), so a ladder is covered before any rung repeats."""
    points = grid(space, limit=space.trials)
    return points if points is not None else ladder_points(space)


def ladder_points(space: SearchSpace) -> list[dict[str, Any]]:
    """Each budget of a ladder once, the other axes left to the sampler (none without a ladder)."""
    return [{BUDGET_AXIS: b} for b in space.ladder]


def make_plan(space: SearchSpace, seed: int = 0) -> Plan:
    """Resolve every candidate; raises SpaceError for the first one that cannot be built, whose
    training schedule cannot fit (SearchSpace.schedule), or that cannot give an objective
    (SearchSpace.check_objectives)."""
    start = time.perf_counter()
    points, sampled = plan_points(space, seed)
    candidates = tuple(resolve(space, values) for values in points)
    for i, c in enumerate(
        candidates
    ):  # a schedule that cannot fit is an error now, not a mis-trained trial
        about = f"candidate {i} ({c.spec.family}, budget {fmt_count(c.solution.budget)})"
        space.schedule(c.solution.params, about=about, budget=c.solution.budget)
        space.check_objectives(c.spec, about=f"candidate {i}")
    return Plan(
        space=space,
        candidates=candidates,
        sampled=sampled,
        seed=seed,
        seconds=time.perf_counter() - start,
    )


def runs_per_candidate(space: SearchSpace, seeds: int | None = None) -> int:
    """The runs each candidate trains: its final seeds (`seeds`, else the space's) and, under
    `tune:`, every point of the grid on every tuning seed before them (tuning.Tune.runs)."""
    return (seeds or space.seeds) + (space.tune.runs if space.tune else 0)


def records(
    plan: Plan, speed: float | Callable[[str], Any], seeds: int | None = None
) -> list[dict[str, Any]]:
    """One JSON-able record per candidate (`shapebench plan --json`). `speed` is
    this machine's training FLOP/s, or family -> Speed (store/speeds.py: what trials measured
    here, with their time outside training) so that the estimate learns from finished trials.
    `est_seconds` is one run; `runs` how many the candidate trains (runs_per_candidate, `seeds`
    final seeds, else the space's)."""
    space = plan.space
    runs = runs_per_candidate(space, seeds)
    speed_of = speed if callable(speed) else (lambda family: _Fixed(speed, TRIAL_REST_S, 0))
    out = []
    for i, c in enumerate(plan.candidates):
        flops = count_flops(c.spec, space.training_value("seq_len"))
        tokens = space.tokens_for(c.solution.params, c.solution.budget)
        config = c.config()
        known = speed_of(c.spec.family)
        steps, warmup = space.schedule(c.solution.params, budget=c.solution.budget)
        out.append(
            {
                "candidate": i,
                "family": c.spec.family,
                "structure": c.spec.structure(),
                "values": c.values,
                "spec": config["spec"],
                **{k: config[k] for k in (*PARAM_COLUMNS, "budget", "count", "budget_distance")},
                "flops_per_token_train": flops["train"],
                "flops_per_token_infer": flops["infer"],
                "anchor_ratio": c.anchor_ratio,
                "tokens": tokens,
                "steps": steps,
                "warmup_steps": warmup,
                "est_seconds": flops["train"] * tokens / known.flops_per_s + known.overhead_s,
                "est_from_trials": known.trials,
                "runs": runs,
            }
        )
    return out


@dataclass(frozen=True)
class _Fixed:  # the shape of store.speeds.Speed, for a single machine-wide FLOP/s
    flops_per_s: float
    overhead_s: float
    trials: int


def train_flops(rows: list[dict[str, Any]]) -> float:
    """The training FLOPs of every run of every candidate: FLOPs per token x tokens x runs."""
    return sum(r["flops_per_token_train"] * r["tokens"] * r["runs"] for r in rows)


def gpu_hours(rows: list[dict[str, Any]], gpu_flops: float = ASSUMED_GPU_FLOPS) -> float:
    """train_flops at `gpu_flops` achieved training FLOP/s per GPU."""
    return train_flops(rows) / gpu_flops / 3600


def median_distance(plan: Plan) -> float:
    return statistics.median(abs(c.distance) for c in plan.candidates)


# ---- the table ----------------------------------------------------------------------------


def fmt_seconds(s: float) -> str:
    return f"{s:.0f} s" if s < 120 else f"{s / 60:.1f} min" if s < 7200 else f"{s / 3600:.1f} h"


def fmt_hours(h: float) -> str:
    """Three significant figures, thousands separated from 100 up: 0.0123, 12.3, 1,234."""
    return f"{h:,.0f}" if h >= 100 else f"{h:.3g}"


def gpu_time(rows: list[dict[str, Any]], gpu_flops: float = ASSUMED_GPU_FLOPS) -> str:
    """The runs' GPU time at an assumed rate, in the unit that reads: "about 12.3 GPU-hours", or
    GPU-minutes or GPU-seconds below one (a tiny search's 0.000333 GPU-hours is 1.2 GPU-seconds)."""
    h = gpu_hours(rows, gpu_flops)
    amount = (
        f"{fmt_hours(h)} GPU-hours"
        if h >= 1
        else f"{h * 60:.3g} GPU-minutes"
        if h >= 1 / 60
        else f"{h * 3600:.3g} GPU-seconds"
    )
    return f"about {amount} at an assumed {gpu_flops / 1e12:g} TFLOP/s per GPU"


def _ffn(spec) -> str:
    f = spec.ffn
    if f.kind == "hourglass":
        return f"hourglass {f.K}×{f.d_h} ({f.d_h / spec.d_model:.2f}×)"
    return f"swiglu {f.d_ff} ({f.d_ff / spec.d_model:.2f}×)"


def _hyper(spec) -> str:
    h = spec.hyper
    return "-" if h is None else h.label


_COUNT_HEADS = {"non_embedding": "non-emb", "non_embedding_head": "non-emb + head"}


def render(
    plan: Plan,
    rows: list[dict[str, Any]],
    console,
    search: tuple[float, float, int] | None = None,
    as_json: bool = False,
    gpu_flops: float = ASSUMED_GPU_FLOPS,
) -> None:
    """A rich table of the candidates and a one-line summary; `as_json` (`--plan --json`): one JSON
    object per candidate on stdout, the summary and notes on stderr."""
    if as_json:
        for row in rows:
            print(json.dumps(row, sort_keys=True))
        print(summary(plan, rows, search, gpu_flops), file=sys.stderr)
        for line in warnings(plan.space):
            print(f"note: {line}", file=sys.stderr)
        return
    from rich.table import Table

    space = plan.space
    table = Table(title=f"{space.name}: {space.description}".rstrip(": "), title_justify="left")
    ladder = bool(space.ladder)
    # beside the total, the count the budget meets (Δ budget is against it); non-embedding for `total`
    counted = "non_embedding" if space.count == "total" else space.count
    second = _COUNT_HEADS[counted]
    held = space.solve == SOLVE_NONE  # one shape, no budget matched: each count over the anchor's
    for col in (
        "#",
        *(("budget",) if ladder else ()),
        "family",
        "structure",
        "streams × mixing / every",
        "d_model",
        "heads",
        "FFN (width/d_model)",
        "params",
        second,
        "× anchor" if held else "Δ budget",
        "train FLOP/tok",
        "est. time",
    ):
        table.add_column(
            col,
            justify="right"
            if col in ("#", "budget", "d_model", "heads", "params", second, "× anchor")
            else "left",
        )
    for c, r in zip(plan.candidates, rows, strict=True):
        s = c.spec
        heads = str(s.n_heads) if s.n_kv_heads == s.n_heads else f"{s.n_heads}/{s.n_kv_heads} kv"
        table.add_row(
            str(r["candidate"]),
            *((fmt_count(r["budget"]),) if ladder else ()),
            s.family,
            s.structure(),
            _hyper(s),
            str(s.d_model),
            heads,
            _ffn(s),
            f"{r['params_total']:,}",
            f"{r[f'params_{counted}']:,}",
            f"{r['anchor_ratio']:.3f}×" if held else f"{r['budget_distance']:+.3%}",
            fmt_count(r["flops_per_token_train"]),
            fmt_seconds(r["est_seconds"]),
        )
    console.print(table)
    console.print(
        summary(plan, rows, search, gpu_flops), markup=False
    )  # `--set 'axes.family=[a, b]'` is not markup
    for line in warnings(space):
        console.print(f"[yellow]note:[/yellow] {line}")


def warnings(space: SearchSpace) -> list[str]:
    """What a plan should point out about the space's design."""
    out = []
    constant = [name for name, _ in space.objectives if name.startswith("params")]
    if constant and len(space.objectives) > 1 and not space.ladder and space.solve != SOLVE_NONE:
        out.append(
            f"objective {constant[0]} is constant by construction in a single-budget space (every candidate is "
            f"within {fmt_fraction(space.tolerance)} of {fmt_count(space.budget)}), so a multi-objective "
            "sampler would trade the loss against rounding noise; use an objective that varies "
            "(flops_per_token_train, int4_bytes) or a budget ladder (budget: [1M, 2M, 4M])"
        )
    return out


def _tokens(space: SearchSpace) -> str:
    tokens = parse_tokens(space.training_value("tokens"))
    return (
        str(tokens)
        if tokens.absolute
        else f"{tokens} ({space.training_value('tokens_per')} parameters)"
    )


def _step(space: SearchSpace) -> str:
    """Tokens per optimiser step: micro-batch x sequence length x accumulation."""
    b, t, k = (space.training_value(key) for key in ("batch_size", "seq_len", "grad_accum"))
    return f"{fmt_count(b * t * k)} per step ({b} x {t}" + (
        f" x {k} micro-batches)" if k > 1 else ")"
    )


def summary(
    plan: Plan,
    rows: list[dict[str, Any]],
    search: tuple[float, float, int] | None = None,
    gpu_flops: float = ASSUMED_GPU_FLOPS,
) -> str:
    """The plan's last line. `search`: (start_s, per_trial_s, searches) of store.speeds.search_times,
    the time a search spends outside its trials; None: SEARCH_START_S. `gpu_flops`: the achieved
    training FLOP/s per GPU its GPU-hours assume."""
    space = plan.space
    how = (
        f"{len(rows)} sampled (seed {plan.seed})"
        if plan.sampled
        else f"{len(rows)} (the whole grid)"
    )
    trials = sum(r["est_seconds"] * r["runs"] for r in rows)
    start_s, per_trial_s, searches = search or (SEARCH_START_S, 0.0, 0)
    around = start_s + per_trial_s * len(rows)  # a candidate's seeds run in one trial
    source = (
        f"from {searches} search{'es' if searches > 1 else ''} here"
        if searches
        else "until a search has run here"
    )
    at = ", ".join(fmt_count(b) for b in space.budgets)
    return (
        f"{how} candidates{_runs(space)} at {at} {space.count} parameters "
        f"± {fmt_fraction(space.tolerance)}; "
        f"{_matched(plan)}; {_tokens(space)} tokens each, {_step(space)}, "
        f"{_steps(rows)}; "
        f"est. {fmt_seconds(trials + around)} here: the trials {fmt_seconds(trials)} ({_basis(rows)}), "
        f"the search around them {fmt_seconds(around)} ({source}); {_gpu_hours(rows, gpu_flops)}; "
        f"planned in {plan.seconds:.2f} s"
        + (f"; set on the command line: {' '.join(space.overrides)}" if space.overrides else "")
    )


def _runs(space: SearchSpace) -> str:
    """The runs of each candidate (runs_per_candidate): " x 3 seeds", under `tune:`
    " x (4 tuning + 3 seeds) runs"; nothing for one seed alone."""
    seeds = f"{space.seeds} seed{'s' if space.seeds > 1 else ''}"
    if space.tune:
        return f" x ({space.tune.runs} tuning + {seeds}) runs"
    return f" x {seeds}" if space.seeds > 1 else ""


def _gpu_hours(rows: list[dict[str, Any]], gpu_flops: float) -> str:
    """The whole search's GPU-hours at an assumed rate: no probe, the FLOPs are counted exactly."""
    return (
        f"{gpu_time(rows, gpu_flops)} ({train_flops(rows):.3g} training FLOPs: "
        "FLOPs per token x tokens x runs, summed over the candidates)"
    )


def _matched(plan: Plan) -> str:
    """How near the budget the candidates are; under solve: none, the anchor's distance from it and
    each candidate's own count over the anchor's (the tolerance applies to the anchor alone)."""
    if plan.space.solve != SOLVE_NONE or not plan.candidates:
        return f"median |Δ budget| {median_distance(plan):.4%}"
    ratios = [c.anchor_ratio for c in plan.candidates]
    anchors = ", ".join(dict.fromkeys(f"{c.anchor.distance:+.3%}" for c in plan.candidates))
    return (
        f"solve: none: the anchor {anchors} from the budget, every candidate at its shape with its own count, "
        f"{min(ratios):.3f}-{max(ratios):.3f}× the anchor's"
    )


def _steps(rows: list[dict[str, Any]]) -> str:
    """Optimiser steps and warmup steps of the candidates (a range where their sizes set the tokens)."""

    def span(key: str) -> str:
        lo, hi = min(r[key] for r in rows), max(r[key] for r in rows)
        return f"{lo:,}" if lo == hi else f"{lo:,}-{hi:,}"

    return f"{span('steps')} steps (warmup {span('warmup_steps')})" if rows else "no steps"


def _basis(rows: list[dict[str, Any]]) -> str:
    """What the estimate stands on: trials measured here, or the machine's probe."""
    measured = sum(1 for r in rows if r["est_from_trials"])
    if not measured:
        return "from a probe of candidate 0 trained here; finished trials refine it"
    return f"{measured} of {len(rows)} candidates from their family's trials measured here"
