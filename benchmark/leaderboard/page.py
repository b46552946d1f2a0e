"""The published page: one self-contained HTML file that opens from disk.

Everything is inline (styles, a few lines of script, table rows as JSON, plots as base64 data:
URIs), and the favicon is an empty data: URI, so opening the page makes no network request at all.
The page is laid out first with each figure linked as `plots/<name>.svg`, and `embed` then puts the
drawn figures in: the plots can be drawn elsewhere while the tables are written.
"""

from __future__ import annotations

import base64
import html

from benchmark.leaderboard import formats, tables
from benchmark.leaderboard.board import Board
from benchmark.leaderboard.forest import (
    NAME as FOREST,  # drawn under the verdicts, not among the frontiers
)
from benchmark.leaderboard.plots import Plot

CSS = """
body { font: 14px/1.45 system-ui, sans-serif; color: #222; margin: 2em auto; padding: 0 1em;
       max-width: 1400px; box-sizing: border-box; }
h1 { font-size: 1.6em; } h2 { font-size: 1.25em; margin-top: 2em; border-bottom: 1px solid #ddd; }
table { border-collapse: collapse; margin: 0.6em 0 1.2em; font-size: 13px; }
caption { text-align: left; font-weight: 600; padding: 0.3em 0; }
th, td { padding: 0.2em 0.6em; border-bottom: 1px solid #eee; white-space: nowrap; }
th { background: #f4f4f4; cursor: pointer; user-select: none; position: sticky; top: 0; }
th[data-dir=asc]::after { content: " ▲"; } th[data-dir=desc]::after { content: " ▼"; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.plots { display: grid; grid-template-columns: repeat(auto-fill, minmax(560px, 1fr)); gap: 1em; }
figure { margin: 0; } figure.wide { grid-column: 1 / -1; }
figure img { width: 100%; max-width: 1100px; border: 1px solid #eee; }
.caption, .notes { color: #555; font-size: 12px; }
.scroll { max-height: 36em; overflow: auto; }
.fit { overflow-x: auto; }
.wrap td { white-space: normal; min-width: 5em; max-width: 30em; }
details { margin: -0.6em 0 1.2em; } summary { cursor: pointer; color: #555; font-size: 13px; }
"""

# Each table's rows arrive as JSON beside it (formats.html_table); build them, then sort on a
# header click: ascending first, then toggling, by the cell's data-v (the value's rank in its
# column) when it has one, else by its text. Empty values always sink to the bottom.
SCRIPT = """
function fill(table) {
  const data = JSON.parse(table.nextElementSibling.textContent);
  const rows = document.createDocumentFragment(), n = data.cells.length ? data.cells[0].length : 0;
  for (let r = 0; r < n; r++) {
    const tr = document.createElement("tr");
    data.cells.forEach((column, c) => {
      const td = tr.insertCell();
      td.textContent = column[r];
      if (data.keys[c]) { td.className = "num"; td.dataset.v = data.keys[c][r] ?? ""; }
    });
    rows.appendChild(tr);
  }
  table.tBodies[0].appendChild(rows);
}
function cellKey(td) {
  if (td.dataset.v === undefined) return td.textContent === "\u2014" ? null : td.textContent;
  return td.dataset.v === "" ? null : Number(td.dataset.v);
}
function compareKeys(a, b) {
  if (typeof a === "number" && typeof b === "number") return a - b;
  return String(a).localeCompare(String(b), undefined, {numeric: true});
}
function sortBy(th) {
  const body = th.closest("table").tBodies[0], col = th.cellIndex;
  const sign = th.dataset.dir === "asc" ? -1 : 1;
  for (const other of th.parentNode.children) delete other.dataset.dir;
  th.dataset.dir = sign === 1 ? "asc" : "desc";
  const rows = Array.from(body.rows, r => [cellKey(r.cells[col]), r]);
  rows.sort(([a], [b]) => a === null ? (b === null ? 0 : 1) : b === null ? -1 : sign * compareKeys(a, b));
  const sorted = document.createDocumentFragment();
  for (const [, r] of rows) sorted.appendChild(r);
  body.appendChild(sorted);
}
for (const table of document.querySelectorAll("table.sortable")) {
  fill(table);
  for (const th of table.tHead.rows[0].cells) th.addEventListener("click", () => sortBy(th));
}
"""


def page(board: Board, doc: tables.Document, plots: list[Plot], notes: list[str]) -> str:
    """The page with its figures linked, not yet embedded (see embed). What a reader came for comes
    first: the claims' verdicts in brief, the ranking, the claims in full, then the frontiers, then
    the rest."""
    learned = [
        p for p in plots if p.name.startswith(CURVES)
    ]  # the claims' learning curves (curves.py)
    frontiers = [p for p in plots if p.name != FOREST and not p.name.startswith(CURVES)]
    sections = [
        f"<h1>Leaderboard: {html.escape(', '.join(board.studies))}</h1>",
        "<noscript>The tables are filled in by the page's script: enable JavaScript.</noscript>",
        f'<p class="caption">{html.escape(tables.objectives_line(board))}</p>',
        *(
            [
                f"<h2>{html.escape(doc.verdicts.title)}</h2>",
                _table_with_caption(doc.verdicts, titled=False, wrap=True),
                *(_figure(p) for p in plots if p.name == FOREST),
            ]
            if doc.verdicts is not None
            else []
        ),
        "<h2>Leaderboard</h2>",
        *(_ranked(board, t) for t in doc.ranked),
        *(
            [
                f"<h2>{html.escape(doc.claims.title)}</h2>",
                _table_with_caption(doc.claims, titled=False, wrap=True),
            ]
            if doc.claims is not None
            else []
        ),
        *(
            f"<h2>{html.escape(t.title)}</h2>\n{_table_with_caption(t, titled=False, wrap=True)}"
            for t in (doc.stability, doc.tuning)
            if t is not None
        ),
        *(
            [
                "<h2>Learning curves</h2>",
                '<div class="plots">',
                *(_figure(p) for p in learned),
                "</div>",
            ]
            if learned
            else []
        ),
        *(
            [
                "<h2>Frontiers</h2>",
                '<div class="plots">',
                *(_figure(p) for p in frontiers),
                "</div>",
            ]
            if frontiers
            else []
        ),
        "<h2>Hypervolume</h2>",
        _table_with_caption(doc.hypervolume, titled=False),
        *(
            ["<h2>Scaling fits</h2>", _table_with_caption(doc.scaling, titled=False)]
            if doc.scaling is not None
            else []
        ),
        *(
            ["<h2>Decision accuracy</h2>", *(_table_with_caption(t) for t in doc.decision)]
            if doc.decision is not None
            else []
        ),
        *(
            [
                "<h2>Hyper-connection diagnostics</h2>",
                _table_with_caption(doc.diagnostics, titled=False),
            ]
            if len(doc.diagnostics)
            else []
        ),
        "<h2>Studies</h2>",
        _fit(formats.html_table(doc.studies, titled=False)),
        "<h2>All trials</h2>",
        f'<div class="scroll">{formats.html_table(tables.trials(board), "trials", titled=False)}</div>',
    ]
    if len(doc.excluded):
        sections += [
            "<h2>Kept off the frontiers</h2>",
            _fit(formats.html_table(doc.excluded, "excluded", titled=False)),
        ]
    if notes:
        sections += [
            "<h2>Notes</h2>",
            '<ul class="notes">',
            *(f"<li>{html.escape(n)}</li>" for n in notes),
            "</ul>",
        ]
    body = "\n".join(sections)
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta name="viewport" content="width=device-width, initial-scale=1">'
        f'<link rel="icon" href="data:,"><title>shapebench leaderboard</title>'
        f"<style>{CSS}</style></head>\n<body>\n{body}\n<script>{SCRIPT}</script>\n</body></html>\n"
    )


CURVES = "curves-"


def _ranked(board: Board, table: formats.Table) -> str:
    """A band's ranked table at a glance, and every column behind a toggle below it."""
    glance = tables.at_a_glance(board, table)
    full = (
        f"<details><summary>All {len(table.columns)} columns</summary>"
        f"{_fit(formats.html_table(table, titled=False))}</details>"
    )
    return _table_with_caption(glance) + (full if len(glance.columns) < len(table.columns) else "")


def _table_with_caption(table: formats.Table, titled: bool = True, wrap: bool = False) -> str:
    caption = f'<p class="caption">{html.escape(table.caption)}</p>' if table.caption else ""
    return _fit(formats.html_table(table, titled=titled), wrap) + caption


def _fit(table: str, wrap: bool = False) -> str:
    """A table wider than the window scrolls in its own box; the page itself never scrolls sideways.
    `wrap`: its text wraps (the claims' sentences), so that the verdict at the end of a row shows."""
    return f'<div class="fit{" wrap" if wrap else ""}">{table}</div>'


def _figure(plot: Plot) -> str:
    wide = ' class="wide"' if plot.wide else ""
    return f'<figure{wide}><img alt="{html.escape(plot.title)}" src="{_link(plot.name)}"></figure>'


def _link(name: str) -> str:
    return f"plots/{name}.svg"


def embed(text: str, images: dict[str, dict[str, bytes]]) -> str:
    """The page with each linked figure replaced by its SVG as a data: URI (images: plots.render_all)."""
    for name, files in images.items():
        data = base64.b64encode(files["svg"]).decode("ascii")
        # Once, and from the front: the figures come before the large tables (every trial).
        text = text.replace(f'src="{_link(name)}"', f'src="data:image/svg+xml;base64,{data}"', 1)
    return text
