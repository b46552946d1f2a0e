"""A record's README quotes its report's verdicts: the table under the report's `## Verdicts`
heading, between `<!-- verdicts: REPORT -->` and `<!-- /verdicts -->`, written by this module, never
by hand, so that the README cannot print a figure the report no longer does:

    python -m benchmark.leaderboard.quote results/reference/REPORT.md README.md results/reference/README.md
"""

from __future__ import annotations

import re
import sys
from pathlib import Path


def verdicts_table(report: str) -> str:
    """The table (with its caption) under the report's `## Verdicts (...)` heading."""
    table, caption = table_under(report, "Verdicts")
    return table + ("\n\n" + caption if caption else "")


def table_under(report: str, title: str) -> tuple[str, str]:
    """The Markdown table under the report's `## TITLE (...)` heading, and its caption ('' where
    it has none); a ValueError where the report has no such heading."""
    parts = re.split(rf"^## {re.escape(title)} \(.*\)\n\n", report, maxsplit=1, flags=re.M)
    if len(parts) < 2:
        raise ValueError(f"no `## {title} (...)` table")
    table, _, rest = parts[1].partition("\n\n")
    caption = rest.split("\n\n", 1)[0]
    return table.strip(), caption.strip() if caption.startswith("_") else ""


def quoted(text: str, report: str) -> str:
    """`text` with every verdicts block replaced by the report's table."""
    return filled(text, "verdicts", verdicts_table(report))


def filled(text: str, tag: str, body: str, name: str | None = None) -> str:
    """`text` with every block between `<!-- TAG: NAME -->` and `<!-- /TAG -->` holding `body`
    (only the blocks naming `name`, when given); a ValueError where there is none."""
    end = f"<!-- /{tag} -->"
    named = re.escape(f"{name} ") if name is not None else "[^>]*"
    pattern = re.compile(rf"(<!-- {re.escape(tag)}: {named}-->\n).*?{re.escape(end)}", re.S)
    if not pattern.search(text):
        raise ValueError(f"no block between <!-- {tag}: {name or 'REPORT'} --> and {end}")
    return pattern.sub(lambda m: m.group(1) + body + "\n" + end, text)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    report = Path(args[0]).read_text(encoding="utf-8")
    for name in args[1:]:
        path = Path(name)
        path.write_text(quoted(path.read_text(encoding="utf-8"), report), encoding="utf-8")
        print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
