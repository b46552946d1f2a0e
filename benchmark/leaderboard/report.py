"""Write a board out: the terminal view, and Markdown, CSV, LaTeX and HTML documents, to files
under an output folder (with the plots as PNG and SVG) or to stdout."""

from __future__ import annotations

import contextlib
import functools
import io
import multiprocessing
import os
import sys
import traceback
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TypeVar

import orjson
import pandas as pd
import pyarrow as pa
import pyarrow.csv as pa_csv
from rich.console import Console

from benchmark.arch import describe
from benchmark.console import console as wide_console
from benchmark.leaderboard import (
    claims,
    decision,
    forest,
    formats,
    page,
    plots,
    scaling,
    tables,
    tuning,
)
from benchmark.leaderboard import curves as learning
from benchmark.leaderboard.board import Board, aggregated
from benchmark.leaderboard.claims import stability

FORMATS = ("terminal", "md", "csv", "latex", "html")
T = TypeVar("T")
FILES = {
    "md": "leaderboard.md",
    "csv": "leaderboard.csv",
    "latex": "leaderboard.tex",
    "html": "index.html",
}


def publish(
    board: Board,
    outputs: Sequence[str],
    out: Path | None = None,
    top: int | None = None,
    console: Console | None = None,
    *,
    predict: float | None = None,
    fit_by: str = "family",
    checked: tuple[claims.ClaimsFile, list[claims.Result]] | None = None,
    curves: pd.DataFrame | None = None,
) -> list[Path]:
    """Renders each requested output (FORMATS); returns the files written (none when printing to
    stdout). Plots are drawn only when something will hold them: an output folder or the page.
    What had to be left out (a plot, a column) is said in each document, and on stderr.
    Scaling fits are made for every budget ladder (by family or structure: `fit_by`), predicted at
    `predict` parameters; `checked`: a claims file and its results (claims.evaluate), shown in
    every document and written to <out>/claims.json. Ladders also get their decision accuracy
    (decision.measure), shown in every document and written to <out>/decision.json. With
    `checked`, the runs the claims file's instability rule marks, and each verdict without them
    (claims/stability.py); with `curves` (store/curves.py) too, each claim's learning curves."""
    console = console or wide_console()
    figures = out is not None or "html" in outputs
    planned, plot_notes = plots.plan(board) if figures else ([], [])
    rule, assessed, marked = (
        stability.assess(*checked, board.trials) if checked else (None, [], None)
    )
    if figures and checked and curves is not None:
        planned += learning.plan(checked[1], board.trials, curves, marked)
    written = []
    # The plots are drawn in another process while the documents are written (see _in_background).
    drawing = (
        _in_background(plots.render_all, planned) if planned else contextlib.nullcontext(lambda: {})
    )
    with drawing as drawn:
        # Meanwhile the scaling fits are made here, and their figure drawn: the other process, with
        # the frontiers to draw, still takes longer.
        fits = scaling.fit(board, fit_by, predict)
        fitted = [plots.scaling_plot(fits)] if figures and fits.fits else []
        forest_plot = forest.forest_plot(checked[1]) if figures and checked else None
        fitted += [forest_plot] if forest_plot else []
        planned, fitted_images = [*planned, *fitted], {p.name: plots.render(p) for p in fitted}

        def images() -> dict[str, dict[str, bytes]]:
            return {**drawn(), **fitted_images}

        decided = decision.measure(board)
        doc = tables.document(
            board,
            top,
            scaling.table(fits),
            claims.table(*checked) if checked else None,
            decision.tables(decided),
            claims.verdicts(*checked) if checked else None,
        )
        doc = replace(
            doc,
            stability=stability.table(rule, assessed) if checked else None,
            tuning=tuning.table(board),
        )
        notes = [*board.notes, *fits.notes, *decided.notes, *plot_notes, *doc.ranked[0].notes]
        for fmt in outputs:
            if fmt == "terminal":
                terminal(board, doc, notes, console)
                continue
            text = {
                "md": lambda: markdown(board, doc, notes, planned if out is not None else []),
                "csv": lambda: csv(board),
                "latex": lambda: latex(board, doc),
                "html": lambda: page.embed(page.page(board, doc, planned, notes), images()),
            }[fmt]()
            if out is None:
                sys.stdout.write(text)
                continue
            out.mkdir(parents=True, exist_ok=True)
            path = out / FILES[fmt]
            path.write_text(text, encoding="utf-8")
            written.append(path)
            if fmt == "csv":
                written.append(_write_hypervolumes(board, out / "hypervolume.csv"))
        if out is not None:
            written += _write_plots(images(), out / "plots")
        if out is not None and checked:
            written.append(_write_claims(checked, out / "claims.json"))
            written.append(_write_json(stability.to_json(rule, assessed), out / "stability.json"))
        if out is not None and doc.decision is not None:
            written.append(_write_json(decision.to_json(decided), out / "decision.json"))
    if "terminal" not in outputs:
        for note in notes:
            print(f"note: {note}", file=sys.stderr)
    return written


@contextlib.contextmanager
def _in_background(fn: Callable[..., T], *args) -> Iterator[Callable[[], T]]:
    """Runs fn(*args) in a forked child process; gives the function that waits for (and then
    keeps) its result. Drawing the plots is pure Python (threads would only take turns holding
    the GIL) and takes about as long as writing every document, so on two cores the two overlap.
    A fork shares the board without copying it. Where fork is not the safe default (macOS,
    Windows) or there is one core, fn runs here and now. A child still running when the block
    ends (the caller failed first) is stopped."""
    if sys.platform != "linux" or (os.cpu_count() or 1) < 2:
        result = fn(*args)
        yield lambda: result
        return
    context = multiprocessing.get_context("fork")
    receive, send = context.Pipe(duplex=False)
    child = context.Process(target=_send_result, args=(send, fn, args), daemon=True)
    with warnings.catch_warnings():
        # Python >= 3.12 warns on any fork of a process that has threads (pyarrow's pool): this
        # child only computes with numpy, pandas and matplotlib, and Arrow renews its pools on fork.
        warnings.filterwarnings("ignore", r"This process .*multi-threaded", DeprecationWarning)
        child.start()
    send.close()

    @functools.cache
    def wait() -> T:
        try:
            ok, value = receive.recv()
        except EOFError:  # it died without a word: killed, or out of memory
            ok, value = False, ""
        child.join()
        if not ok and not value and (child.exitcode or 0) < 0:
            # killed by a signal before it could say why: a fork of a process whose thread pools
            # do not survive fork crashes in them (seen: SIGSEGV under pytest-xdist's worker
            # threads), so the work is done here instead, as on one core
            return fn(*args)
        if not ok:
            raise RuntimeError(
                f"{fn.__qualname__} failed in a child process (exit code {child.exitcode})"
                + (f":\n{value}" if value else "")
            )
        return value

    try:
        yield wait
    finally:
        if child.is_alive():
            child.terminate()
            child.join()
        receive.close()


def _send_result(send, fn, args) -> None:
    try:
        send.send((True, fn(*args)))
    except BaseException:  # noqa: BLE001 - every failure goes back to the parent, with its traceback
        send.send((False, traceback.format_exc()))
    finally:
        send.close()


def _write_plots(images: dict[str, dict[str, bytes]], folder: Path) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name, files in images.items():
        for ext, data in files.items():
            path = folder / f"{name}.{ext}"
            path.write_bytes(data)
            written.append(path)
    return written


def _write_claims(checked: tuple[claims.ClaimsFile, list[claims.Result]], path: Path) -> Path:
    return _write_json(claims.to_json(*checked), path)


def _write_json(data: dict, path: Path) -> Path:
    """orjson: a grid ladder's decision.json holds 100,000 pairs, which json.dumps is slow to indent."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(orjson.dumps(data, option=orjson.OPT_INDENT_2 | orjson.OPT_APPEND_NEWLINE))
    return path


def _write_hypervolumes(board: Board, path: Path) -> Path:
    hv = board.hypervolumes.assign(
        reference=board.hypervolumes["reference"].map(lambda r: " ".join(map(repr, r)))
    )
    hv.to_csv(path, index=False)
    return path


def csv(board: Board) -> str:
    """One row per candidate, raw numbers (no units), for further analysis. Written by pyarrow:
    pandas' to_csv formats every float in Python, ten times slower on a large study."""
    c = board.candidates
    metrics = aggregated(c)
    # A standard error column only where seeds disagree: params and FLOPs are the same every seed.
    varies = [f"{m}_se" for m in metrics if f"{m}_se" in c and (c[f"{m}_se"].fillna(0) != 0).any()]
    cols = [
        "band",
        # the rank's table within its band: rows counted and trained alike (bands.cohorts)
        *(["cohort"] if "cohort" in c else []),
        "rank",
        "study",
        "family",
        *describe.COLUMNS,
        "n_seeds",
        *(t for t in ("tuned", "lr_sensitivity") if t in c),  # a tuned study's (tuning.py)
        *(x for m in metrics for x in (m, f"{m}_se") if x in (*metrics, *varies)),
        "front",
        "family_front",
        "spec",
    ]
    table = pa.Table.from_pandas(c[cols], preserve_index=False)
    buf = io.BytesIO()
    pa_csv.write_csv(table, buf)
    return buf.getvalue().decode("utf-8")


def markdown(
    board: Board, doc: tables.Document, notes: list[str], plotted: list[plots.Plot]
) -> str:
    """In the page's order: the claims' verdicts in brief, the ranking, the claims in full, the
    frontiers, then the rest."""
    parts = [f"# Leaderboard: {', '.join(board.studies)}", tables.objectives_line(board)]
    if doc.verdicts is not None:
        parts += [f"## {doc.verdicts.title}", _md(doc.verdicts)]
        parts += [f"![{p.title}](plots/{p.name}.png)" for p in plotted if p.name == forest.NAME]
    parts += [f"## {t.title}\n\n{_md(t)}" for t in doc.ranked]
    if doc.claims is not None:
        parts += [f"## {doc.claims.title}", _md(doc.claims)]
    parts += [f"## {t.title}\n\n{_md(t)}" for t in (doc.stability, doc.tuning) if t is not None]
    learned = [p for p in plotted if p.name.startswith(page.CURVES)]
    plotted = [p for p in plotted if not p.name.startswith(page.CURVES) and p.name != forest.NAME]
    if learned:
        parts += ["## Learning curves", *(f"![{p.title}](plots/{p.name}.png)" for p in learned)]
    if plotted:
        parts += ["## Frontiers", *(f"![{p.title}](plots/{p.name}.png)" for p in plotted)]
    parts += ["## Hypervolume", _md(doc.hypervolume)]
    if doc.scaling is not None:
        parts += [f"## {doc.scaling.title}", _md(doc.scaling)]
    if doc.decision is not None:
        parts += ["## Decision accuracy", *(f"### {t.title}\n\n{_md(t)}" for t in doc.decision)]
    if len(doc.diagnostics):
        parts += [f"## {doc.diagnostics.title}\n\n{_md(doc.diagnostics)}"]
    parts += ["## Studies", formats.markdown(doc.studies)]
    if len(doc.excluded):
        parts += [f"## {doc.excluded.title}", formats.markdown(doc.excluded)]
    if notes:
        parts += ["## Notes", "\n".join(f"- {n}" for n in notes)]
    return "\n\n".join(parts) + "\n"


def _md(table: formats.Table) -> str:
    return formats.markdown(table) + (f"\n\n_{table.caption}_" if table.caption else "")


def latex(board: Board, doc: tables.Document) -> str:
    head = [
        f"% shapebench leaderboard: {', '.join(board.studies)}",
        r"% needs \usepackage{booktabs}",
    ]
    extra = [t for t in (doc.scaling, *(doc.decision or ()), doc.claims) if t is not None]
    body = [
        formats.latex(t, label="tab:" + t.title.split(" (")[0].lower().replace(" ", "-"))
        for t in (*doc.ranked, *extra)
    ]
    return (
        "\n\n".join([*head, formats.latex(doc.hypervolume, label="tab:hypervolume"), *body]) + "\n"
    )


def terminal(board: Board, doc: tables.Document, notes: list[str], console: Console) -> None:
    for table in (
        doc.studies,
        doc.hypervolume,
        *doc.ranked,
        doc.scaling,
        *(doc.decision or ()),
        doc.claims,
        doc.stability,
        doc.tuning,
    ):
        if table is not None:
            console.print(formats.rich_table(table))
    if len(board.excluded):
        counts = board.excluded["reason"].value_counts()
        console.print(
            f"{len(board.excluded)} trials kept off the frontiers: "
            + ", ".join(f"{n} {r}" for r, n in counts.items())
        )
    for note in notes:
        console.print(f"[dim]note: {note}[/dim]")
