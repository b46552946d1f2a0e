"""One table, written out as Markdown, LaTeX (booktabs), HTML or a rich terminal table.

A Table holds display strings column by column, plus the raw value of each numeric cell so the
HTML page sorts numbers as numbers. Renderers are plain string builders: pandas'
to_markdown and Styler.to_latex would add tabulate and jinja2 as dependencies for no gain.
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass, field

import numpy as np
import orjson
import rich.table


@dataclass(frozen=True, kw_only=True)
class Column:
    header: str
    cells: list[str]
    keys: np.ndarray | None = None  # raw values (floats) for sorting; None for text columns
    tex: str | None = None  # LaTeX header where the plain one would not typeset well


@dataclass(frozen=True, kw_only=True)
class Table:
    title: str
    columns: list[Column]
    caption: str = ""
    notes: list[str] = field(default_factory=list)  # columns left out, and why

    def rows(self):
        return zip(*(c.cells for c in self.columns))

    def __len__(self) -> int:
        return len(self.columns[0].cells) if self.columns else 0


# Cells are joined with these control characters, escaped in one pass over the whole body, and
# only then given their real separators: one str call per table instead of one per cell.
_CELL, _ROW = "\x1f", "\x1e"


def _body(table: Table) -> str:
    return _ROW.join(_CELL.join(row) for row in table.rows())


def markdown(table: Table) -> str:
    head = "| " + " | ".join(c.header.replace("|", "\\|") for c in table.columns) + " |"
    rule = "|" + "|".join("---:" if c.keys is not None else "---" for c in table.columns) + "|"
    body = _body(table).replace("|", "\\|").replace(_CELL, " | ").replace(_ROW, " |\n| ")
    return "\n".join([head, rule, *([f"| {body} |"] if len(table) else [])])


# Characters our cells use that LaTeX needs spelled out (structure strings, ±, frontier marks).
_TEX = {
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
    "\\": r"\textbackslash{}",
    "→": r"$\to$",
    "×": r"$\times$",
    "±": r"$\pm$",
    "★": r"$\star$",
    "☆": r"$\circ$",
    "—": "---",
}
# One pass that stops only at those characters: str.translate looks up every character (4x slower).
_TEX_PATTERN = re.compile("|".join(map(re.escape, _TEX)))


def tex_escape(text: str) -> str:
    return _TEX_PATTERN.sub(lambda match: _TEX[match.group()], text)


def latex(table: Table, label: str = "") -> str:
    spec = "".join("r" if c.keys is not None else "l" for c in table.columns)
    head = " & ".join(c.tex or tex_escape(c.header) for c in table.columns) + r" \\"
    body = tex_escape(_body(table)).replace(_CELL, " & ").replace(_ROW, " \\\\\n")
    caption = tex_escape(table.title + (". " + table.caption if table.caption else ""))
    return "\n".join(
        [
            r"\begin{table}[t]",
            r"\centering",
            r"\small",
            rf"\begin{{tabular}}{{{spec}}}",
            r"\toprule",
            head,
            r"\midrule",
            *([body + r" \\"] if len(table) else []),
            r"\bottomrule",
            r"\end{tabular}",
            rf"\caption{{{caption}}}",
            *([rf"\label{{{label}}}"] if label else []),
            r"\end{table}",
        ]
    )


def html_table(table: Table, table_id: str = "", titled: bool = True) -> str:
    """A sortable <table> whose rows the page's script builds from the JSON beside it: a study can
    hold 100,000 trials, and JSON is several times smaller and faster to write than markup.
    Numeric cells carry their rank as sort key (data-v).
    `titled`: the title as the table's caption (off where a heading already names it)."""
    heads = "".join(f"<th>{html.escape(c.header)}</th>" for c in table.columns)
    ident = f' id="{table_id}"' if table_id else ""
    caption = f"<caption>{html.escape(table.title)}</caption>" if titled and table.title else ""
    # "<" only occurs inside JSON strings, where \u003c means the same and cannot close the script.
    cells = orjson.dumps([c.cells for c in table.columns]).decode().replace("<", "\\u003c")
    keys = ",".join("null" if c.keys is None else _ranks(c.keys) for c in table.columns)
    data = f'{{"cells":{cells},"keys":[{keys}]}}'
    return (
        f'<table class="sortable"{ident}>{caption}<thead><tr>{heads}</tr></thead><tbody></tbody></table>'
        f'<script type="application/json" class="rows">{data}</script>'
    )


def _ranks(values: np.ndarray) -> str:
    """A JSON array of each value's dense rank in its column (equal values, equal ranks), null
    where the value is missing. Ranks sort exactly as the values do, and integers print several
    times faster than floats: this is most of the page's writing time on a large study."""
    ranks = np.full(len(values), -1, dtype=np.int64)
    finite = np.isfinite(values)
    ranks[finite] = np.unique(values[finite], return_inverse=True)[1].ravel()
    # Ranks are never negative, so "-1" can only be a missing value.
    return orjson.dumps(ranks, option=orjson.OPT_SERIALIZE_NUMPY).decode().replace("-1", "null")


def rich_table(table: Table) -> rich.table.Table:
    out = rich.table.Table(title=table.title, caption=table.caption or None)
    for c in table.columns:
        out.add_column(c.header, justify="right" if c.keys is not None else "left")
    for row in table.rows():
        out.add_row(*row)
    return out
