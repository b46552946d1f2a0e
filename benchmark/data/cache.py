"""The token cache and `prepare`: each split of a corpus is tokenised once into a flat memmap
(uint16 when the vocabulary fits, else uint32; every document followed by the end-of-text token,
grouped by part), stored under cache_root()/tokens by a hash of (corpus, split, tokenizer) with a
checksummed JSON sidecar, so a search tokenises once and a corrupt copy is rebuilt, not used. With a
cache in the study's storage (a URI), each node's local cache is filled from there (data/mirror.py)."""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from benchmark.data.config import DataConfig, cache_uri
from benchmark.data.corpus import DATA_FORMAT, SPLITS, Corpus, hash_json, load_corpus
from benchmark.data.mirror import Mirror, checksum
from benchmark.data.tokenizer import Tokenizer, load_tokenizer, trained_file
from benchmark.store import atomic_open

log = logging.getLogger(__name__)

# Documents per encode_batch call: large enough to keep every core busy.
ENCODE_BATCH_DOCS = 8192


@dataclass(frozen=True)
class TokenArray:
    tokens: np.ndarray  # (N,) uint16 or uint32, read-only memmap
    spans: dict[str, tuple[int, int]]  # part name -> [start, end) in tokens
    fingerprint: str
    # part name -> share of the mixture (Corpus.weights), in spans' order, summing to 1. Not part
    # of the cache key: mixtures of the same parts share one token array.
    weights: dict[str, float]

    def part(self, name: str) -> np.ndarray:
        start, end = self.spans[name]
        return self.tokens[start:end]

    def __len__(self) -> int:
        return len(self.tokens)

    # Where the array lives in the cache (None: built in memory); its per-part counts sit beside it.
    path: Path | None = None

    def counts(self, minlength: int = 0) -> np.ndarray:
        """How often each token id occurs in len(self) tokens drawn by the mixture: each part's
        counts scaled to its weight (float64; one part: its plain counts), so the unigram
        baseline of every row (trial/run.py) is fitted to the text the model trains on. The
        counts of each part are read from beside the cached array, where the first reader writes
        them (once per cache, not per process), and counted in chunks of the memmap, never a
        whole-split int64 copy."""
        key = (self.fingerprint, minlength, tuple(self.weights.items()))
        if key not in _COUNTS:
            total = np.zeros(minlength, dtype=np.float64)
            for name, weight in self.weights.items():
                part = self.part_counts(name)
                scaled = part * (weight * len(self) / max(len(self.part(name)), 1))
                total = _padded_sum(total, scaled)
            _COUNTS[key] = total
        return _COUNTS[key]

    def part_counts(self, name: str) -> np.ndarray:
        """One part's token counts (int64, as long as its largest id + 1): from the cache's
        `<array>.counts-<part>.npy` when it sums to the part's length, else counted and written."""
        file = (
            None
            if self.path is None
            else self.path.with_name(f"{self.path.stem}.counts-{name}.npy")
        )
        if file is not None and file.exists():
            try:
                counts = np.load(file, allow_pickle=False)
                if counts.sum() == len(self.part(name)):
                    return counts
            except (OSError, ValueError):
                pass
        counts = streamed_bincount(self.part(name))
        if file is not None:
            try:
                with atomic_open(file, "wb") as f:
                    np.save(f, counts, allow_pickle=False)
            except OSError:  # a cache this process may not write (a read-only shared copy)
                pass
        return counts


# Tokens per bincount over the memmap: 16M ids are a 128 MB int64 copy at most, whatever the split.
COUNT_CHUNK = 1 << 24


def streamed_bincount(tokens: np.ndarray, chunk: int = COUNT_CHUNK) -> np.ndarray:
    """np.bincount of `tokens` in chunks, so memory stays bounded by `chunk` (an int64 copy of a
    10B-token split would be 80 GB)."""
    total = np.zeros(0, dtype=np.int64)
    for start in range(0, len(tokens), chunk):
        total = _padded_sum(total, np.bincount(tokens[start : start + chunk].astype(np.int64)))
    return total


def _padded_sum(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    # bincount is as long as the largest id seen when that exceeds minlength.
    n = max(len(a), len(b))
    return np.pad(a, (0, n - len(a))) + np.pad(b, (0, n - len(b)))


_COUNTS: dict[tuple, np.ndarray] = {}  # TokenArray.counts, by (fingerprint, minlength, weights)


@dataclass(frozen=True)
class PreparedData:
    tokenizer: Tokenizer
    train: TokenArray
    val: TokenArray
    dataset_id: str  # recorded in results next to tokenizer.tokenizer_id
    sampling: str = "permutation"  # how training batches draw (DataConfig.sampling)


def prepare(cfg: DataConfig) -> PreparedData:
    """Corpus -> tokenizer -> token arrays; each step runs once and is then read from the cache.

    The cache is per node (cache_root() is a local folder): the first trial on a node builds it,
    or downloads it from the study's storage (a cache_dir URI), under a file lock, so two trials
    starting together on one node do not both tokenise; the second waits, then reads what the
    first wrote."""
    from filelock import FileLock

    corpus = load_corpus(cfg)
    corpus.cache_dir.mkdir(parents=True, exist_ok=True)
    mirror = _mirror(cfg, corpus)
    with FileLock(str(corpus.cache_dir / f".prepare-{corpus.fingerprint[:16]}.lock")):
        tokenizer = _tokenizer(cfg, corpus, mirror, corpus.tokenizer_sample)
        trained = trained_file(cfg.tokenizer, corpus.cache_dir, corpus.fingerprint)
        if mirror is not None and trained is not None:
            _publish(mirror, trained)
        splits = token_splits(corpus, tokenizer, SPLITS, mirror)
        return PreparedData(
            tokenizer=tokenizer,
            train=splits["train"],
            val=splits["validation"],
            dataset_id=corpus.dataset_id,
            sampling=cfg.sampling,
        )


class _NotTrained(Exception):
    pass


def _untrained():
    raise _NotTrained


def cached_parts(cfg: DataConfig) -> dict[str, tuple[int, float]] | None:
    """Each part's (tokens in the training split, weight in the mixture), read from the token
    cache's sidecar without tokenising or training a tokenizer (what a plan shows); None when the
    split has not been tokenised yet. The sidecar is not checksummed here: a search's `prepare`
    verifies the array before it trains on it."""
    corpus = load_corpus(cfg)
    mirror = _mirror(cfg, corpus)
    try:
        tokenizer = _tokenizer(cfg, corpus, mirror, _untrained)
    except _NotTrained:
        return None
    fingerprint, path = _token_path(corpus, tokenizer, "train")
    try:
        sidecar = path.with_suffix(".json")
        raw = sidecar.read_bytes() if sidecar.exists() or mirror is None else mirror.read(sidecar)
        meta = json.loads(raw or b"null")
    except (OSError, ValueError):
        return None
    if not isinstance(meta, dict):
        return None
    if meta.get("fingerprint") != fingerprint:
        return None
    spans = meta["spans"]
    return {name: (spans[name][1] - spans[name][0], w) for name, w in corpus.weights.items()}


def cached_identity(cfg: DataConfig) -> tuple[str, Tokenizer] | None:
    """(the corpus's dataset_id, its tokenizer) as `prepare` gives them, read without tokenising
    or training a tokenizer (what a plan keys runs by: search/reuse_plan.py); None when the
    tokenizer is trained on the corpus and not yet here."""
    corpus = load_corpus(cfg)
    try:
        return corpus.dataset_id, _tokenizer(cfg, corpus, _mirror(cfg, corpus), _untrained)
    except _NotTrained:
        return None


def _mirror(cfg: DataConfig, corpus: Corpus) -> Mirror | None:
    uri = cache_uri(cfg.cache_dir)
    return None if uri is None else Mirror(uri=uri, root=corpus.cache_dir)


def _tokenizer(cfg: DataConfig, corpus: Corpus, mirror: Mirror | None, texts) -> Tokenizer:
    """The tokenizer cfg names; one trained on the corpus is read from the local cache, else
    downloaded from the mirror, else trained on `texts()`."""
    file = trained_file(cfg.tokenizer, corpus.cache_dir, corpus.fingerprint)
    if mirror is not None and file is not None and not file.exists():
        mirror.pull(file)
    return load_tokenizer(
        cfg.tokenizer, cache_dir=corpus.cache_dir, corpus_id=corpus.fingerprint, texts=texts
    )


def _token_path(corpus: Corpus, tokenizer: Tokenizer, split: str) -> tuple[str, Path]:
    """The cache key of one split and where its array lives."""
    fingerprint = hash_json([DATA_FORMAT, corpus.fingerprint, split, tokenizer.fingerprint])
    return fingerprint, corpus.cache_dir / "tokens" / f"{split}-{fingerprint[:24]}.bin"


def tokenized(
    corpus: Corpus, tokenizer: Tokenizer, split: str, mirror: Mirror | None = None
) -> TokenArray:
    """One split of the corpus as tokens (token_splits)."""
    return token_splits(corpus, tokenizer, (split,), mirror)[split]


def token_splits(
    corpus: Corpus, tokenizer: Tokenizer, splits: tuple[str, ...], mirror: Mirror | None = None
) -> dict[str, TokenArray]:
    """The splits of the corpus as tokens: each from the cache when a valid copy is there, else
    from the mirror when it has one; the others tokenised together, in one read of the corpus, and
    uploaded to the mirror."""
    for split in splits:
        if split not in SPLITS:
            raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {split!r}")
    found, missing = {}, {}
    for split in splits:
        fingerprint, path = _token_path(corpus, tokenizer, split)
        cached = _read_tokens(path, fingerprint, corpus.weights)
        if cached is None and mirror is not None:
            cached = _pulled(mirror, path, fingerprint, corpus.weights)
        if cached is None:
            missing[split] = (fingerprint, path)
            continue
        if mirror is not None:  # a copy made before the study's storage was named
            _publish(mirror, path, path.with_suffix(".json"))
        found[split] = cached
    if missing:
        start = time.perf_counter()
        built = _write_tokens(missing, corpus, tokenizer)
        for split, tokens in built.items():
            log.info(
                "tokenised %s/%s: %d tokens in %.1f s",
                corpus.source,
                split,
                len(tokens),
                time.perf_counter() - start,
            )
            if mirror is not None:  # over a corrupt remote copy, if that is why it was built here
                _publish(mirror, tokens.path, tokens.path.with_suffix(".json"), replace=True)
        found.update(built)
    return {split: found[split] for split in splits}


def _pulled(
    mirror: Mirror, path: Path, fingerprint: str, weights: dict[str, float]
) -> TokenArray | None:
    """The mirror's copy of a split, downloaded into the local cache; None when it has none, or
    when its array fails the checksum its sidecar records (then nothing is kept)."""
    sidecar = path.with_suffix(".json")
    try:
        meta = json.loads(mirror.read(sidecar) or b"null")
        if meta is None or meta["fingerprint"] != fingerprint:
            return None
        if not mirror.pull(path, expected=meta["checksum"]):
            return None
        problem = _cache_problem(path, meta, fingerprint, summed=True)
    except (ValueError, KeyError, TypeError) as e:
        problem = f"{type(e).__name__}: {e}"
    if problem:
        log.warning(
            "token cache %s is invalid (%s); rebuilding it", mirror.remote(sidecar), problem
        )
        return None
    with atomic_open(sidecar, "w") as f:  # last, as _write_tokens writes it
        json.dump(meta, f, indent=1)
    return _open_tokens(path, meta, weights)


# The files this process has seen in the mirror (or put there): checked once, not every trial.
_PUBLISHED: set[str] = set()


def _publish(mirror: Mirror, *paths: Path, replace: bool = False) -> None:
    """Upload the local files the mirror lacks (or holds at another size), in order; all of them
    when `replace`."""
    for path in paths:
        remote = mirror.remote(path)
        if replace or (remote not in _PUBLISHED and mirror.size(path) != path.stat().st_size):
            mirror.push(path)
        _PUBLISHED.add(remote)


def _read_tokens(path: Path, fingerprint: str, weights: dict[str, float]) -> TokenArray | None:
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
    return _open_tokens(path, meta, weights)


@dataclass
class _Writing:
    """One split's array while it is written: its file, checksum, length and parts' spans, and
    the documents waiting to be encoded (a batch of ENCODE_BATCH_DOCS at a time)."""

    file: BinaryIO
    dtype: np.dtype
    digest: Any = field(default_factory=checksum)
    length: int = 0
    spans: dict[str, tuple[int, int]] = field(default_factory=dict)
    texts: list[str] = field(default_factory=list)

    def add(self, text: str, tokenizer: Tokenizer) -> None:
        self.texts.append(text)
        if len(self.texts) == ENCODE_BATCH_DOCS:
            self.flush(tokenizer)

    def flush(self, tokenizer: Tokenizer) -> None:
        """Encode the waiting documents, each followed by the end-of-text token, and write them."""
        if not self.texts:
            return
        eot = [tokenizer.eot_id]
        ids = tokenizer.encode_batch(self.texts)
        chunk = np.fromiter(itertools.chain.from_iterable(doc + eot for doc in ids), self.dtype)
        data = chunk.tobytes()
        self.file.write(data)
        self.digest.update(data)
        self.length += len(chunk)
        self.texts = []


def _write_tokens(
    targets: dict[str, tuple[str, Path]], corpus: Corpus, tokenizer: Tokenizer
) -> dict[str, TokenArray]:
    """Tokenise the splits `targets` names ({split: (fingerprint, path)}) in one read of each part:
    every document goes to its split's array as it arrives. Each array is whole at its path, or
    (on an error) not there; its sidecar is written after it."""
    dtype = np.dtype(np.uint16 if tokenizer.vocab_size <= 2**16 else np.uint32)
    with contextlib.ExitStack() as stack:
        writing = {
            split: _Writing(stack.enter_context(atomic_open(path, "wb")), dtype)
            for split, (_, path) in targets.items()
        }
        for part in corpus.parts:
            starts = {split: w.length for split, w in writing.items()}
            for split, (_, text) in corpus.split_documents(part, tuple(targets)):
                writing[split].add(text, tokenizer)
            for split, w in writing.items():
                w.flush(tokenizer)
                w.spans[part.name] = (starts[split], w.length)
    arrays = {}
    for split, (fingerprint, path) in targets.items():
        w = writing[split]
        meta = {
            "fingerprint": fingerprint,
            "dtype": dtype.name,
            "length": w.length,
            "spans": w.spans,
            "checksum": w.digest.hexdigest(),
            "corpus": corpus.dataset_id,
            "tokenizer": tokenizer.tokenizer_id,
        }
        # The sidecar goes last: an array without one is treated as unfinished and rebuilt.
        with atomic_open(path.with_suffix(".json")) as f:
            json.dump(meta, f, indent=1)
        arrays[split] = _open_tokens(path, meta, corpus.weights)
    return arrays


def _cache_problem(path: Path, meta: dict, fingerprint: str, summed: bool = False) -> str | None:
    """Why the array at `path` is not the one its sidecar describes, or None. `summed`: its
    checksum was verified as it was downloaded (Mirror.pull), so it is not read again."""
    if meta["fingerprint"] != fingerprint:
        return "fingerprint differs"
    expected = meta["length"] * np.dtype(meta["dtype"]).itemsize
    if path.stat().st_size != expected:
        return f"{path.stat().st_size} bytes, expected {expected}"
    if not summed and _file_checksum(path) != meta["checksum"]:
        return "checksum differs"
    return None


def _file_checksum(path: Path) -> str:
    digest = checksum()
    with path.open("rb") as f:
        while block := f.read(1 << 24):
            digest.update(block)
    return digest.hexdigest()


def _open_tokens(path: Path, meta: dict, weights: dict[str, float]) -> TokenArray:
    tokens = np.memmap(path, dtype=np.dtype(meta["dtype"]), mode="r", shape=(meta["length"],))
    spans = {name: (int(start), int(end)) for name, (start, end) in meta["spans"].items()}
    return TokenArray(
        tokens=tokens, spans=spans, fingerprint=meta["fingerprint"], weights=weights, path=path
    )
