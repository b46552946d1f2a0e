"""What a driver does with what it finds when it starts on a study: the store made ready (rows a
killed writer left half-written, damaged or superseded row files set aside, rows kept elsewhere
when the disk was full), trials left RUNNING by a driver that ended closed, trials short of the
study's seeds continued, and the candidates whose rows were set aside run again."""

from __future__ import annotations

import time
from datetime import datetime
from typing import Sequence

from benchmark.search import roster, rows, tuning
from benchmark.search.context import STATE_DIR, TrialContext
from benchmark.search.optuna_study import DRIVER, StudyError, mirror, trial_number
from benchmark.space import select
from benchmark.store import location, quarantine, read_study, recover, sweep_orphans


def prepare_store(
    study_dir: str,
    storage: str | None,
    fallback: str,
    others: Sequence = (),
    rerun: Sequence[str] = (),
) -> tuple[list[str], list[str]]:
    """Before any training: the results location is usable (ResultsPathError otherwise), rows
    and runs' saved states (<study>/_runstate) a killed writer left half-written are removed
    (while another driver runs the study, only old ones: its own may be mid-write), damaged row
    files are set aside in <study>/_quarantine (their trials run again), so are those `--rerun`
    names (supersede), rows kept in the fallback folder when the disk was full are brought back,
    and a study kept by another driver is fetched (optuna_study.mirror). Returns the notes for
    the summary and the set-aside files."""
    location.check_results(study_dir)
    # a run killed mid-save leaves its state's temporary too; another driver's run may be saving
    sweep_orphans(study_dir, older_than_s=600.0 if others else 0.0, also=[STATE_DIR])
    set_aside = quarantine(study_dir)
    notes = [f"set aside damaged row file {p} (its trial runs again)" for p in set_aside]
    if rerun:
        moved = supersede(study_dir, rerun, others)
        set_aside += moved
        notes.append(
            f"--rerun {' '.join(rerun)}: the rows of {len({trial_number(p) for p in moved})} trials moved "
            f"to {location.join(study_dir, SUPERSEDED)}/; they run again"
        )
    notes += [
        f"recovered row {name} kept in {fallback} when the disk was full"
        for name in recover(study_dir, fallback)
    ]
    mirror(study_dir, storage, push=False)
    return notes, set_aside


def close_running(study, ctx: TrialContext, live: set[str] = frozenset()) -> None:
    """No trial of a driver that has ended stays RUNNING: one with a final row for every seed is
    told its values (or failed if none was ok); one stopped part-way through its seeds is failed,
    its rows kept, and continued (continue_unfinished); one without rows never finished and is
    failed and enqueued to run again (continuing it when it has tuning rows: search/tuning.py). The
    trials of the `live` drivers (ids: roster.Driver.id) are theirs to finish, and so is one not yet
    tagged with its driver that started within roster.GRACE_S while another driver lives: a driver
    asks (or claims) a trial, RUNNING at once, and names itself on it in a second write
    (searcher.AttributedSearch._own), so a driver starting between the two would take a live one's
    trial for an orphan. (Optuna stamps `datetime_start` with the asking machine's local clock.)"""
    from optuna.trial import TrialState

    now = datetime.now()
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if t.user_attrs.get(DRIVER) in live or (live and _just_asked(t, now)):
            continue
        earlier = list(t.user_attrs.get(rows.CONTINUES) or ())
        found = rows.trial_rows(ctx.study_dir, t.number, earlier)
        for key, value in rows.user_attrs(found).items():
            study._storage.set_trial_user_attr(t._trial_id, key, value)
        finished = rows.finished_seeds(found, ctx.retries)
        if (
            found
            and set(finished) >= set(ctx.seed_list())
            and any(r["status"] == "ok" for r in found)
        ):
            study.tell(t.number, rows.values(found, ctx.objectives, ctx.count))
        else:
            study.tell(t.number, state=TrialState.FAIL)
            if not found and tuning.files_of(
                ctx.study_dir, t.number
            ):  # killed while tuning: its runs are kept
                study.enqueue_trial(t.params, user_attrs={rows.CONTINUES: [*earlier, t.number]})
            elif not found and not waiting_with(study, t.params):
                study.enqueue_trial(
                    t.params, user_attrs={rows.CONTINUES: earlier} if earlier else None
                )
    continue_unfinished(study, ctx)


def waiting_with(study, params: dict) -> bool:
    """Whether a trial already waits to run `params` (its fixed parameters hold them): a
    candidate is enqueued to run again once. A stopped trial whose rows `--rerun` moves is
    enqueued by run_again and, having no rows left, would be again by close_running in the same
    start; the candidate would then train twice over, every seed of it."""
    from optuna.trial import TrialState

    return any(
        all(fixed.get(k) == v for k, v in params.items())
        for t in study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
        if (fixed := t.system_attrs.get("fixed_params")) is not None
    )


def _just_asked(trial, now: datetime) -> bool:
    """A RUNNING trial that no driver has named yet and that started within roster.GRACE_S."""
    start = trial.datetime_start
    return (
        DRIVER not in trial.user_attrs
        and start is not None
        and (now - start).total_seconds() < roster.GRACE_S
    )


MEASURED = frozenset({"ok", "diverged"})


def continue_unfinished(study, ctx: TrialContext) -> list[int]:
    """Each finished trial that lacks a seed of the study's (stopped part-way through its seeds,
    or the study now asks more seeds) is continued once: a trial of the same parameters is
    enqueued, naming it (user attribute `continues`), which trains only the seeds it lacks and is
    told the mean over all of them. Pruned, infeasible and wholly failed trials are not continued.
    Returns the numbers continued now."""
    from optuna.trial import TrialState

    trials = study.get_trials(deepcopy=False)
    continued = {n for t in trials for n in t.user_attrs.get(rows.CONTINUES) or ()}
    wanted = set(ctx.seed_list())
    now = []
    for t in trials:
        if t.state not in (TrialState.COMPLETE, TrialState.FAIL) or t.number in continued:
            continue
        statuses = set(str(t.user_attrs.get("status", "")).split(","))
        if not statuses & MEASURED or statuses & {"pruned", "infeasible", "surplus"}:
            continue
        # one whose rows were set aside (damaged, or superseded by --rerun) runs again whole instead
        if wanted - set(t.user_attrs.get("seeds") or ()) and rows.trial_files_of(
            ctx.study_dir, t.number
        ):
            study.enqueue_trial(
                t.params,
                user_attrs={rows.CONTINUES: [*(t.user_attrs.get(rows.CONTINUES) or ()), t.number]},
            )
            now.append(t.number)
    return now


def run_again(study, set_aside: list[str], done: dict[int, list[dict]]) -> None:
    """Trials whose row files were set aside (damaged, or superseded by `--rerun`) run again with
    the same parameters, once per candidate (their Optuna trials stay as they were; the rerun is a
    new trial number, and trains every seed)."""
    numbers = {n for p in set_aside if (n := trial_number(p)) is not None}
    by_number = {t.number: t for t in study.get_trials(deepcopy=False)}
    for number in sorted(numbers - set(done)):
        params = by_number[number].params if number in by_number else None
        if params and not waiting_with(study, params):
            study.enqueue_trial(params)


SUPERSEDED = "_superseded"


def supersede(study_dir: str, rerun: Sequence[str], others: Sequence = ()) -> list[str]:
    """`--rerun COLUMN=VALUE ...`: every row file of each trial that has a row matching them all
    (select.mask) moves to <study>/_superseded/<UTC time>/, kept and out of every reader ("_"), for
    run_again to train those candidates anew (after a change to the code they run). Returns the
    new locations; StudyError when another driver runs the study, a filter is malformed or names
    no column, or no row matches."""
    given = " ".join(rerun)
    if others:
        raise StudyError(
            f"--rerun {given}: {len(others)} other driver(s) run this study now; rerun once it runs alone"
        )
    try:
        filters = dict(select.parse(text, "--rerun") for text in rerun)
    except ValueError as e:
        raise StudyError(str(e)) from None
    df = read_study(study_dir)
    if not len(df):
        raise StudyError(f"--rerun {given}: the study has no rows yet")
    try:
        keep = select.mask(df, filters)
    except select.FilterError as e:
        raise StudyError(f"--rerun {given}: {e}") from None
    numbers = sorted({int(n) for n in df.loc[keep, "optuna_trial"].dropna()})
    if not numbers:
        raise StudyError(f"--rerun {given}: no row of the study matches")
    folder = location.join(study_dir, SUPERSEDED, time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()))
    moved = []
    for n in numbers:
        for path in rows.trial_files_of(study_dir, n) + tuning.files_of(study_dir, n):
            target = location.join(folder, location.basename(path))
            location.move(path, target)
            moved.append(target)
    return moved
