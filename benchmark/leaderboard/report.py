"""Write a board out: the terminal view, and Markdown, CSV, LaTeX and HTML documents, to files
under an output folder (with the plots as PNG and SVG) or to stdout."""

from __future__ import annotations

import io
import sys
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pa_csv
from rich.console import Console

from benchmark.leaderboard import describe, formats, page, plots, tables
from benchmark.leaderboard.board import METRICS, Board

FORMATS = ("terminal", "md", "csv", "latex", "html")
FILES = {"md": "leaderboard.md", "csv": "leaderboard.csv", "latex": "leaderboard.tex", "html": "index.html"}


def publish(board: Board, outputs: Sequence[str], out: Path | None = None, top: int | None = None,
            console: Console | None = None) -> list[Path]:
    """Renders each requested output (FORMATS); returns the files written (none when printing to
    stdout). Plots are drawn only when something will hold them: an output folder or the page.
    What had to be left out (a plot, a column) is said in each document, and on stderr."""
    # Piped output is not a terminal: rich would wrap every table to 80 columns; keep rows whole.
    console = console or Console(width=None if sys.stdout.isatty() else 200)
    drawn, plot_notes = plots.figures(board) if out is not None or "html" in outputs else ([], [])
    rendered = [(p, plots.render(p)) for p in drawn]
    doc = tables.document(board, top)
    notes = [*board.notes, *plot_notes, *doc.ranked[0].notes]
    written = _write_plots(rendered, out / "plots") if out is not None else []
    for fmt in outputs:
        if fmt == "terminal":
            terminal(board, doc, notes, console)
            continue
        text = {
            "md": lambda: markdown(board, doc, notes, [p for p, _ in rendered] if out is not None else []),
            "csv": lambda: csv(board),
            "latex": lambda: latex(board, doc),
            "html": lambda: page.page(board, doc, rendered, notes),
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
    if "terminal" not in outputs:
        for note in notes:
            print(f"note: {note}", file=sys.stderr)
    return written


def _write_plots(rendered, folder: Path) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for plot, files in rendered:
        for ext, data in files.items():
            path = folder / f"{plot.name}.{ext}"
            path.write_bytes(data)
            written.append(path)
    return written


def _write_hypervolumes(board: Board, path: Path) -> Path:
    hv = board.hypervolumes.assign(reference=board.hypervolumes["reference"].map(lambda r: " ".join(map(repr, r))))
    hv.to_csv(path, index=False)
    return path


def csv(board: Board) -> str:
    """One row per candidate, raw numbers (no units), for further analysis. Written by pyarrow:
    pandas' to_csv formats every float in Python, ten times slower on a large study."""
    c = board.candidates
    metrics = [m for m in dict.fromkeys([*METRICS, *(o.column for o in board.settings.objectives)]) if m in c]
    # A standard error column only where seeds disagree: params and FLOPs are the same every seed.
    varies = [f"{m}_se" for m in metrics if f"{m}_se" in c and (c[f"{m}_se"].fillna(0) != 0).any()]
    cols = ["band", "rank", "study", "family", *describe.COLUMNS, "n_seeds",
            *(x for m in metrics for x in (m, f"{m}_se") if x in (*metrics, *varies)), "front", "family_front", "spec"]
    table = pa.Table.from_pandas(c[cols], preserve_index=False)
    buf = io.BytesIO()
    pa_csv.write_csv(table, buf)
    return buf.getvalue().decode("utf-8")


def markdown(board: Board, doc: tables.Document, notes: list[str], plotted: list[plots.Plot]) -> str:
    parts = [f"# Leaderboard: {', '.join(board.studies)}",
             f"Objectives {' vs '.join(map(str, board.settings.objectives))}; ranked by {board.metric} "
             "within each budget band; mean ± standard error over seeds.",
             "## Studies", formats.markdown(doc.studies),
             "## Hypervolume", _md(doc.hypervolume)]
    if plotted:
        parts += ["## Plots", *(f"![{p.title}](plots/{p.name}.png)" for p in plotted)]
    parts += [f"## {t.title}\n\n{_md(t)}" for t in doc.ranked]
    if len(doc.excluded):
        parts += [f"## {doc.excluded.title}", formats.markdown(doc.excluded)]
    if notes:
        parts += ["## Notes", "\n".join(f"- {n}" for n in notes)]
    return "\n\n".join(parts) + "\n"


def _md(table: formats.Table) -> str:
    return formats.markdown(table) + (f"\n\n_{table.caption}_" if table.caption else "")


def latex(board: Board, doc: tables.Document) -> str:
    head = [f"% shapebench leaderboard: {', '.join(board.studies)}", r"% needs \usepackage{booktabs}"]
    body = [formats.latex(t, label="tab:" + t.title.lower().replace(" ", "-")) for t in doc.ranked]
    return "\n\n".join([*head, formats.latex(doc.hypervolume, label="tab:hypervolume"), *body]) + "\n"


def terminal(board: Board, doc: tables.Document, notes: list[str], console: Console) -> None:
    for table in (doc.studies, doc.hypervolume, *doc.ranked):
        console.print(formats.rich_table(table))
    if len(board.excluded):
        counts = board.excluded["reason"].value_counts()
        console.print(f"{len(board.excluded)} trials kept off the frontiers: "
                      + ", ".join(f"{n} {r}" for r, n in counts.items()))
    for note in notes:
        console.print(f"[dim]note: {note}[/dim]")
