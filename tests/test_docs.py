"""The documentation stays true: docs/reference.md is what the code generates, every key has a
meaning, every relative link (and #anchor) in the pages resolves, nothing cites a file outside
the repository, and the README's set-up commands are the ones CI runs."""

import re
from pathlib import Path

import pytest

from benchmark import docs_reference

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted({ROOT / "README.md", ROOT / "CONTRIBUTING.md", *ROOT.glob("docs/*.md"), *ROOT.glob("benchmarks/*.md"),
                *ROOT.glob("results/**/README.md")})
_CODE = re.compile(r"```.*?```|`[^`\n]*`", re.S)
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def test_the_reference_page_is_what_the_code_generates():
    page = (ROOT / "docs" / "reference.md").read_text(encoding="utf-8")
    assert page == docs_reference.render(), "docs/reference.md is stale: run `python -m benchmark.docs_reference`"


def test_every_key_and_column_has_a_meaning():
    assert docs_reference.note_problems() == []


def test_a_key_without_a_meaning_is_named(monkeypatch):
    monkeypatch.delitem(docs_reference.SPEC_NOTES, "hyper.read")
    monkeypatch.setitem(docs_reference.COLUMN_NOTES, "gone", "a column that was removed")
    problems = docs_reference.note_problems()
    assert "hyper.read: no meaning in SPEC_NOTES (benchmark/docs_reference.py)" in problems
    assert "gone: in COLUMN_NOTES but not a key any more" in problems


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", _CODE.sub(lambda m: m.group(0).strip("`"), heading).strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    return {slug(line.lstrip("#")) for line in text.splitlines() if re.match(r"#{1,6} ", line)}


def broken_links(page: Path) -> list[str]:
    out = []
    for target in _LINK.findall(_CODE.sub("", page.read_text(encoding="utf-8"))):
        if re.match(r"[a-z]+:", target):          # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            out.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            out.append(f"{target}: no such heading")
    return out


@pytest.mark.parametrize("page", [p.relative_to(ROOT).as_posix() for p in PAGES])
def test_relative_links_resolve(page):
    assert broken_links(ROOT / page) == []


def test_a_broken_link_or_anchor_is_found(tmp_path):
    (tmp_path / "other.md").write_text("# Some `code` heading, here\n\n## Two\n")
    page = tmp_path / "page.md"
    page.write_text("[a](other.md#some-code-heading-here) [b](other.md#three) [c](missing.md) "
                    "[d](#top) `[e](not-a-link.md)` [f](https://example.org/x)\n\n# Top\n")
    assert broken_links(page) == ["other.md#three: no such heading", "missing.md: no such file"]


def test_nothing_cites_a_file_outside_the_repository():
    texts = {p: p.read_text(encoding="utf-8") for p in [*PAGES, *ROOT.glob("benchmark/**/*.py"), *ROOT.glob("*.py"),
                                                         *ROOT.glob("tests/*.py")] if p.name != "test_docs.py"}
    assert [p.relative_to(ROOT).as_posix() for p, text in texts.items()
            if "SPEC.md" in text or "../shared" in text] == []


def test_the_readme_is_short_and_its_commands_are_the_ones_ci_runs():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 200
    assert "python3 -m venv .venv && .venv/bin/pip install -e '.[dev]' && " \
           ".venv/bin/shapebench search search_spaces/quickstart.yaml" in readme
    test_command = 'python -m pytest -q -m "not bench"'
    assert f".venv/bin/{test_command}" in readme and ci.rstrip().endswith(test_command)
