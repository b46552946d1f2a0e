"""Tokenizers: known ids, round trips, deterministic BPE training, the on-disk cache, spec errors."""

import json
import logging
import subprocess
import sys

import pytest
import tokenizers

from benchmark.data.tokenizer import EOT, gpt2, load_tokenizer, parse_spec, train_bpe

SAMPLE = "The quick brown fox — naïve café, 東京 🙂\n\tTabs,  double  spaces and <tags>!"

# A small corpus whose BPE training takes well under a second.
CORPUS = [
    f"Line {i}: the {word} of the {word}s, and the {other} beyond the {word}."
    for i, (word, other) in enumerate(
        (w, o)
        for w in ("river", "mountain", "valley", "forest", "harbour")
        for o in ("sea", "sky", "plain")
    )
] * 20


def test_gpt2_known_ids():
    tok = gpt2()
    assert tok.encode("Hello world") == [15496, 995]
    assert tok.vocab_size == 50257
    assert tok.eot_id == 50256
    # The end-of-text token is one token even inside text, as in GPT-2.
    assert tok.encode(f"a{EOT}b") == [64, 50256, 65]
    assert tok.tokenizer_id == f"gpt2@{tok.fingerprint[:12]}"


@pytest.mark.parametrize("make", [gpt2, lambda: train_bpe(CORPUS, 300)], ids=["gpt2", "bpe"])
def test_round_trip(make):
    tok = make()
    ids = tok.encode(SAMPLE)
    assert tok.decode(ids) == SAMPLE
    assert all(0 <= i < tok.vocab_size for i in ids)
    assert tok.encode_batch([SAMPLE, "", "x"]) == [ids, [], tok.encode("x")]


def test_bpe_vocab_and_eot():
    tok = train_bpe(CORPUS, 300)
    assert tok.vocab_size == 300
    assert tok.eot_id == 0
    assert tok.inner.id_to_token(0) == EOT
    assert tok.name == "bpe:300"
    # Merges learned from the corpus: the most frequent word is one token, others are shortened.
    assert tok.encode(" the") == [tok.inner.token_to_id("Ġthe")]
    assert len(tok.encode(" mountain")) == 2


def test_bpe_training_is_deterministic_across_processes():
    first, second = train_bpe(CORPUS, 300), train_bpe(CORPUS, 300)
    assert first.inner.to_str() == second.inner.to_str()
    # A fresh interpreter has fresh hash seeds (Python's and Rust's): the result must not change.
    code = (
        "import json, sys; from benchmark.data.tokenizer import train_bpe; "
        "print(train_bpe(json.load(sys.stdin), 300).fingerprint)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        input=json.dumps(CORPUS),
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == first.fingerprint


def _counting_texts(calls: list):
    def texts():
        calls.append(1)
        return iter(CORPUS)

    return texts


def test_bpe_is_cached_by_corpus_and_vocab(tmp_path):
    calls: list = []
    texts = _counting_texts(calls)
    first = load_tokenizer("bpe:300", cache_dir=tmp_path, corpus_id="corpus-a", texts=texts)
    again = load_tokenizer("bpe:300", cache_dir=tmp_path, corpus_id="corpus-a", texts=texts)
    assert len(calls) == 1
    assert again.fingerprint == first.fingerprint
    assert again.tokenizer_id == first.tokenizer_id
    assert again.encode(SAMPLE) == first.encode(SAMPLE)
    load_tokenizer("bpe:300", cache_dir=tmp_path, corpus_id="corpus-b", texts=texts)
    load_tokenizer("bpe:320", cache_dir=tmp_path, corpus_id="corpus-a", texts=texts)
    assert len(calls) == 3
    assert len(list(tmp_path.glob("tokenizers/*/tokenizer.json"))) == 3


def test_default_bpe_vocab_is_8192(tmp_path):
    tok = load_tokenizer("bpe", cache_dir=tmp_path, corpus_id="c", texts=lambda: iter(CORPUS))
    # The tiny corpus runs out of merges before 8192: the trainer stops early, and the name
    # still records the size asked for.
    assert tok.name == "bpe:8192"
    assert tok.vocab_size < 8192


def test_corrupt_cached_tokenizer_is_retrained(tmp_path, caplog):
    calls: list = []
    texts = _counting_texts(calls)
    first = load_tokenizer("bpe:300", cache_dir=tmp_path, corpus_id="c", texts=texts)
    (path,) = tmp_path.glob("tokenizers/*/tokenizer.json")
    path.write_text('{"version": "1.0", "model": {"ty')
    with caplog.at_level(logging.WARNING):
        again = load_tokenizer("bpe:300", cache_dir=tmp_path, corpus_id="c", texts=texts)
    assert "unreadable" in caplog.text and "retraining" in caplog.text
    assert len(calls) == 2
    assert again.fingerprint == first.fingerprint
    assert tokenizers.Tokenizer.from_file(str(path)).to_str() == first.inner.to_str()


def test_bpe_needs_a_corpus(tmp_path):
    with pytest.raises(
        ValueError, match="'bpe' is trained on the corpus; pass cache_dir, corpus_id and texts"
    ):
        load_tokenizer("bpe", cache_dir=tmp_path, corpus_id="c")


def test_hf_tokenizer_finds_its_end_token(monkeypatch):
    inner = gpt2().inner
    monkeypatch.setattr(tokenizers.Tokenizer, "from_pretrained", staticmethod(lambda name: inner))
    tok = load_tokenizer("hf:openai-community/gpt2")
    assert tok.eot_id == 50256
    assert tok.name == "hf:openai-community/gpt2"


def test_hf_tokenizer_without_end_token(monkeypatch):
    inner = tokenizers.Tokenizer(
        tokenizers.models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]")
    )
    monkeypatch.setattr(tokenizers.Tokenizer, "from_pretrained", staticmethod(lambda name: inner))
    with pytest.raises(
        ValueError, match=r"hf:some/model has no end-of-text token \(looked for <\|endoftext\|>"
    ):
        load_tokenizer("hf:some/model")


@pytest.mark.parametrize(
    "spec, parsed",
    [
        ("bpe", ("bpe", 8192)),
        ("bpe:16384", ("bpe", 16384)),
        ("gpt2", ("gpt2", None)),
        ("hf:a/b", ("hf", "a/b")),
    ],
)
def test_parse_spec(spec, parsed):
    assert parse_spec(spec) == parsed


@pytest.mark.parametrize(
    "spec, message",
    [
        ("bpe:abc", "data.tokenizer: 'bpe:abc' needs a vocabulary size between 257 and"),
        ("bpe:100", "data.tokenizer: 'bpe:100' needs a vocabulary size between 257 and"),
        (
            "gpt3",
            "data.tokenizer: unknown tokenizer 'gpt3'; expected 'bpe', 'bpe:<vocab_size>', 'gpt2' or",
        ),
        ("hf:", "unknown tokenizer 'hf:'"),
        ("gpt2:50257", "unknown tokenizer 'gpt2:50257'"),
        (8192, "data.tokenizer must be a string, got 8192"),
    ],
)
def test_parse_spec_errors(spec, message):
    with pytest.raises(ValueError) as err:
        parse_spec(spec)
    assert message in str(err.value)
