"""What a plan and a search settle before anything trains: the data the trials read (the space's
`data:` settings as their DataConfig, the sampling of a study begun before kept), the passes each
run makes over each part of the corpus, held to `data.max_epochs`, and the micro-batch a GPU's
memory fits (space/memory.py)."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from benchmark.data import DataConfig, cached_parts, passes, pinned, prepare
from benchmark.recipe import TrainConfig, fmt_count
from benchmark.space.language import SearchSpace
from benchmark.space.memory import check_fits, fitted_space
from benchmark.space.plan import Plan, records
from benchmark.store.declaration import read_study_info

# The sampling of a study whose declaration has no `data:` (begun before it was recorded): random
# windows with replacement (data/sampling.py), which its remaining trials keep.
OLD_SAMPLING = "replacement"


def data_config(
    source: str, tokenizer: str, space: SearchSpace | None = None, cache: str | None = None
) -> DataConfig:
    """The trials' DataConfig: the corpus, tokenizer and cache flags, with the space's `data:`
    settings; an hf: dataset pinned to the commit it is at now, so every node of the search
    reads that one. `cache`: where the driver tokenises once, for every node: a folder they share,
    or a URI in the study's storage that each downloads from (data/mirror.py)."""
    if space is None:
        return DataConfig(source=source, tokenizer=tokenizer, cache_dir=cache)
    return DataConfig(
        source=pinned(source),
        tokenizer=tokenizer,
        cache_dir=cache,
        max_docs=space.data_value("max_docs"),
        sampling=space.data_value("sampling"),
    )


def as_declared_data(space: SearchSpace, opts):
    """(space, opts) with the sampling the study declared when the space does not set one: a study
    begun under the old sampling finishes under it, and records it when it writes its declaration
    again. A new study keeps the space's."""
    info = read_study_info(opts.study_dir)
    if not info or "sampling" in space.data:
        return space, opts
    sampling = (info.get("data") or {}).get("sampling", OLD_SAMPLING)
    space = dataclasses.replace(space, data={**space.data, "sampling": sampling})
    return space, dataclasses.replace(opts, data=dataclasses.replace(opts.data, sampling=sampling))


def fit_memory(space: SearchSpace, plan: Plan, cfg: TrainConfig, gpu_memory) -> SearchSpace:
    """The space at the micro-batch its planned candidates fit on `gpu_memory` (none: as it is);
    SpaceError, one line, when one cannot fit a single sequence."""
    if not gpu_memory:
        return space
    rows = records(plan, 1.0, cfg=cfg, gpu_memory=gpu_memory)
    check_fits(space, rows)
    return fitted_space(space, rows)


def with_passes(rows: list[dict[str, Any]], data: DataConfig) -> list[dict[str, Any]]:
    """Each plan record with `tokens_by_source` (each part's training tokens) and
    `epochs_by_source` (the passes its run makes over each), from the token cache without
    tokenising anything; the records as they are when the corpus is not tokenised yet."""
    parts = cached_parts(data)
    return rows if parts is None else run_passes(rows, parts)


def run_passes(
    rows: list[dict[str, Any]], parts: Mapping[str, tuple[int, float]]
) -> list[dict[str, Any]]:
    sizes = {name: n for name, (n, _) in parts.items()}
    weights = {name: w for name, (_, w) in parts.items()}
    return [
        {**r, "tokens_by_source": sizes, "epochs_by_source": passes(r["tokens"], weights, sizes)}
        for r in rows
    ]


def passes_line(rows: list[dict[str, Any]]) -> str:
    """The plan's data line: per part, its tokens, the most a run draws from it, and the passes."""
    if not rows or "epochs_by_source" not in rows[0]:
        return (
            "data: not tokenised yet, so the passes over each part are not known here; the search "
            "tokenises it first and refuses a run over data.max_epochs"
        )
    most = max(rows, key=lambda r: r["tokens"])
    each = [
        f"{name} {fmt_count(n)} tokens, a run draws up to "
        f"{fmt_count(round(most['epochs_by_source'][name] * n))} "
        f"({most['epochs_by_source'][name]:.2f} passes)"
        for name, n in most["tokens_by_source"].items()
    ]
    return "data: " + "; ".join(each)


def check_passes(space: SearchSpace, rows: list[dict[str, Any]]) -> None:
    """SpaceError, one line at `data.max_epochs`, for the first part a run passes over more often
    than the space allows (a run's most-read part)."""
    limit = space.data_value("max_epochs")
    for r in rows:
        by_part = r.get("epochs_by_source", {})
        for name, epochs in sorted(by_part.items(), key=lambda kv: -kv[1]):
            if epochs > limit:
                raise space.source.error(
                    ("data", "max_epochs"),
                    f"candidate {r['candidate']} ({r['family']}) trains {fmt_count(r['tokens'])} "
                    f"tokens, {epochs:.2f} passes over part {name!r} of the data, more than "
                    f"data.max_epochs {limit:g}; raise data.max_epochs, train fewer tokens or "
                    "use a larger corpus",
                )


def plan_passes(space: SearchSpace, rows: list[dict[str, Any]], out) -> None:
    """The plan's data line on `out` (a console, or stderr beside --json), then SpaceError when a
    part is read more often than data.max_epochs (rows from with_passes)."""
    say(out, passes_line(rows))
    check_passes(space, rows)


def say(out, line: str | None) -> None:
    """One line of a plan or a search on `out`: a console, or stderr beside --json; None: none."""
    if line is None:
        return
    if hasattr(out, "print"):
        out.print(line, markup=False)
    else:
        print(line, file=out)


def search_passes(space: SearchSpace, plan: Plan, data: DataConfig) -> None:
    """The search's passes: the corpus tokenised (once: the trials read the cache it builds) and
    every planned run held to data.max_epochs; SpaceError in one line otherwise."""
    prepared = prepare(data)
    parts = {
        name: (len(prepared.train.part(name)), w) for name, w in prepared.train.weights.items()
    }
    check_passes(space, run_passes(records(plan, 1.0), parts))
