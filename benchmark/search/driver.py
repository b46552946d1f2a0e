"""Search orchestration: Ray Tune drives the trials, Optuna chooses them, Parquet keeps them.

    space (YAML) -> define-by-run function -> OptunaSearch (sampler: study.py; the Optuna study
    persisted in <study>/_optuna.db, its metrics named, each trial carrying its row as attributes)
    -> Ray Tune (concurrency limit, actor reuse, ASHA over training tokens for one objective that
    is reported during training) -> trainable.py: run_trial for each seed -> one Parquet row per
    attempt (rows.py, store/results.py), written by the trial itself.

Resume: the same --name continues a study. Rows in Parquet are the truth: finished trials are
never re-run, the Optuna study remembers them for the sampler, and trials left RUNNING by a
killed driver are closed (from their Parquet row if they finished) or failed and re-enqueued.
Processes of a killed local Ray instance are found by their session directory and ended.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from benchmark.data import DataConfig
from benchmark.search import ray_session
from benchmark.search import study as studies
from benchmark.search.context import TrialContext
from benchmark.search.study import OPTUNA_DB  # noqa: F401  (re-exported: where the study lives)
from benchmark.store import metrics
from benchmark.store.results import finished_trials, read_study, sweep_orphans
from benchmark.store.study import write_study_info


@dataclass(frozen=True, kw_only=True)
class SearchOptions:
    name: str
    results_dir: Path = Path("results")
    seed: int = 0
    seeds: int = 1                   # train every chosen candidate with this many seeds
    concurrency: int | None = None   # default: one trial per GPU, else one at a time (it uses every core)
    address: str | None = None       # an existing Ray cluster ("auto", "HOST:PORT")
    time_budget_s: float | None = None
    retries: int = 1                 # an exception is retried this many times, then recorded as failed
    data: DataConfig = field(default_factory=DataConfig)
    asha: bool = True                # successive halving over tokens when there is one objective
    checkpoints: bool = False        # keep each trial's weights under <study>/_checkpoints
    sampler: str | None = None       # None: the study's recorded sampler, else "auto" (study.py)

    @property
    def study_dir(self) -> Path:
        return Path(self.results_dir) / self.name


@dataclass
class SearchSummary:
    study_dir: Path
    requested: int
    finished_before: int
    ran: int
    rows: int
    statuses: dict[str, int]
    wall_s: float
    overhead_s: float | None
    best: dict[str, Any] | None
    sampler: str | None = None


def run_search(space, opts: SearchOptions, console=None, policy: dict[str, Any] | None = None) -> SearchSummary:
    """Run (or continue) a study until `space.trials` candidates have results."""
    import optuna

    from benchmark.data import prepare
    from benchmark.space.candidates import grid

    t0 = time.perf_counter()
    opts.study_dir.mkdir(parents=True, exist_ok=True)
    sweep_orphans(opts.study_dir)
    done = studies.finished_numbers(finished_trials(opts.study_dir))
    names = [name for name, _ in space.objectives]
    modes = [mode for _, mode in space.objectives]
    study, storage = studies.open_study(opts.study_dir, opts.name, names, [f"{m}imize" for m in modes],
                                        grid(space, limit=space.trials) or [])
    sampler = studies.resolve_sampler(opts.sampler, study.user_attrs.get("sampler"), space, len(names))
    ctx = _context(space, opts, names, policy, asha=_asha(space, opts, names))
    studies.close_running(study, ctx)
    summary = SearchSummary(opts.study_dir, space.trials, len(done), 0, 0, {}, 0.0, None, None, sampler)
    remaining = max(0, space.trials - len(done))
    if remaining == 0:
        return _finish(summary, opts, t0)
    data = prepare(opts.data)  # tokenise once, before any worker needs the cache
    info = study_info(space, opts, sampler, data)
    studies.set_study_attrs(study, info)
    write_study_info(opts.study_dir, info)
    ray_session.start(opts.address, opts.study_dir)
    concurrency, per_trial = ray_session.per_trial_resources(opts.concurrency)
    ctx = replace(ctx, threads=per_trial["cpu"])
    seed = opts.seed + len(study.trials)  # a restored sampler's random state is not in the storage
    optuna_sampler = studies.make_sampler(sampler, seed, len(names), concurrency > 1, space.trials)
    view = _tune(space, opts, ctx, modes, optuna_sampler, storage, concurrency, per_trial, remaining, console)
    summary.ran, summary.overhead_s = view.finished, view.overhead_s()
    import ray

    ray.shutdown()
    studies.close_running(optuna.load_study(study_name=opts.name, storage=storage), ctx)
    return _finish(summary, opts, t0)


def _context(space, opts: SearchOptions, names: list[str], policy, asha: bool) -> TrialContext:
    return TrialContext(study=opts.name, study_dir=str(opts.study_dir.resolve()), data=opts.data,
                        training={**space.training, "eval_every": _eval_every(space) if asha else 0},
                        count=space.count, objectives=tuple(names), seed=opts.seed, seeds=opts.seeds,
                        retries=opts.retries, checkpoints=opts.checkpoints, policy=policy or {})


def _asha(space, opts: SearchOptions, names: list[str]) -> bool:
    """Successive halving needs one objective that the trial reports while it trains."""
    return opts.asha and len(names) == 1 and metrics.BY_NAME[names[0]].intermediate


def _tune(space, opts, ctx, modes, sampler, storage, concurrency, per_trial, remaining, console):
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler
    from ray.tune.search import ConcurrencyLimiter

    from benchmark.search.callback import SearchCallback
    from benchmark.search.live import LiveView
    from benchmark.search.searcher import make_searcher
    from benchmark.search.trainable import trainable

    searcher = make_searcher(studies.Sample(space), ctx, sampler, modes, storage)
    scheduler = None
    if ctx.training["eval_every"]:
        total = _total_tokens_hint(space)
        scheduler = ASHAScheduler(time_attr="tokens", metric=ctx.objectives[0], mode=modes[0], max_t=total,
                                  grace_period=max(1, total // 8), reduction_factor=3)
    view = LiveView(console, opts.name, remaining, ctx.objectives[0], maximize=modes[0] == "max")
    tuner = tune.Tuner(
        tune.with_resources(tune.with_parameters(trainable, ctx=ctx), per_trial),
        tune_config=tune.TuneConfig(search_alg=ConcurrencyLimiter(searcher, max_concurrent=concurrency),
                                    scheduler=scheduler, num_samples=remaining, reuse_actors=True,
                                    time_budget_s=opts.time_budget_s),
        run_config=tune.RunConfig(name="_ray", storage_path=str(opts.study_dir.resolve()), verbose=0,
                                  callbacks=[SearchCallback(view, ctx)], log_to_file=False),
    )
    with view:
        tuner.fit()
    return view


def study_info(space, opts: SearchOptions, sampler: str, data) -> dict[str, Any]:
    """What the study declared and ran on: Optuna study attributes and <study>/_study.json."""
    from benchmark.store.provenance import code_version

    return {"space": space.name, "description": space.description, "budget": space.budget,
            "count": space.count, "tolerance": space.tolerance, "trials": space.trials,
            "objectives": [list(o) for o in space.objectives], "sampler": sampler, "seeds": opts.seeds,
            "seed": opts.seed, "code_version": code_version(), "dataset_id": data.dataset_id,
            "tokenizer_id": data.tokenizer.tokenizer_id, "training": dict(space.training)}


def _total_tokens_hint(space) -> int:
    """ASHA's max_t: the training token budget when absolute, else a large bound."""
    from benchmark.space.budget import parse_tokens

    return parse_tokens(space.training.get("tokens", "20x")).resolve(space.budget or 1)


def _eval_every(space) -> int:
    """Steps between intermediate evaluations: about 8 per trial, so ASHA has rungs to cut at."""
    tokens = _total_tokens_hint(space)
    per_step = space.training.get("batch_size", 16) * space.training.get("seq_len", 256)
    return max(1, tokens // per_step // 8)


def _finish(summary: SearchSummary, opts: SearchOptions, t0: float) -> SearchSummary:
    df = read_study(opts.study_dir)
    summary.rows = len(df)
    summary.statuses = df["status"].value_counts().to_dict() if len(df) else {}
    ok = df[df["status"] == "ok"] if len(df) else df
    if len(ok):
        best = ok.sort_values("val_loss").iloc[0]
        summary.best = {k: best[k] for k in ("trial_id", "family", "structure", "params_total", "val_loss", "val_ppl")}
    summary.wall_s = time.perf_counter() - t0
    return summary
