"""`shapebench plan --reuse-runs FOLDER`: which of the plan's runs a search would take from other
studies instead of training them (search/reuse.py), found by the search's own keys: each run's
settings as its trial resolves them (driver.trial_context, TrialContext.train_config), its data
as `prepare` names it (read from the token cache: nothing is tokenised) and the hardware a trial of
a search on this machine records (the CPU, and the torch threads its CPUs give it: --cpus-per-trial,
--concurrency, as resources.per_trial sizes a trial on a Ray of this machine's CPUs).

A candidate's tuning runs (every point of its grid on every tuning seed) are known runs. Its final
seeds train at the setting its tuning chooses, which no plan can know: they are looked up at every
setting the tuning can choose (the grid's points, and those `extend` can reach past its edges), and
each one found is said with its setting, taken only if that is the one chosen."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from benchmark.data import cached_identity
from benchmark.search import reuse
from benchmark.search.driver import trial_context
from benchmark.search.preflight import fit_memory, say
from benchmark.search.resources import Node, ResourcesError, per_trial
from benchmark.store import gpus, location, machine

# A plan's flags with --reuse-runs: a trial's CPUs, so the torch threads its runs' keys hold.
FLAGS = ("cpus_per_trial", "concurrency")
UNTOKENISED = (
    "--reuse-runs: the tokenizer is not trained on this corpus here yet, so no run's key is known "
    "(a search trains it first; plan again after)"
)


@dataclass(frozen=True)
class Data:
    """What a run's key reads of its prepared data (reuse.planned), known without its tokens."""

    dataset_id: str
    tokenizer: Any  # data.Tokenizer: its tokenizer_id
    sampling: str


@dataclass(frozen=True)
class Foreseen:
    header: str  # said once: the hardware the runs are matched at, or why none can be
    found: list[dict[str, Any] | None]  # each candidate's plan record's `reuse`; None: not known


def unused(args) -> str | None:
    """The line refusing --cpus-per-trial or --concurrency without --reuse-runs (they set only the
    threads it matches runs at), or naming a --reuse-runs folder without a study; else None."""
    if not args.reuse_runs:
        given = [f"--{f.replace('_', '-')}" for f in FLAGS if getattr(args, f) is not None]
        what = "sets" if len(given) == 1 else "set"
        what += " the torch threads --reuse-runs matches runs at: give it too"
        return f"{', '.join(given)} {what}" if given else None
    try:
        for folder in args.reuse_runs:
            reuse.studies_in(folder)
    except reuse.ReuseError as e:
        return str(e)
    return None


def trial_hardware(cpus: float | None, concurrency: int | None) -> tuple[str, int]:
    """(the `hardware` a run of a search on this machine records, its torch threads): a trial's
    CPUs and GPUs as per_trial sizes them on one node of this machine's CPUs (ray_session.start)."""
    count, name = gpus()  # imports torch: only --reuse-runs asks
    res = per_trial([Node(float(os.cpu_count() or 1), float(count))], cpus, None, concurrency)
    seen = math.ceil(res.gpus)  # Ray shows a trial that has part of a GPU the whole GPU
    from benchmark.models import kernels

    return machine(res.threads, seen, name if seen else "", kernels.in_use()), res.threads


def foresee(space, plan, opts, policy: Mapping[str, Any], cfg, gpu_memory) -> Foreseen:
    """What other studies measured of each planned candidate's runs, for a search of `space` with
    `opts` (its --reuse-runs, data, seed and seeds, resources) and `policy` (precision, compile);
    `cfg` and `gpu_memory`: the micro-batch the search fits to a GPU (preflight.fit_memory)."""
    ctx = trial_context(fit_memory(space, plan, cfg, gpu_memory), opts, policy)
    known = cached_identity(opts.data)
    if known is None:
        return Foreseen(UNTOKENISED, [None] * len(plan.candidates))
    try:
        hardware, threads = trial_hardware(opts.cpus_per_trial, opts.concurrency)
    except ResourcesError as e:  # as the search would stop: no trial fits this machine
        return Foreseen(f"--reuse-runs: {e}; no run's key is known", [None] * len(plan.candidates))
    data = Data(dataset_id=known[0], tokenizer=known[1], sampling=opts.data.sampling)
    found = [
        {"hardware": hardware, **candidate(ctx, c.config(), data, hardware)}
        for c in plan.candidates
    ]
    at = f"{threads} torch thread{'s' if threads != 1 else ''}"
    header = (
        f"--reuse-runs: the runs other studies measured, matched at this machine's hardware as a "
        f"trial of a search here records it, {at} ({hardware}); a cluster's workers may differ"
    )
    if ctx.tune is not None:
        header += (
            "; final seeds train at the setting tuning chooses, which a plan cannot know: "
            "one measured at a setting is taken only if tuning chooses that setting"
        )
    return Foreseen(header, found)


def candidate(ctx, config: Mapping[str, Any], data: Data, hardware: str) -> dict[str, Any]:
    """The runs of one candidate (its trial's config) that other studies measured: `tuning` (None
    without `tune:`): its runs and those measured; `final`: its seeds and those measured, at each
    setting its tuning can choose. A measured run: {"setting", "seed", "study"}."""

    def measured(runs) -> list[dict[str, Any]]:
        out = []
        for setting, seed in runs:
            cfg = ctx.train_config(seed, setting, config.get("budget"))
            values = reuse.planned(config["spec"], cfg, ctx.quantize_config(), data, hardware)
            if path := reuse.find(ctx.reuse, values):
                study = location.basename(location.parent(location.parent(path)))
                out.append({"setting": setting, "seed": seed, "study": study})
        return out

    tune, seeds = ctx.tune, ctx.seed_list()
    tuning = None if tune is None else [(p, s) for p in tune.points() for s in tune.seeds]
    settings = [None] if tune is None else choosable(tune)
    return {
        "tuning": None if tuning is None else {"runs": len(tuning), "measured": measured(tuning)},
        "final": {"seeds": seeds, "measured": measured((p, s) for p in settings for s in seeds)},
    }


def choosable(tune) -> list[dict[str, Any]]:
    """Every setting the tuning can choose, in the grid's order: its points, and those whose values
    `extend` reaches past the grid's edges (Tune.beyond, one value at a time, as tuning.grid
    extends it; every key's reach at once, so a few may lie beyond what one search reaches)."""
    axes = [(k, list(v)) for k, v in tune.grid]
    for key, _ in tune.extend:
        values = dict(axes)[key]  # the list in `axes`, grown in place
        for edge in (min, max):
            while (nxt := tune.beyond(axes, key, edge(values))) is not None:
                values.append(nxt)
    return sorted(tune.points(axes), key=tune.order)


def show(seen: Foreseen, rows: Sequence[Mapping[str, Any]], out, as_json: bool) -> None:
    """The header on `out` (a console, or stderr beside --json, whose records hold the rest), then
    a line per candidate."""
    say(out, seen.header)
    if as_json:
        return
    for r, found in zip(rows, seen.found):
        if found is not None:
            say(out, f"candidate {r['candidate']} ({r['family']}): {describe(found)}")


def describe(found: Mapping[str, Any]) -> str:
    """A candidate's `reuse` as a line: "tuning runs 3 of 4 measured, in a; final seeds 0-1
    measured at lr 0.003 in a: taken if tuning chooses lr 0.003"."""
    final, tuning = found["final"], found["tuning"]
    if tuning is None:
        got = final["measured"]
        where = f" ({_where(got)})" if got else ""
        return f"{len(got)} of {len(final['seeds'])} runs measured{where}"
    got = tuning["measured"]
    parts = [
        f"tuning runs {len(got)} of {tuning['runs']} measured"
        + (f", in {', '.join(sorted({m['study'] for m in got}))}" if got else "")
    ]
    settings: dict[str, list[dict[str, Any]]] = {}
    for m in final["measured"]:
        settings.setdefault(_label(m["setting"]), []).append(m)
    for label, runs in settings.items():
        seeds = [m["seed"] for m in runs]
        of = "" if len(seeds) == len(final["seeds"]) else f" (of {_span(final['seeds'])})"
        studies = sorted({m["study"] for m in runs})
        where = f"in {studies[0]}" if len(studies) == 1 else f"({_where(runs)})"
        parts.append(
            f"final {_seeds(seeds)}{of} measured at {label} {where}: taken if tuning chooses {label}"
        )
    if not settings:
        parts.append(
            f"final {_seeds(final['seeds'])}: none measured at a setting tuning can choose"
        )
    return "; ".join(parts)


def _where(runs: Sequence[Mapping[str, Any]]) -> str:
    """The seeds of `runs` by the study that measured them: "seeds 0-1 in a, seed 2 in b"."""
    by_study: dict[str, list[int]] = {}
    for m in runs:
        by_study.setdefault(m["study"], []).append(m["seed"])
    return ", ".join(f"{_seeds(s)} in {study}" for study, s in sorted(by_study.items()))


def _seeds(seeds: Sequence[int]) -> str:
    return f"seed{'s' if len(seeds) != 1 else ''} {_span(seeds)}"


def _span(seeds: Sequence[int]) -> str:
    """Seeds as runs of consecutive ones: "0-3, 5"."""
    out: list[list[int]] = []
    for s in sorted(seeds):
        if out and s == out[-1][-1] + 1:
            out[-1].append(s)
        else:
            out.append([s])
    return ", ".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in out)


def _label(setting: Mapping[str, Any]) -> str:
    """A tuned setting as the reports print it: "lr 0.006, warmup 0.05"."""
    return ", ".join(f"{k} {v:g}" if _number(v) else f"{k} {v}" for k, v in setting.items())


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)
