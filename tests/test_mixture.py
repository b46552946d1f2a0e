"""One data mixture: the `embedded:<part>=<w>` forms and their errors, the dataset id that
records the weights, caches of the old (concatenated) rule left unused, training batches and held-out
windows drawn by the weights, and val_loss as the mixture's loss."""

import dataclasses

import numpy as np
import pytest
import torch

from benchmark.data import DataConfig, batches, eval_sets, load_corpus, prepare
from benchmark.data.cache import TokenArray, tokenized
from benchmark.data.corpus import DATA_FORMAT, hash_json
from benchmark.data.sampling import eval_windows
from benchmark.data.sources import source_parts
from benchmark.data.tokenizer import gpt2

SMALL = {"max_docs": 300, "val_fraction": 0.1, "tokenizer": "gpt2"}
PARTS = "parts are wiki, bible, poetry, as embedded:<part>[,<part>] (equal weights) or embedded:<part>=<weight>[,...]"


def _weights(source: str) -> dict[str, float]:
    return load_corpus(DataConfig(source=source, max_docs=1)).weights


# --- the forms and their errors -------------------------------------------------------------


def test_default_is_equal_weights_and_weights_are_relative():
    third = pytest.approx(1 / 3)
    assert _weights("embedded") == {"wiki": third, "bible": third, "poetry": third}
    assert _weights("embedded:bible, wiki") == {
        "wiki": 0.5,
        "bible": 0.5,
    }  # a subset: equal, canonical order
    assert _weights("embedded:poetry=0.3,wiki=0.5,bible=0.2") == {
        "wiki": 0.5,
        "bible": 0.2,
        "poetry": 0.3,
    }
    assert _weights("embedded:wiki=2,bible=1") == {
        "wiki": pytest.approx(2 / 3),
        "bible": pytest.approx(1 / 3),
    }
    assert _weights("embedded:poetry") == {"poetry": 1.0}


@pytest.mark.parametrize(
    "source, problem",
    [
        ("embedded:wiki=x", "the weight of part 'wiki' must be a positive number, got 'x'"),
        ("embedded:wiki=0,bible=1", "the weight of part 'wiki' must be a positive number, got '0'"),
        (
            "embedded:wiki=-0.5,bible=1",
            "the weight of part 'wiki' must be a positive number, got '-0.5'",
        ),
        ("embedded:wiki=nan", "the weight of part 'wiki' must be a positive number, got 'nan'"),
        ("embedded:wiki=inf", "the weight of part 'wiki' must be a positive number, got 'inf'"),
        ("embedded:wiki=", "the weight of part 'wiki' must be a positive number, got ''"),
        ("embedded:novels=0.5,wiki=0.5", "unknown embedded part(s) 'novels'"),
        ("embedded:wikii=0.5,bible=0.5", "unknown embedded part(s) 'wikii' (did you mean 'wiki'?)"),
        ("embedded:wiki=0.5,bible", "give every part a weight or none"),
        ("embedded:wiki=0.5,wiki=0.2", "part(s) 'wiki' named more than once"),
    ],
)
def test_bad_mixtures_are_one_line_naming_the_parts(source, problem):
    with pytest.raises(ValueError) as err:
        DataConfig(source=source)
    assert str(err.value) == (
        f"data.source: {problem} in {source!r}; {PARTS} (e.g. embedded:wiki=0.5,bible=0.2,poetry=0.3)"
    )


def test_bad_mixture_exits_2_from_the_command_line(tmp_path, capsys):
    from benchmark.search.command import search_main as main

    spec = tmp_path / "arch.yaml"
    spec.write_text(
        "family: looped\nd_model: 32\nn_heads: 2\nvocab_size: 300\nlayers: {begin: 1, middle: 1, end: 1}\n"
    )
    assert main(["--spec", str(spec), "--data", "embedded:wiki=x,bible=1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        "shapebench search: data.source: the weight of part 'wiki' must be a positive number, got 'x'"
    )
    assert err.count("\n") == 1


# --- the dataset id and the caches ----------------------------------------------------------


def test_dataset_id_records_the_weights(tmp_path):
    def dataset_id(source: str) -> str:
        return load_corpus(DataConfig(source=source, cache_dir=str(tmp_path))).dataset_id

    fingerprint = load_corpus(DataConfig(cache_dir=str(tmp_path))).fingerprint[:12]
    assert (
        dataset_id("embedded") == f"embedded:wiki=0.3333,bible=0.3333,poetry=0.3333@{fingerprint}"
    )
    assert (
        dataset_id("embedded:wiki=0.5,bible=0.2,poetry=0.3")
        == f"embedded:wiki=0.5,bible=0.2,poetry=0.3@{fingerprint}"
    )
    # One mixture, one id however it is spelled; another mixture of the same text, another id.
    assert dataset_id("embedded:wiki=1,bible=1,poetry=1") == dataset_id("embedded")
    assert dataset_id("embedded:wiki=2,bible=1") == dataset_id("embedded:bible=0.5,wiki=1.0")
    assert dataset_id("embedded:wiki=2,bible=1") != dataset_id("embedded:wiki,bible")
    (tmp_path / "a.txt").write_text("one\n\ntwo\n")
    local = load_corpus(DataConfig(source=str(tmp_path / "a.txt"), cache_dir=str(tmp_path)))
    assert (
        local.weights == {"text": 1.0}
        and local.dataset_id == f"{tmp_path / 'a.txt'}@{local.fingerprint[:12]}"
    )


def _old_rule_fingerprint(cfg: DataConfig) -> str:
    """The corpus fingerprint before the mixture rule (concatenated parts)."""
    _, identity = source_parts(cfg.source, load_corpus(cfg).cache_dir / "hf")
    kind = "embedded" if cfg.source.startswith("embedded") else "local"
    return hash_json([DATA_FORMAT, kind, identity, cfg.val_fraction, cfg.max_docs])


def test_caches_of_the_old_rule_are_not_reused(tmp_path, count_encodes):
    tok = gpt2()
    mixed = DataConfig(source="embedded:wiki,bible", **SMALL, cache_dir=str(tmp_path))
    new = load_corpus(mixed)
    old = dataclasses.replace(new, fingerprint=_old_rule_fingerprint(mixed))
    assert old.fingerprint != new.fingerprint
    tokenized(old, tok, "validation")  # the cache the concatenated rule built
    count_encodes.clear()
    tokenized(new, tok, "validation")
    assert count_encodes, "the new rule read the old rule's token cache"
    assert len(list(tmp_path.glob("tokens/validation-*.bin"))) == 2
    # One part mixes the same under either rule: its fingerprint, caches and id are unchanged.
    one = DataConfig(source="embedded:wiki", **SMALL, cache_dir=str(tmp_path))
    assert load_corpus(one).fingerprint == _old_rule_fingerprint(one)


def test_prepare_carries_the_weights_to_both_splits(tmp_path):
    prepared = prepare(
        DataConfig(source="embedded:wiki=0.8,bible=0.2", **SMALL, cache_dir=str(tmp_path))
    )
    assert prepared.train.weights == prepared.val.weights == {"wiki": 0.8, "bible": 0.2}
    assert prepared.dataset_id.startswith("embedded:wiki=0.8,bible=0.2@")
    # Another mixture of the same parts shares the token arrays (the weights are not in their key).
    again = prepare(DataConfig(source="embedded:wiki,bible", **SMALL, cache_dir=str(tmp_path)))
    assert again.train.fingerprint == prepared.train.fingerprint and again.train.weights == {
        "wiki": 0.5,
        "bible": 0.5,
    }
    assert len(list(tmp_path.glob("tokens/*.bin"))) == 2


# --- training batches -----------------------------------------------------------------------

# Three parts told apart by token value: a (100 tokens) is far smaller than its share, b is large.
SIZES = {"a": 100, "b": 10_000, "c": 2_000}
WEIGHTS = {"a": 0.5, "b": 0.2, "c": 0.3}


def _mixture(weights: dict[str, float] = WEIGHTS) -> TokenArray:
    bounds = np.cumsum([0, *SIZES.values()])
    spans = {name: (int(start), int(end)) for name, start, end in zip(SIZES, bounds, bounds[1:])}
    return TokenArray(
        tokens=np.arange(bounds[-1], dtype=np.uint16), spans=spans, fingerprint="f", weights=weights
    )


def _part_of(rows: torch.Tensor, train: TokenArray) -> list[str]:
    names = []
    for row in rows:
        (name,) = [
            n
            for n, (start, end) in train.spans.items()
            if start <= int(row[0]) and int(row[-1]) < end
        ]
        names.append(name)  # the unpacking fails for a window that straddles two parts
    return names


def test_batches_hold_the_mixture():
    """Over 200 batches of 16 rows the realised token shares are the weights within 0.01 (the
    leftover row's binomial noise: sd 0.0018 for b and c); a gets its floor(16 x 0.5) = 8 rows in
    every batch although its 100 tokens repeat about 3 times a batch."""
    train = _mixture()
    stream = batches(train, seq_len=8, batch_size=16, seed=0)
    counts = {name: 0 for name in SIZES}
    for _ in range(200):
        x, y = next(stream)
        assert torch.equal(y[:, :-1], x[:, 1:])
        names = _part_of(torch.cat([x, y[:, -1:]], dim=1), train)
        assert names.count("a") == 8 and 3 <= names.count("b") <= 4 and 4 <= names.count("c") <= 5
        for name in names:
            counts[name] += 1
    shares = {name: n / (200 * 16) for name, n in counts.items()}
    assert shares == {name: pytest.approx(w, abs=0.01) for name, w in WEIGHTS.items()}


def test_batches_are_deterministic_per_seed_and_resume():
    def take(seed: int, n: int = 6, skip: int = 0):
        stream = batches(_mixture(), seq_len=8, batch_size=16, seed=seed, skip=skip)
        return [next(stream)[0] for _ in range(n - skip)]

    first, again, other = take(0), take(0), take(1)
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    assert not any(torch.equal(a, b) for a, b in zip(first, other))
    assert all(torch.equal(a, b) for a, b in zip(take(0, skip=4), first[4:]))


def test_one_part_draws_as_before():
    """hf: and files are one part of weight 1: under `replacement` (the sampling of studies begun
    before permutations) the same windows as the concatenated rule drew."""
    tokens = np.arange(1000, dtype=np.uint16)
    one = TokenArray(
        tokens=tokens, spans={"text": (0, 1000)}, fingerprint="f", weights={"text": 1.0}
    )
    generator = torch.Generator().manual_seed(3)
    stream = batches(one, seq_len=16, batch_size=4, seed=3, sampling="replacement")
    for _ in range(3):
        starts = torch.randint(1000 - 16, (4,), generator=generator)  # the old rule, verbatim
        assert torch.equal(
            next(stream)[0],
            torch.from_numpy(tokens.astype(np.int64))[starts[:, None] + torch.arange(16)],
        )


def test_counts_follow_the_mixture():
    """The unigram baseline's counts: len(train) tokens drawn by the weights (a's 100 tokens count
    as half of 12,100), not the concatenation's frequencies."""
    train = _mixture()
    counts = train.counts(minlength=12_100)
    assert counts.sum() == pytest.approx(len(train))
    assert counts[:100].sum() == pytest.approx(0.5 * 12_100) and counts[0] == pytest.approx(60.5)
    assert counts[100:10_100].sum() == pytest.approx(0.2 * 12_100)


# --- held-out windows and val_loss ----------------------------------------------------------


def test_eval_sets_take_the_weights_shares():
    """N = 3 parts x (80 // 8) = 30 windows, split 15 / 6 / 9; a holds only 12 windows, so N
    shrinks to 24 (12 / 4.8 / 7.2 -> 12 / 5 / 7) rather than repeat any."""
    val = _mixture()
    sizes = {name: len(w) for name, w in eval_sets(val, seq_len=8, n_tokens=80).items()}
    assert sizes == {"a": 12, "b": 5, "c": 7}
    assert {name: len(w) for name, w in eval_sets(val, seq_len=8, n_tokens=40).items()} == {
        "a": 8,
        "b": 3,
        "c": 4,
    }
    # Equal weights: n_tokens per part, the windows of the rule before the mixture.
    equal = eval_sets(_mixture({"a": 1 / 3, "b": 1 / 3, "c": 1 / 3}), seq_len=8, n_tokens=80)
    for name, windows in equal.items():
        assert torch.equal(windows, eval_windows(val.part(name), 8, 80))
    tiny = TokenArray(
        tokens=np.arange(8, dtype=np.uint16),
        spans={"x": (0, 8)},
        fingerprint="f",
        weights={"x": 1.0},
    )
    with pytest.raises(
        ValueError,
        match="an evaluation window needs seq_len \\+ 1 = 9 tokens; part 'x' of the held-out",
    ):
        eval_sets(tiny, seq_len=8, n_tokens=80)


def test_val_loss_is_the_mixtures_loss():
    """evaluate() averages over the held-out tokens, whose part shares are the weights' to within a
    window: val_loss is sum(w_p * loss_p) within max|loss_p - val_loss| / N, here 1/30 of the spread."""
    from benchmark import build_model
    from benchmark.trial.evaluate import evaluate

    torch.manual_seed(0)
    model = build_model(
        {
            "family": "looped",
            "d_model": 32,
            "n_heads": 2,
            "vocab_size": 12_100,
            "layers": {"begin": 1, "middle": 1, "end": 1},
        }
    )
    sets = eval_sets(_mixture({"a": 0.2, "b": 0.5, "c": 0.3}), seq_len=8, n_tokens=80)
    assert {name: len(w) for name, w in sets.items()} == {
        "a": 6,
        "b": 15,
        "c": 9,
    }  # exact shares of 30
    result = evaluate(model, sets)
    per = result["val_loss_by_source"]
    assert len(set(per.values())) == 3
    assert result["val_loss"] == pytest.approx(
        0.2 * per["a"] + 0.5 * per["b"] + 0.3 * per["c"], rel=1e-9
    )
