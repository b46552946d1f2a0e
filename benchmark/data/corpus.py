"""A corpus: the parts a `data.source` names, each split into training and validation documents
by a hash of (part, stable id), so the split never depends on reading order and a corpus that
grows keeps its old documents where they were, and each weighted in the corpus's mixture. Its
fingerprint (identity of the text, split rule and reader version) is the key every cache below it
builds on; its dataset_id adds the weights."""

from __future__ import annotations

import hashlib
import heapq
import itertools
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmark.data.config import DataConfig, cache_root
from benchmark.data.sources import (
    Document,
    Part,
    pinned,
    source_kind,
    source_parts,
)

# Bumped when documents, ids or the split rule change, so caches built by older code are unused.
DATA_FORMAT = "shapebench-data-v1"
# Bumped when the rule that mixes a corpus's parts changes: v1 trained on the parts concatenated
# (embedded: ~94% poetry) and validated on them equally weighted; v2 draws both by the weights.
# Only a corpus of several parts carries it: one part (hf:, files, embedded:wiki)
# reads the same under either rule, so its token caches and tokenizer stay valid (and an hf: or
# file source keeps its dataset_id).
MIXTURE_FORMAT = "weighted-mixture-v2"
SPLITS = ("train", "validation")
# BPE sees at most this much training text per part: ~10 s to train on two cores, and plenty of
# text for an 8k-64k vocabulary.
TOKENIZER_SAMPLE_CHARS = 16_000_000


@dataclass(frozen=True)
class Corpus:
    source: str
    fingerprint: str  # identity and version of the text, the split and the reader code
    parts: tuple[Part, ...]
    val_fraction: float
    max_docs: int | None
    cache_dir: Path

    @property
    def weights(self) -> dict[str, float]:
        """Each part's share of the mixture, in part order; they sum to 1."""
        return {part.name: part.weight for part in self.parts}

    @property
    def dataset_id(self) -> str:
        """The source with its mixture, then the text's fingerprint: an embedded corpus records its
        weights (4 significant digits, finer than any batch can tell apart), e.g.
        embedded:wiki=0.3333,bible=0.3333,poetry=0.3333@<hash>; hf: and files are one part, weight 1
        (an hf: source with the commit read: hf:NAME:CONFIG@<revision>@<hash>)."""
        if source_kind(self.source) != "embedded":
            return f"{self.source}@{self.fingerprint[:12]}"
        mixture = ",".join(f"{name}={weight:.4g}" for name, weight in self.weights.items())
        return f"embedded:{mixture}@{self.fingerprint[:12]}"

    def documents(self, part: Part, split: str) -> Iterator[Document]:
        """The non-empty documents of one split of one part, in reading order."""
        for _, doc in self.split_documents(part, (split,)):
            yield doc

    def split_documents(
        self, part: Part, splits: tuple[str, ...] = SPLITS
    ) -> Iterator[tuple[str, Document]]:
        """(split, document) for the non-empty documents of one part in `splits`, in reading order,
        from one read of the part: each document's split is decided by its hash as it arrives, so
        a stream (an hf: source) is read once for all the splits. ValueError, after the read, for
        a part with no documents or none in one of `splits`."""
        seen, kept = 0, dict.fromkeys(splits, 0)
        non_empty = ((doc_id, text) for doc_id, text in part.read() if text.strip())
        for doc_id, text in itertools.islice(non_empty, self.max_docs):
            seen += 1
            held_out = _in_validation(part.name, doc_id, self.val_fraction)
            split = "validation" if held_out else "train"
            if split in kept:
                kept[split] += 1
                yield split, (doc_id, text)
        if seen == 0:
            raise ValueError(
                f"data source {self.source!r} is empty: part {part.name!r} has no documents"
            )
        empty = [split for split in SPLITS if kept.get(split) == 0]
        if empty:
            raise ValueError(
                f"data source {self.source!r}: part {part.name!r} has no documents in the {empty[0]} split "
                f"({seen} documents in all, data.val_fraction={self.val_fraction}); "
                "add documents or change data.val_fraction"
            )

    def tokenizer_sample(self) -> Iterator[str]:
        """Training text for BPE: per part, a uniform sample of training documents."""
        for part in self.parts:
            yield from _bottom_k(part.name, self.documents(part, "train"), TOKENIZER_SAMPLE_CHARS)


def load_corpus(cfg: DataConfig) -> Corpus:
    """The corpus cfg.source names. Reads no documents, only what fixes its identity (package
    versions, file sizes and times), so a warm cache never opens the text."""
    kind = source_kind(cfg.source)
    cache_dir = cache_root(cfg.cache_dir)
    source = pinned(cfg.source)  # an hf: dataset at one commit, which its dataset_id then names
    parts, identity = source_parts(source, cache_dir / "hf")
    max_docs = cfg.max_docs  # None: every document of the split, an hf: stream to its end
    mixture = [MIXTURE_FORMAT] if len(parts) > 1 else []
    fingerprint = hash_json([DATA_FORMAT, kind, identity, cfg.val_fraction, max_docs, *mixture])
    return Corpus(
        source=source,
        fingerprint=fingerprint,
        parts=tuple(parts),
        val_fraction=cfg.val_fraction,
        max_docs=max_docs,
        cache_dir=cache_dir,
    )


def hash_json(value: Any) -> str:
    """sha256 of a JSON value with sorted keys: the fingerprint of a corpus and of its token arrays."""
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


def _in_validation(part: str, doc_id: str, val_fraction: float) -> bool:
    return _unit_hash(part, doc_id) < val_fraction


def _unit_hash(part: str, doc_id: str) -> float:
    """A stable uniform number in [0, 1) for a document (blake2b: same on every machine/run)."""
    digest = hashlib.blake2b(f"{part}\0{doc_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


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
