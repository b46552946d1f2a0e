"""The documentation stays true: docs/reference.md is what the code generates, every key has a
meaning, every relative link (and #anchor) in the pages resolves, nothing cites a file outside
the repository, and the README's set-up commands are the ones CI runs."""

import re
from pathlib import Path

import pytest

from benchmark import docs_reference

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted(
    {
        ROOT / "README.md",
        ROOT / "CONTRIBUTING.md",
        *ROOT.glob("docs/*.md"),
        *ROOT.glob("benchmarks/*.md"),
        *ROOT.glob("results/**/README.md"),
    }
)
_CODE = re.compile(r"```.*?```|`[^`\n]*`", re.S)
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def test_the_reference_page_is_what_the_code_generates():
    page = (ROOT / "docs" / "reference.md").read_text(encoding="utf-8")
    assert page == docs_reference.render(), (
        "docs/reference.md is stale: run `python -m benchmark.docs_reference`"
    )


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
    return re.sub(
        r"[^\w\- ]", "", _CODE.sub(lambda m: m.group(0).strip("`"), heading).strip().lower()
    ).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    return {slug(line.lstrip("#")) for line in text.splitlines() if re.match(r"#{1,6} ", line)}


def broken_links(page: Path) -> list[str]:
    out = []
    for target in _LINK.findall(_CODE.sub("", page.read_text(encoding="utf-8"))):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
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
    page.write_text(
        "[a](other.md#some-code-heading-here) [b](other.md#three) [c](missing.md) "
        "[d](#top) `[e](not-a-link.md)` [f](https://example.org/x)\n\n# Top\n"
    )
    assert broken_links(page) == ["other.md#three: no such heading", "missing.md: no such file"]


def test_nothing_cites_a_file_outside_the_repository():
    texts = {
        p: p.read_text(encoding="utf-8")
        for p in [
            *PAGES,
            *ROOT.glob("benchmark/**/*.py"),
            *ROOT.glob("*.py"),
            *ROOT.glob("tests/*.py"),
        ]
        if p.name != "test_docs.py"
    }
    assert [
        p.relative_to(ROOT).as_posix()
        for p, text in texts.items()
        if "SPEC.md" in text or "../shared" in text
    ] == []


def test_the_readme_is_short_and_its_commands_are_the_ones_ci_runs():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 200
    assert (
        "python3 -m venv .venv && .venv/bin/pip install -e '.[dev]' && "
        ".venv/bin/shapebench search search_spaces/quickstart.yaml" in readme
    )
    test_command = 'python -m pytest -q -m "not bench"'
    assert f".venv/bin/{test_command}" in readme and ci.rstrip().endswith(test_command)


# Citations in code, tests, pyproject.toml and the pages: repository paths, sections of a page
# ("README "The commands"", "docs/x.md, "Heading"") and the config files the project keeps.
CITING = sorted(
    {
        *PAGES,
        ROOT / "pyproject.toml",
        *ROOT.glob("*.py"),
        *ROOT.glob("benchmark/**/*.py"),
        *ROOT.glob("tests/*.py"),
    }
    - {ROOT / "tests" / "test_docs.py"}
)
_PATH = re.compile(
    r"(?<![\w/.<-])((?:benchmarks|docs|results|search_spaces|tests|benchmark)/[\w./-]*\w)"
)
_SECTION = re.compile(r"(?<![\w/.-])((?:[\w.-]+/)*[\w.-]+\.md|README),? \"([^\"\n]+)\"")
_CONFIG = re.compile(
    r"(?<![\w/])(\.(?:importlinter|ci/\w+|github/[\w./-]*\w|pre-commit-config\.yaml|coveragerc|flake8|ruff\.toml))"
)
# Study names the pages and the code use as examples of a user's own results, not records.
EXAMPLE_STUDIES = {"quickstart", "a", "b", "ladder", "my-study", "demo"}


def cited_problems(path: Path) -> list[str]:
    text, out = path.read_text(encoding="utf-8"), []
    for target in _PATH.findall(text) + _CONFIG.findall(text):
        parts = target.split("/")
        if parts[0] == "results" and (len(parts) < 2 or parts[1] in EXAMPLE_STUDIES):
            continue
        if (
            target.startswith("tests/artifacts")
            or (ROOT / target).exists()
            or (path.parent / target).exists()
        ):
            continue
        out.append(f"{target}: no such file")
    for page, section in _SECTION.findall(text):
        dest = ROOT / ("README.md" if page == "README" else page)
        dest = dest if dest.exists() else path.parent / page
        if not dest.exists():
            out.append(f"{page}: no such file")
        elif not any(a.startswith(slug(section)) for a in anchors(dest)):
            out.append(f'{page} "{section}": no such heading')
    return out


@pytest.mark.parametrize("path", [p.relative_to(ROOT).as_posix() for p in CITING])
def test_what_the_code_and_pages_cite_exists(path):
    assert cited_problems(ROOT / path) == []


def test_a_stale_citation_is_found(tmp_path):
    cited = tmp_path / "x.toml"
    cited.write_text(
        '# the layering (.importlinter); README "Searches"; README "The commands";\n'
        "# results/quickstart-gone/README.md, results/quickstart, docs/performance.md\n"
    )
    assert cited_problems(cited) == [
        "results/quickstart-gone/README.md: no such file",
        ".importlinter: no such file",
        'README "Searches": no such heading',
    ]


def test_every_record_is_listed_in_the_results_readme():
    listed = set(
        re.findall(
            r"\]\(([\w.-]+)/README\.md\)",
            (ROOT / "results" / "README.md").read_text(encoding="utf-8"),
        )
    )
    assert {p.parent.name for p in ROOT.glob("results/*/README.md")} == listed
