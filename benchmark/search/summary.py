"""What a search says when it ends: the study's totals and what this driver ran, the best row,
how to load the rows; and, for a search its `--time-budget` ended before its trials, that it did
and how to go on (a stop by the budget is not an error: exit 0, its runs in flight kept their
saved state for `--resume`)."""

from __future__ import annotations

from benchmark.search.optuna_study import storage_url


def show(console, s) -> None:
    for note in s.notes:
        console.print(f"note: {note}")
    if s.others:
        console.print(
            f"note: ran beside {len(s.others)} other driver(s) of this study ({', '.join(s.others)}); "
            "the counts of this run are its own"
        )
    console.print(
        f"\n{s.rows} rows in {s.study_dir}/ ({', '.join(f'{k} {v}' for k, v in s.statuses.items())}); "
        f"{s.finished_before} trials were already done, {s.ran} ran now, {s.written} rows written now"
        + (f" ({s.reused} of them runs taken from other studies)" if s.reused else "")
        + f", in {s.wall_s:.0f}s"
        + (
            f"; orchestration overhead {s.overhead_s:.2f}s per trial"
            if s.overhead_s is not None
            else ""
        )
    )
    if s.best:
        b = s.best
        at = "" if b["objective"] == "val_loss" else f"{b['objective']} {b['value']:.4g}, "
        console.print(
            f"best by {b['objective']}: {b['trial_id']} {b['family']} {b['structure']} "
            f"{int(b['params_total']):,} params, {at}val_loss {b['val_loss']:.4f} (ppl {b['val_ppl']:.2f})"
        )
    console.print(
        f'load it:  pandas.read_parquet("{s.study_dir}")\nboard:    shapebench board {s.study_dir}\n'
        f"study:    optuna-dashboard {storage_url(s.study_dir, s.storage)}   (sampler: {s.sampler})"
    )


def budget_spent(s, budget: str | None, resume_command: str) -> str | None:
    """The line for a search that `--time-budget` ended with trials unfinished; None otherwise."""
    done = s.finished_before + s.ran
    if not budget or done >= s.requested:
        return None
    return (
        f"--time-budget {budget} spent with {s.requested - done} of {s.requested} trials "
        f"unfinished (runs in flight keep their saved state); to go on: {resume_command}"
    )
