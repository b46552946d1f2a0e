"""Search orchestration: Ray Tune drives the trials, Optuna chooses them, Parquet keeps them.

    space (YAML) -> define-by-run function -> OptunaSearch (TPE, or NSGA-II for several
    objectives; the Optuna study persisted in <study>/_optuna.db) -> Ray Tune (concurrency
    limit, actor reuse, ASHA over training tokens for one objective) -> trainable: run_trial for
    each seed -> one Parquet row per attempt (results.py), written by the trial itself.

Resume: the same --name continues a study. Rows in Parquet are the truth: finished trials are
never re-run, the Optuna study remembers them for the sampler, and trials left RUNNING by a
killed driver are closed (from their Parquet row if they finished) or failed and re-enqueued.
Processes of a killed local Ray instance are found by their session directory and ended.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import signal
import statistics
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmark.data import DataConfig
from benchmark.store.results import (
    finished_trials,
    read_study,
    sweep_orphans,
    write_row,
)

log = logging.getLogger(__name__)

OPTUNA_DB = "_optuna.db"
# Quiet Ray by default: no experiment banner, no TensorBoard/CSV loggers, no dashboard.
for _k, _v in (("RAY_AIR_NEW_OUTPUT", "0"), ("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1"),
               ("RAY_DEDUP_LOGS", "1"), ("TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S", "1000")):
    os.environ.setdefault(_k, _v)
METRIC_COLUMNS = {"val_loss": "val_loss", "val_ppl": "val_ppl", "val_ppl_int4": "val_ppl_int4",
                  "flops": "flops_per_token_train", "int4_bytes": "int4_bytes"}


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


# ---- metrics and objectives -----------------------------------------------------------------

def objective_metrics(space) -> tuple[list[str], list[str]]:
    """(metric names as reported to Tune, modes). `params` means the space's counted parameters."""
    names, modes = [], []
    for name, mode in space.objectives:
        names.append(name)
        modes.append(mode)
    return names, modes


def row_metrics(row: dict[str, Any], count: str) -> dict[str, float]:
    """The values a trial reports to Tune (and hence to Optuna) from its results row."""
    out = {"params": float(row.get(f"params_{count}") or row.get("params_total") or math.nan)}
    for name, col in METRIC_COLUMNS.items():
        value = row.get(col)
        out[name] = float(value) if value is not None else math.nan
    return out


# ---- the trainable (runs in a Ray worker) -----------------------------------------------------

def _train_config(training: dict[str, Any], count: str, seed: int, policy: dict[str, Any]):
    from benchmark.trial.config import TrainConfig

    return TrainConfig.from_dict({**training, "tokens_per": count, "seed": seed, **policy})


def trial_id(number: int, ctx: dict[str, Any], seed: int) -> str:
    """A trial's name in the results: its Optuna number, plus the seed when there are several."""
    return f"t{number:04d}" + (f"-s{seed}" if ctx["seeds"] > 1 else "")


def trainable(config: dict[str, Any], ctx: dict[str, Any]) -> None:
    """Train one candidate (for every seed), write its rows, report to Tune."""
    import torch
    from ray import tune

    from benchmark.data import prepare
    from benchmark.trial.run import run_trial

    torch.set_num_threads(max(1, int(ctx["threads"])))
    number = int(config["optuna_trial"])
    if "infeasible" in config:  # the sampled point has no candidate within the budget
        write_row(ctx["study_dir"], {"study": ctx["study"], "trial_id": trial_id(number, ctx, ctx["seed"]), "optuna_trial": number,
                                     "status": "failed", "error": config["infeasible"], "seed": ctx["seed"]})
        raise RuntimeError(config["infeasible"])
    data = prepare(ctx["data"])
    results = []
    for k in range(ctx["seeds"]):
        seed = ctx["seed"] + k
        cfg = _train_config(ctx["training"], ctx["count"], seed, ctx["policy"])
        report = (lambda rec: tune.report({"tokens": rec["tokens"], "val_loss": rec["val_loss"],
                                           "val_ppl": rec["val_ppl"], "row_written": False})) if k == 0 else None
        row = _attempts(config, ctx, trial_id(number, ctx, seed), cfg, data, report, run_trial)
        results.append(row)
    ok = [r for r in results if r["status"] == "ok"]
    if not ok:  # Optuna has no value for it: the trial ends as an error (FAIL); its rows are written
        raise RuntimeError(f"trial {number}: {results[-1]['status']}: {results[-1]['error']}")
    metrics = {name: statistics.fmean(row_metrics(r, ctx["count"])[name] for r in ok)
               for name in ("val_loss", "val_ppl", "params", "flops", "val_ppl_int4", "int4_bytes")}
    tune.report({**metrics, "tokens": max(r.get("tokens_trained") or 0 for r in results),
                 "row_written": True, "status": "ok", "trial_wall_s": sum(r.get("wall_s") or 0 for r in results)})


def _attempts(config, ctx, trial_id, cfg, data, report, run_trial) -> dict[str, Any]:
    """Run a trial with bounded retries; every attempt leaves a row."""
    base = {"study": ctx["study"], "trial_id": trial_id, "optuna_trial": int(config["optuna_trial"]),
            "axes": json.dumps({k: v for k, v in config.items() if k not in ("spec", "optuna_trial")}, default=str),
            "budget": config.get("budget"), "budget_count": config.get("count"),
            "budget_distance": config.get("budget_distance")}
    ckpt = Path(ctx["study_dir"]) / "_checkpoints" / trial_id if ctx["checkpoints"] else None
    for attempt in range(ctx["retries"] + 1):
        started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        try:
            row = run_trial(config["spec"], cfg, data=data, on_eval=report, checkpoint_dir=ckpt)
        except Exception as e:  # recorded, then retried: a search never dies with one candidate
            tb = traceback.format_exc(limit=8)
            row = {"status": "failed", "error": f"{type(e).__name__}: {e}\n{tb[-1500:]}", "started_at": started,
                   "family": config.get("family"), "spec": json.dumps(config["spec"], sort_keys=True), "seed": cfg.seed}
        row = {**row, **base, "attempt": attempt}
        write_row(ctx["study_dir"], row)
        if row["status"] != "failed":
            return row
    return row


# ---- the driver -----------------------------------------------------------------------------

def _ray_temp_dir(study_dir: Path) -> str:
    """A per-study session directory (short: Ray's unix socket paths are limited to ~107 chars),
    so the processes of a killed run of this study can be found and ended."""
    digest = hashlib.sha1(str(study_dir.resolve()).encode()).hexdigest()[:10]
    return os.path.join(tempfile.gettempdir(), f"sbray-{digest}")


def end_stale_ray(temp_dir: str) -> list[int]:
    """End processes whose command line names this study's Ray session directory."""
    killed = []
    for pid in ray_processes(temp_dir):
        if pid == os.getpid():
            continue
        try:
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        except OSError:
            pass
    return killed


def ray_processes(temp_dir: str) -> list[int]:
    pids = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if temp_dir in (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                pids.append(int(proc.name))
        except OSError:
            continue
    return pids


def _start_ray(opts: SearchOptions, temp_dir: str | None):
    import ray

    if ray.is_initialized():
        return
    common = dict(log_to_driver=False, logging_level=logging.ERROR, configure_logging=True)
    if opts.address:
        ray.init(address=opts.address, **common)
    else:
        ray.init(include_dashboard=False, num_cpus=os.cpu_count(), object_store_memory=256 * 1024 ** 2,
                 _temp_dir=temp_dir, **common)


def _trial_numbers(finished: dict[str, dict]) -> dict[int, list[dict]]:
    """Optuna trial number -> its finished rows (one per seed)."""
    out: dict[int, list[dict]] = {}
    for row in finished.values():
        number = row.get("optuna_trial")
        if number is not None and number == number:  # skips NaN (rows written outside a search)
            out.setdefault(int(number), []).append(row)
    return out


def _open_study(opts: SearchOptions, names: list[str], directions: list[str], finished: dict[str, dict],
                grid_points: list[dict[str, Any]] = ()):
    """Load or create the persisted Optuna study (a new one starts with the points of a finite
    space enqueued, so a sampler never repeats a candidate while others are untried) and close
    what a killed driver left open."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = optuna.storages.RDBStorage(f"sqlite:///{(opts.study_dir / OPTUNA_DB).resolve()}")
    study = optuna.create_study(storage=storage, study_name=opts.name, directions=directions, load_if_exists=True)
    if not study.trials:
        for point in grid_points:  # a finite space is covered once before anything repeats
            study.enqueue_trial(point)
    _close_running(study, names, finished)
    return storage


def _close_running(study, names: list[str], finished: dict[str, dict]) -> None:
    """No Optuna trial stays RUNNING: one with Parquet rows is told its values (or failed if none
    was ok); one without rows never finished and is failed and enqueued to run again."""
    from optuna.trial import TrialState

    by_number = _trial_numbers(finished)
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        rows = by_number.get(t.number, [])
        ok = [r for r in rows if r["status"] == "ok"]
        if ok:
            values = [statistics.fmean(row_metrics(r, r.get("budget_count") or "total")[n] for r in ok) for n in names]
            study.tell(t.number, values if len(values) > 1 else values[0])
        else:
            study.tell(t.number, state=TrialState.FAIL)
            if not rows:  # it never finished: run it again
                study.enqueue_trial(t.params)


class _Sample:
    """The space's define-by-run function, tagged with the Optuna trial number (which names the
    trial's rows). A class, not a closure: Tune pickles the searcher into its experiment state."""

    def __init__(self, space):
        self.space = space

    def __call__(self, trial) -> dict[str, Any]:
        from benchmark.space.candidates import define_by_run
        from benchmark.space.language import SpaceError

        try:
            return {**define_by_run(self.space)(trial), "optuna_trial": trial.number}
        except SpaceError as e:  # recorded as a failed trial, not a crashed search
            return {"optuna_trial": trial.number, "infeasible": str(e)}


def run_search(space, opts: SearchOptions, console=None, policy: dict[str, Any] | None = None) -> SearchSummary:
    """Run (or continue) a study until `space.trials` candidates have results."""
    import optuna
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler
    from ray.tune.search import ConcurrencyLimiter
    from ray.tune.search.optuna import OptunaSearch

    from benchmark.data import prepare
    from benchmark.search.live import LiveView
    from benchmark.space.candidates import grid

    t0 = time.perf_counter()
    opts.study_dir.mkdir(parents=True, exist_ok=True)
    sweep_orphans(opts.study_dir)
    finished = finished_trials(opts.study_dir)
    done = _trial_numbers(finished)
    remaining = max(0, space.trials - len(done))
    names, modes = objective_metrics(space)
    directions = ["minimize" if m == "min" else "maximize" for m in modes]
    storage = _open_study(opts, names, directions, finished, grid(space, limit=space.trials) or [])
    summary = SearchSummary(opts.study_dir, space.trials, len(done), 0, 0, {}, 0.0, None, None)
    if remaining == 0:
        return _finish(summary, opts, t0)

    prepare(opts.data)  # tokenise once, before any worker needs the cache
    temp_dir = None if opts.address else _ray_temp_dir(opts.study_dir)
    if temp_dir:
        end_stale_ray(temp_dir)
    _start_ray(opts, temp_dir)
    import ray

    gpus = int(ray.cluster_resources().get("GPU", 0))
    cpus = int(ray.cluster_resources().get("CPU", 1))
    concurrency = opts.concurrency or max(1, gpus)
    per_trial = {"cpu": max(1, cpus // concurrency), "gpu": 1 if gpus else 0}
    sampler = (optuna.samplers.TPESampler(seed=opts.seed) if len(names) == 1
               else optuna.samplers.NSGAIISampler(seed=opts.seed, population_size=max(4, min(20, space.trials // 2))))
    searcher = OptunaSearch(space=_Sample(space), metric=names if len(names) > 1 else names[0],
                            mode=modes if len(modes) > 1 else modes[0], sampler=sampler,
                            study_name=opts.name, storage=storage)
    scheduler = None
    if opts.asha and len(names) == 1 and names[0] in ("val_loss", "val_ppl"):
        total = _total_tokens_hint(space)
        scheduler = ASHAScheduler(time_attr="tokens", metric=names[0], mode=modes[0], max_t=total,
                                  grace_period=max(1, total // 8), reduction_factor=3)
    ctx = {"study": opts.name, "study_dir": str(opts.study_dir.resolve()), "data": opts.data,
           "training": {**space.training, "eval_every": _eval_every(space) if scheduler else 0},
           "count": space.count, "seeds": opts.seeds, "seed": opts.seed, "retries": opts.retries,
           "threads": per_trial["cpu"], "checkpoints": opts.checkpoints, "policy": policy or {}}
    view = LiveView(console, opts.name, remaining, names[0])
    tuner = tune.Tuner(
        tune.with_resources(tune.with_parameters(trainable, ctx=ctx), per_trial),
        tune_config=tune.TuneConfig(search_alg=ConcurrencyLimiter(searcher, max_concurrent=concurrency),
                                    scheduler=scheduler, num_samples=remaining, reuse_actors=True,
                                    time_budget_s=opts.time_budget_s),
        run_config=tune.RunConfig(name="_ray", storage_path=str(opts.study_dir.resolve()), verbose=0,
                                  callbacks=[view.callback(opts, ctx)], log_to_file=False),
    )
    with view:
        tuner.fit()
    summary.ran = view.finished
    summary.overhead_s = view.overhead_s()
    ray.shutdown()
    _close_running(optuna.load_study(study_name=opts.name, storage=storage), names, finished_trials(opts.study_dir))
    return _finish(summary, opts, t0)


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
