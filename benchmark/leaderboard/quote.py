"""A record's README quotes its report's verdicts: the table under the report's `## Verdicts`
heading, between `<!-- verdicts: REPORT -->` and `<!-- /verdicts -->`, written by this module, never
by hand, so that the README cannot print a figure the report no longer does:

    python -m benchmark.leaderboard.quote results/reference/REPORT.md README.md results/reference/README.md
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

END = "<!-- /verdicts -->"


def verdicts_table(report: str) -> str:
    """The table (with its caption) under the report's `## Verdicts (...)` heading."""
    section = re.split(r"^## Verdicts \(.*\)\n\n", report, maxsplit=1, flags=re.M)[1]
    table, _, rest = section.partition("\n\n")
    caption = rest.split("\n\n", 1)[0]
    return table.strip() + ("\n\n" + caption.strip() if caption.startswith("_") else "")


def quoted(text: str, report: str) -> str:
    """`text` with every verdicts block replaced by the report's table."""
    pattern = re.compile(r"(<!-- verdicts: [^>]*-->\n).*?" + re.escape(END), re.S)
    if not pattern.search(text):
        raise ValueError(f"no block between <!-- verdicts: REPORT --> and {END}")
    return pattern.sub(lambda m: m.group(1) + verdicts_table(report) + "\n" + END, text)


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
