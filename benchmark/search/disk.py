"""What a search writes to the results store, and the warning before it starts when the disk has
less room than that (a full disk halts it: driver.py, halt.py). `opts`: the search's
driver.SearchOptions; `summary`: its driver.SearchSummary."""

from __future__ import annotations

from benchmark.store import location

# What one trial leaves in the results store, for the free-space check before a search: a row
# file (~30 kB with the evaluations' curves), its share of the Optuna study and Ray's state.
BYTES_PER_TRIAL = 256 * 1024


def space_needed(space, opts, remaining: int) -> int:
    """Bytes the search will write: rows, study, Ray's state, and checkpoints when kept."""
    per_trial = BYTES_PER_TRIAL * opts.seeds
    if opts.checkpoints:
        per_trial += 4 * (space.budget or 0) * opts.seeds  # fp32 weights
    return per_trial * remaining


def space_line(space, opts, remaining: int) -> str:
    """The room the disk has, and the room the trials left need."""
    free = location.free_bytes(opts.study_dir)
    have = f"{free / 2**20:.1f} MiB free" if free is not None else "free space unknown"
    return f"{have}, and the {remaining} trials left need about {space_needed(space, opts, remaining) / 2**20:.1f} MiB"


def check_space(space, opts, remaining: int, summary, console) -> None:
    """Warn, before training, when the results disk has less room than the search will write."""
    free = location.free_bytes(opts.study_dir)
    if free is not None and free < space_needed(space, opts, remaining):
        note = (
            f"{opts.study_dir}: {space_line(space, opts, remaining)} (rows, study, Ray state"
            f"{', checkpoints' if opts.checkpoints else ''})"
        )
        summary.notes.append(note)
        if console is not None:
            console.print(f"[yellow]warning:[/yellow] {note}")
