"""Search orchestration: Ray Tune drives the trials, Optuna chooses them, Parquet keeps them.

    space (YAML) -> define-by-run function -> OptunaSearch (sampler: optuna_study.py; the Optuna
    study persisted in <study>/_optuna.db, its metrics named, each trial carrying its row as
    attributes)
    -> Ray Tune (trials sized to the nodes: resources.py; concurrency limit, actor reuse, ASHA over
    training tokens for one objective that is reported during training; a trial whose worker or
    node is lost runs again) -> trainable.py: run_trial for each seed -> one Parquet row per attempt
    (rows.py, store/results.py), written by the trial itself where the results live (a folder, or
    a URI through pyarrow.fs).

Resume: the same --name continues a study. Rows in Parquet are the truth: finished trials are
never re-run, the Optuna study remembers them for the sampler, and trials left RUNNING by a
killed driver are closed (from their Parquet row if they finished) or failed and re-enqueued.
Damaged row files are set aside and their trials run again; rows kept aside when the disk was full
come back. Processes of a killed local Ray instance are found by their session directory and ended
(ray_session.claim: only a dead driver's).

Several drivers may run one study together, on one machine or several: each registers in the study
(roster.py), starts its own Ray, asks trials until the study's `trials:` are taken by all of
them (optuna_study.Quota), and closes only a dead driver's RUNNING trials. They share the Optuna
study through `--storage` (an RDB), or through the SQLite file beside rows in a local folder on
one machine (SQLite's file locks serialise its writers there). A study on a URI keeps its SQLite copy
per driver, which a second driver would overwrite: that one is refused, in one line.

The search stops early (SearchHalted, carrying a halt.Halt) when the results disk is full, no trial
can start on the cluster, Ray cannot start or loses its head, or the study's database does not
answer for --storage-wait (a shorter absence is ridden through: storage.py), or the user stops it
(Ctrl-C, which Ray Tune catches: ray_session.fit_interrupted); what is finished is kept, and the
message says how to go on.
"""

from __future__ import annotations

import math
import sys
import time
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import optuna

from benchmark.data import DataConfig, cache_root, prepare
from benchmark.recipe import parse_tokens
from benchmark.search import disk, loggers, optuna_study, ray_session, resume, reuse, roster
from benchmark.search.context import TrialContext
from benchmark.search.halt import INTERRUPTED, Halt, SearchHalted
from benchmark.search.live import LiveView
from benchmark.search.progress import Poll, start_board
from benchmark.search.rows import best_row
from benchmark.search.storage import STORAGE_WAIT_S, StorageUnavailable
from benchmark.space import first_points, seeds_message
from benchmark.store import (
    STUDY_FILE,
    code_version,
    finished_trials,
    location,
    metrics,
    read_study,
    read_study_info,
    speeds,
    trial_files,
    write_study_info,
)


@dataclass(frozen=True, kw_only=True)
class SearchOptions:
    name: str
    # a local or NFS folder, or a URI (s3://, gs://: pyarrow.fs)
    results_dir: str | Path = Path(location.RESULTS_ROOT)
    seed: int = 0
    seeds: int = 1  # train every chosen candidate with this many seeds
    # default: as many trials as the nodes hold (search/resources.py)
    concurrency: int | None = None
    cpus_per_trial: float | None = None  # default: the largest node's CPUs, shared by its trials
    # default: 1 when a node has GPUs (fractions share a GPU); >= 2: workers
    gpus_per_trial: float | None = None
    # a trial as a Ray Train job of this many workers (default: gpus if >= 2)
    workers_per_trial: int | None = None
    parallel: str = "auto"  # such a trial's wrapper: ddp, fsdp, or auto (trial/distributed.py)
    address: str | None = None  # an existing Ray cluster ("auto", "HOST:PORT")
    # an Optuna RDB URL; default: SQLite beside the rows (optuna_study.storage_url)
    storage: str | None = None
    # how long its database may be away: a restart, a failover (storage.py)
    storage_wait_s: float = STORAGE_WAIT_S
    time_budget_s: float | None = None
    retries: int = 1  # an exception is retried this many times, then recorded as failed
    node_retries: int = 3  # a trial whose worker or node is lost runs again elsewhere
    # stop, saying what is missing, when no trial starts for this long
    pending_timeout_s: float = 600.0
    data: DataConfig = field(default_factory=DataConfig)
    asha: bool = True  # successive halving over tokens when there is one objective
    checkpoints: bool = False  # keep each trial's weights under <study>/_checkpoints
    checkpoint_every: str | None = None  # runs save their state this often (trial/runstate.py)
    keep_checkpoints: bool = False  # keep a finished run's saved state under <study>/_runstate
    # each run a Ray task where it can be (search/dispatch.py, driver._per_run); False: a
    # candidate's runs in turn inside its trial
    runs_as_tasks: bool = True
    step_timeout: str | None = None  # end a run with no step for this long (trial/watchdog.py)
    sampler: str | None = None  # None: the study's recorded sampler, else "auto" (optuna_study.py)
    resume_command: str = ""  # how the user goes on after a stop, for the one line that says so
    # --rerun COLUMN=VALUE: the finished trials with a matching row train anew
    rerun: tuple[str, ...] = ()
    reuse_runs: tuple[str, ...] = ()  # studies whose measured runs stand for this one's (reuse.py)
    tensorboard: bool = False  # every trial's curve to TensorBoard too (search/loggers.py)
    mlflow: str | None = None  # ... and to MLflow: a folder (its SQLite store) or a tracking URI
    wandb: str | None = None  # ... and to Weights & Biases: the project

    @property
    def study_dir(self) -> str:
        return location.join(self.results_dir, self.name)


@dataclass(kw_only=True)
class SearchSummary:
    """What one driver's search did: the study's totals, and what this driver ran and wrote (other
    drivers of the study count their own)."""

    study_dir: str
    requested: int  # the study's `trials:`
    finished_before: int  # trials with rows when this driver started
    ran: int = 0  # trials this driver ran to their end
    rows: int = 0  # rows in the study now, every driver's
    statuses: dict[str, int] = field(default_factory=dict)
    wall_s: float = 0.0
    overhead_s: float | None = None
    best: dict[str, Any] | None = None  # rows.best_row: the ok row best at `ranked_by`
    # first objective, direction, count
    ranked_by: tuple[str, str, str] = ("val_loss", "min", "total")
    sampler: str | None = None
    storage: str | None = None  # --storage, when the study is not in SQLite beside the rows
    written: int = 0  # row files this driver wrote
    reused: int = 0  # ... of which runs taken from other studies (--reuse-runs)
    # the other drivers running the study when it began
    others: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # set-aside or recovered rows, a low disk
    progress_reads: int = 0  # reads of the trials' progress board that had news
    # For the next plan's estimate (_record_times): the driver's spans of its trials added up,
    # the data's preparation (once per node, then cached), and whether this search started its own
    # Ray on this machine and ran its trials there one at a time.
    busy_s: float = 0.0
    prepare_s: float = 0.0
    timed_here: bool = False


def run_search(
    space, opts: SearchOptions, console=None, policy: dict[str, Any] | None = None
) -> SearchSummary:
    """Run (or continue) a study until `space.trials` candidates have results. StudyError, with
    nothing written, for a space that is not the one the study declared or a study that cannot be
    shared as asked; SearchHalted when it stops early."""
    check_declared(space, opts)
    location.check_results(opts.study_dir)
    registry = roster.Registry(opts.study_dir, _storage_kind(opts))
    others = registry.others()
    roster.check_shared(registry, others, location.is_uri(opts.study_dir))
    slot = None if opts.address else ray_session.claim(opts.study_dir)
    ended = False
    try:
        registry.beat(force=True)
        summary = _search(space, opts, console, policy, registry, others, slot)
        ended = True
        return summary
    except StorageUnavailable as e:  # opening, preparing or closing the study: rows kept, resumable
        raise SearchHalted(Halt("storage", str(e))) from None
    finally:
        registry.end()
        if slot is not None:
            slot.release(tidy=ended)


def check_declared(space, opts: SearchOptions) -> None:
    """StudyError, writing nothing, when `space` is not the space the study declared."""
    optuna_study.check_declared(
        space,
        opts.seeds,
        read_study_info(opts.study_dir),
        location.join(opts.study_dir, STUDY_FILE),
        opts.name,
        first_seed=opts.seed,
    )
    final = range(opts.seed, opts.seed + opts.seeds)
    if space.tune and (shared := space.tune.shared(final)):
        raise optuna_study.StudyError(
            f"{space.source.file}: tune.seeds: {seeds_message(shared, final)} (--seed, --seeds)"
        )


def _storage_kind(opts: SearchOptions) -> str:
    return "rdb" if opts.storage else "sqlite-copy" if location.is_uri(opts.study_dir) else "sqlite"


def _search(space, opts: SearchOptions, console, policy, registry, others, slot) -> SearchSummary:
    t0 = time.perf_counter()
    notes, set_aside = resume.prepare_store(
        opts.study_dir, opts.storage, fallback_dir(opts), others, opts.rerun
    )
    before = set(trial_files(opts.study_dir))
    done = optuna_study.finished_numbers(finished_trials(opts.study_dir))
    names, modes = [n for n, _ in space.objectives], [m for _, m in space.objectives]
    study, storage = _open(space, opts, names, modes)
    resume.run_again(study, set_aside, done)
    sampler = optuna_study.resolve_sampler(
        opts.sampler, study.user_attrs.get("sampler"), space, len(names)
    )
    ctx = trial_context(space, opts, policy)
    resume.close_running(study, ctx, live={d.id for d in others})
    summary = SearchSummary(
        study_dir=opts.study_dir,
        requested=space.trials,
        finished_before=len(done),
        ranked_by=(names[0], modes[0], space.count),
        sampler=sampler,
        storage=opts.storage,
        notes=notes,
        others=[d.describe() for d in others],
    )
    quota = optuna_study.Quota(ctx.study_dir, space.trials)
    remaining = max(0, space.trials - quota.taken(study))
    if remaining == 0:
        return _finish(summary, opts, t0, before)
    asked: list[int] = []
    run = _Run(
        space=space,
        opts=opts,
        console=console,
        driving=_Driving(registry, slot, quota, asked),
        study=study,
        storage=storage,
        sampler=sampler,
        modes=modes,
        remaining=remaining,
    )
    try:
        halt = _run(run, ctx, summary)
    except Exception as e:  # the study database or Ray's state could not be written: a full disk?
        if not location.disk_full(e):
            raise
        halt = Halt(
            "store_full",
            f"{opts.study_dir}: the disk is full ({e.__class__.__name__} writing the study)",
        )
    finally:
        _mirror_quietly(opts)
    _finish(summary, opts, t0, before, asked)
    if halt:
        raise SearchHalted(
            replace(halt, message=f"{halt.message}; {disk.space_line(space, opts, remaining)}")
            if halt.kind == "store_full"
            else halt,
            summary,
        )
    _record_times(summary)
    return summary


@dataclass(frozen=True)
class _Driving:
    """This driver's share of a study that several may run: its registry entry, its Ray slot,
    the study's quota, and the trial numbers it asks (filled in as it runs)."""

    registry: roster.Registry
    slot: ray_session.Slot | None
    quota: optuna_study.Quota
    asked: list[int]


@dataclass(frozen=True, kw_only=True)
class _Run:
    """What _run and _tune carry through one driver's search: the space and its options, the
    Optuna study it asks and the trials it has left to ask."""

    space: Any
    opts: SearchOptions
    console: Any
    driving: _Driving
    study: Any  # the optuna.Study (optuna_study.open_study)
    storage: Any  # its storage, which Ray's searcher opens again
    sampler: str  # the sampler's name (optuna_study.resolve_sampler)
    modes: list[str]  # each objective's "min" or "max"
    remaining: int


def _mirror_quietly(opts: SearchOptions) -> None:
    try:
        optuna_study.mirror(opts.study_dir, opts.storage, push=True)
    except OSError as e:  # the rows are where they belong; the study copy is a convenience
        warnings.warn(f"could not copy the Optuna study to {opts.study_dir}: {e}", stacklevel=2)


def fallback_dir(opts: SearchOptions) -> str:
    """Where a trial keeps its row when the results disk is full: this search's temporary folder
    on the machine that ran it (`--resume` on the driver's machine brings such rows back)."""
    return ray_session.temp_dir(opts.study_dir) + "-rows"


def _open(space, opts: SearchOptions, names, modes):
    return optuna_study.open_study(
        optuna_study.storage_url(opts.study_dir, opts.storage),
        opts.name,
        names,
        [f"{m}imize" for m in modes],
        first_points(space),
        wait_s=opts.storage_wait_s,
    )


def _run(run: _Run, ctx: TrialContext, summary: SearchSummary) -> Halt | None:
    """Prepare the data, start Ray, size the trials to the nodes, run Tune; a Halt or None."""
    space, opts, study, driving = run.space, run.opts, run.study, run.driving
    disk.check_space(space, opts, run.remaining, summary, run.console)
    start = time.perf_counter()
    data = prepare(opts.data)  # tokenise once on this node, before any local worker needs the cache
    summary.prepare_s = time.perf_counter() - start
    info = study_info(space, opts, run.sampler, data)
    optuna_study.set_study_attrs(study, info)
    write_study_info(opts.study_dir, info)
    owned = False
    try:  # whatever happens, the Ray this search started ends (or disconnects) here
        try:
            owned = ray_session.start(opts.address, driving.slot)
        except ray_session.RayStartError as e:
            return Halt("ray", str(e))
        try:
            res = ray_session.trial_resources(
                opts.cpus_per_trial, opts.gpus_per_trial, opts.concurrency, opts.workers_per_trial
            )
        except ValueError as e:  # ResourcesError: no node can hold a trial
            return Halt("resources", str(e))
        ctx = replace(
            ctx,
            threads=res.threads,
            workers=res.worker_group(opts.parallel),
            progress=start_board(),
            run_resources=res.bundle() if _per_run(ctx, opts, res) else None,
        )
        seed = opts.seed + len(
            study.trials
        )  # a restored sampler's random state is not in the storage
        optuna_sampler = optuna_study.make_sampler(
            run.sampler, seed, len(run.modes), res.concurrency > 1, space.trials
        )
        watching = ray_session.watch_head(
            opts.address, driving.slot, lambda line: _say_stopped(opts, line), owned
        )
        try:
            view, halt = _tune(run, ctx, optuna_sampler, res)
        except Exception as e:
            if not ray_session.lost(e):
                raise
            return Halt(
                "ray", ray_session.failure(e, opts.address, driving.slot, "lost its head node")
            )
        finally:
            watching.set()
        alone = owned and not opts.address and res.concurrency == 1 and opts.time_budget_s is None
        _account(summary, view, timed=alone)
    finally:
        ray_session.stop(owned)

    # after a full disk or a storage away, trials stay RUNNING: --resume closes them
    if not halt or halt.kind not in ("store_full", "storage"):
        resume.close_running(
            optuna.load_study(study_name=opts.name, storage=run.storage),
            ctx,
            live={d.id for d in driving.registry.others()},
        )
    return halt


def _account(summary: SearchSummary, view, timed: bool) -> None:
    """What the live view saw, into the summary. `timed`: the trials ran one at a time on a Ray
    this search started, on this machine, without --time-budget."""
    summary.ran, summary.overhead_s = view.finished, view.overhead_s()
    summary.progress_reads, summary.busy_s = view.progress_reads, sum(view.spans)
    # A trial that Tune stopped at --time-budget, or a node retry's first attempt, has no
    # span: its time would count as the search's own.
    summary.timed_here = timed and not view.running


def _say_stopped(opts: SearchOptions, line: str) -> None:
    """The one line of a driver that ends at once (its Ray's head is gone), as the search command's."""
    then = f"; then: {opts.resume_command}" if opts.resume_command else "; then resume the study"
    print(f"shapebench search: {opts.name}: stopped: {line}{then}", file=sys.stderr, flush=True)


def _record_times(summary: SearchSummary) -> None:
    """What this search spent outside its trials, for the next `--plan` here (store/speeds.py):
    its start and end (from run_search's start: the store's checks, opening the study, Ray's start
    and the first worker's imports, Ray's end, reading the rows; space.plan.SEARCH_START_S), the
    data's preparation left out, as later searches find it cached, and the driver's time around
    each trial. Recorded only where the trials ran one at a time on a Ray this search started,
    without --time-budget, and every trial that started ended, so that their spans add up to the
    time they took on this machine."""
    if not summary.timed_here or summary.overhead_s is None:  # None: no trial reported its wall
        return
    speeds.record_search(
        speeds.path_in(cache_root()),
        summary.wall_s - summary.busy_s - summary.prepare_s,
        summary.overhead_s,
    )


def trial_context(space, opts: SearchOptions, policy=None) -> TrialContext:
    """What every trial of this search shares, before Ray sizes them (threads, workers): the runs'
    training settings, and the runs it takes (--reuse-runs; a plan's too: search/reuse_plan.py)."""
    names = [n for n, _ in space.objectives]
    return _context(space, opts, names, policy, asha=_asha(space, opts, names))


def _context(space, opts: SearchOptions, names: list[str], policy, asha: bool) -> TrialContext:
    return TrialContext(
        study=opts.name,
        study_dir=location.absolute(opts.study_dir),
        fallback_dir=fallback_dir(opts),
        data=opts.data,
        training={**space.training, "eval_every": _eval_every(space) if asha else 0},
        quantize=space.quantize,
        count=space.count,
        objectives=tuple(names),
        seed=opts.seed,
        seeds=opts.seeds,
        retries=opts.retries,
        checkpoints=opts.checkpoints,
        checkpoint_every=opts.checkpoint_every,
        keep_checkpoints=opts.keep_checkpoints,
        step_timeout=opts.step_timeout,
        policy=policy or {},
        tune=space.tune,
        report_curves=opts.tensorboard or bool(opts.mlflow) or bool(opts.wandb),
        diverged=space.diverged,
        reuse=reuse.index(opts.reuse_runs, opts.study_dir) if opts.reuse_runs else {},
    )


def _per_run(ctx: TrialContext, opts: SearchOptions, res) -> bool:
    """Each run its own Ray task (search/dispatch.py), unless its curve goes to Tune point by point
    (--tensorboard, --mlflow, --wandb), it is a Train job of several workers, or --concurrency
    bounds the trials at once: tasks are bounded by the resources alone, and `--concurrency N`
    keeps its meaning, N trials (each its runs in turn) at once."""
    return (
        opts.runs_as_tasks
        and opts.concurrency is None
        and res.workers == 1
        and not ctx.report_curves
    )


def _asha(space, opts: SearchOptions, names: list[str]) -> bool:
    """Successive halving, unless the space says `pruner: none`, needs one objective that the trial
    reports while it trains."""
    return (
        opts.asha
        and space.pruner == "asha"
        and len(names) == 1
        and metrics.BY_NAME[names[0]].intermediate
    )


def _tune(run: _Run, ctx: TrialContext, sampler, res):
    """Ray Tune over the trials Optuna's `sampler` chooses, `res` (ray_session.trial_resources)
    each; the live view, and a Halt or None."""
    # Ray Tune and the modules built on it load only when a search runs: the checks before it
    # (and `--plan`) stay light.
    from ray import tune
    from ray.tune.search import ConcurrencyLimiter

    from benchmark.search.callback import SearchCallback, StopAll
    from benchmark.search.searcher import make_searcher
    from benchmark.search.trainable import trainable

    space, opts, modes, driving = run.space, run.opts, run.modes, run.driving
    searcher = make_searcher(
        optuna_study.Sample(space),
        ctx,
        sampler,
        modes,
        run.storage,
        driver=driving.registry.me.id,
        quota=driving.quota,
    )
    searcher.asked = driving.asked  # the driver's list: what this search asked, for its summary
    scheduler = _scheduler(space, ctx, modes) if ctx.training["eval_every"] else None
    view = LiveView(
        run.console,
        opts.name,
        run.remaining,
        ctx.objectives[0],
        maximize=modes[0] == "max",
        seeds=ctx.seeds,
        first_seed=ctx.seed,
        tune=ctx.tune,
    )
    callback = SearchCallback(
        view,
        ctx,
        opts.pending_timeout_s,
        asks=res.describe(),
        searcher=searcher,
        poll=Poll(ctx.progress),
        beat=driving.registry.beat,
    )
    tuner = tune.Tuner(
        tune.with_resources(tune.with_parameters(trainable, ctx=ctx), _bundle(ctx, res)),
        tune_config=tune.TuneConfig(
            search_alg=ConcurrencyLimiter(searcher, max_concurrent=res.concurrency),
            scheduler=scheduler,
            num_samples=run.remaining,
            # a Train job's trial ends only with its actor: a stopped one would block reuse
            reuse_actors=ctx.workers is None,
            time_budget_s=opts.time_budget_s,
        ),
        # Ray Tune keeps its state beside the rows (through pyarrow.fs for a URI, as the rows)
        run_config=tune.RunConfig(
            name="_ray",
            storage_path=ctx.study_dir,
            verbose=0,
            stop=StopAll(callback),
            callbacks=[
                callback,
                *loggers.callbacks(opts.tensorboard, opts.mlflow, opts.name, opts.wandb),
            ],
            log_to_file=False,
            failure_config=tune.FailureConfig(max_failures=opts.node_retries),
        ),
    )
    with view, ray_session.quiet_full_disk():
        interrupted = ray_session.fit_interrupted(tuner.fit)
    stopped = Halt("interrupted", INTERRUPTED) if interrupted else None
    return view, callback.halt or searcher.halt or stopped


# What a trial that trains nothing itself asks for: Tune refuses a trial that asks for nothing,
# and 1 MiB of memory stands for it (as resources.TrialResources.bundle for a Train job's trial).
IDLE = {"cpu": 0, "memory": 2**20}


def _bundle(ctx: TrialContext, res) -> dict[str, float]:
    """What a trial asks for: a run's resources, or nothing when its runs are Ray tasks (theirs)."""
    return res.bundle() if ctx.run_resources is None else IDLE


def _scheduler(space, ctx: TrialContext, modes):
    """ASHA's successive halving over training tokens, on the first objective."""
    from ray.tune.schedulers import ASHAScheduler  # Ray only when a search runs (as _tune)

    total = _total_tokens_hint(space)
    return ASHAScheduler(
        time_attr="tokens",
        metric=ctx.objectives[0],
        mode=modes[0],
        max_t=total,
        grace_period=max(1, total // 8),
        reduction_factor=3,
    )


def study_info(space, opts: SearchOptions, sampler: str, data) -> dict[str, Any]:
    """What the study declared and ran on: Optuna study attributes and <study>/_study.json."""
    return {
        "space": space.name,
        "space_file": space.source.file,
        "description": space.description,
        "trials": space.trials,
        "sampler": sampler,
        "seeds": opts.seeds,
        "seed": opts.seed,
        "code_version": code_version(),
        "dataset_id": data.dataset_id,
        "tokenizer_id": data.tokenizer.tokenizer_id,
        "overrides": list(space.overrides),
        **optuna_study.declaration(space),
    }


def _total_tokens_hint(space) -> int:
    """ASHA's max_t: the training token budget when absolute, else a large bound."""
    return parse_tokens(space.training_value("tokens")).resolve(space.budget or 1)


def _eval_every(space) -> int:
    """Steps between intermediate evaluations: about 8 per trial, so ASHA has rungs to cut at."""
    tokens = _total_tokens_hint(space)
    per_step = math.prod(space.training_value(k) for k in ("batch_size", "seq_len", "grad_accum"))
    return max(1, tokens // per_step // 8)


def _finish(
    summary: SearchSummary, opts: SearchOptions, t0: float, before: set[str], asked: list[int] = ()
) -> SearchSummary:
    mine = set(asked)
    new = {
        f for f in set(trial_files(opts.study_dir)) - before if optuna_study.trial_number(f) in mine
    }
    summary.written = len(new)
    df = read_study(opts.study_dir)
    summary.reused = reuse.taken_in(opts.study_dir, df, new)
    summary.rows = len(df)
    summary.statuses = df["status"].value_counts().to_dict() if len(df) else {}
    summary.best = best_row(df[df["status"] == "ok"] if len(df) else df, *summary.ranked_by)
    summary.wall_s = time.perf_counter() - t0
    return summary
