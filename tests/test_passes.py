"""Data counted and never capped in silence: sampling without replacement within a pass (a
per-seed permutation of windows; the old sampling kept for studies begun under it), `skip=k`
resuming exactly, the passes a run makes over each part (plan, rows), `data.max_epochs` refused in
one line by the plan and the search, and the `data:` section of a space."""

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from benchmark.data import DataConfig, batches, passes, prepare
from benchmark.data.cache import TokenArray
from benchmark.perf import probe
from benchmark.search import SearchOptions
from benchmark.search.command import plan_main, search_main
from benchmark.search.optuna_study import declaration
from benchmark.search.preflight import as_declared_data
from benchmark.space import load_space
from benchmark.space.plan import TRIAL_REST_S
from benchmark.space.source import parse_set
from benchmark.store.declaration import write_study_info
from benchmark.store.speeds import Speed

QUICKSTART = str(Path(__file__).resolve().parent.parent / "search_spaces" / "quickstart.yaml")
SIZES = {"a": 101, "b": 1_001, "c": 401}  # told apart by token value; 12, 125 and 50 windows of 8
WEIGHTS = {"a": 0.5, "b": 0.2, "c": 0.3}


@pytest.fixture(autouse=True)
def fixed_machine(monkeypatch):
    monkeypatch.setattr(probe, "probe_speed", lambda spec, cfg: Speed(5e10, TRIAL_REST_S, 0))


def mixture() -> TokenArray:
    bounds = np.cumsum([0, *SIZES.values()])
    spans = {n: (int(s), int(e)) for n, s, e in zip(SIZES, bounds, bounds[1:])}
    return TokenArray(
        tokens=np.arange(bounds[-1], dtype=np.uint16), spans=spans, fingerprint="f", weights=WEIGHTS
    )


def starts_by_part(x: torch.Tensor, train: TokenArray) -> dict[str, list[int]]:
    out = {name: [] for name in train.spans}
    for row in x:
        first = int(row[0])
        name = next(n for n, (s, e) in train.spans.items() if s <= first < e)
        assert int(row[-1]) < train.spans[name][1]  # no window straddles two parts
        out[name].append(first - train.spans[name][0])
    return out


def test_one_pass_reads_each_window_once():
    """Part b's 125 windows of 8 (+1) tokens at 3-4 rows a batch: its first 125 windows are each
    window exactly once, starts 0, 8, ..., 992; part a's 12 at 8 rows a batch: every pass of 12 is
    a permutation of them, the second in another order."""
    train, seen = mixture(), {name: [] for name in SIZES}
    stream = batches(train, seq_len=8, batch_size=16, seed=0)
    for _ in range(40):
        x, y = next(stream)
        assert torch.equal(y[:, :-1], x[:, 1:])
        for name, starts in starts_by_part(x, train).items():
            seen[name] += starts
    assert sorted(seen["b"][:125]) == list(range(0, 1000, 8))
    assert sorted(seen["c"][:50]) == list(range(0, 400, 8))
    a = seen["a"]
    assert all(sorted(a[k : k + 12]) == list(range(0, 96, 8)) for k in range(0, 12 * 20, 12))
    assert a[:12] != a[12:24]


@pytest.mark.parametrize("sampling", ["permutation", "replacement"])
def test_skip_k_is_drawing_and_discarding_k(sampling):
    """The batch at step k is a function of (data, seed, k): skip=k gives the batches from k on
    that drawing and discarding the first k gives (the passes of part a straddle batches)."""

    def take(skip: int, n: int = 9):
        stream = batches(mixture(), seq_len=8, batch_size=16, seed=5, skip=skip, sampling=sampling)
        return [next(stream)[0] for _ in range(n - skip)]

    whole = take(0)
    for k in (1, 4, 7):
        assert all(torch.equal(a, b) for a, b in zip(take(k), whole[k:], strict=True))


def test_a_part_without_rows_in_a_batch():
    """At weights 0.98 / 0.02 and 8 rows, part b gets a row only when the leftover draw picks it:
    most batches read none of it, and each of its windows still comes once a pass."""
    train = mixture()
    train = TokenArray(
        tokens=train.tokens,
        spans=train.spans,
        fingerprint="f",
        weights={"a": 0.98, "b": 0.02, "c": 0.0},
    )
    seen = []
    stream = batches(train, seq_len=8, batch_size=8, seed=1)
    for _ in range(300):
        seen += starts_by_part(next(stream)[0], train)["b"]
    assert 0 < len(seen) < 300 and len(seen) == len(set(seen))  # under one pass of its 125


def test_seeds_pair_and_differ():
    """One seed, one sequence, whichever family trains on it (the pairing of seeds); another
    seed another order."""

    def first(seed: int) -> torch.Tensor:
        return next(batches(mixture(), seq_len=8, batch_size=16, seed=seed))[0]

    assert torch.equal(first(3), first(3)) and not torch.equal(first(3), first(4))


def test_the_old_sampling_is_kept():
    """`replacement` draws as studies begun before did: the rows from the leftover multinomial,
    then a uniform start per row and part, from one generator (the old code, verbatim)."""
    train = mixture()
    generator = torch.Generator().manual_seed(2)
    stream = batches(train, seq_len=8, batch_size=16, seed=2, sampling="replacement")
    base = np.array([8, 3, 4])
    leftover = torch.tensor([0.0, 0.2, 0.8], dtype=torch.float64)
    for _ in range(3):
        rows = base + np.bincount(
            torch.multinomial(leftover, 1, replacement=True, generator=generator).numpy(),
            minlength=3,
        )
        starts = [
            torch.randint(n - 8, (int(r),), generator=generator)
            for n, r in zip(SIZES.values(), rows)
        ]
        expected = torch.cat(
            [s[:, None] + torch.arange(8) + off for s, off in zip(starts, (0, 101, 1102))]
        )
        assert torch.equal(next(stream)[0], expected)


def test_passes():
    assert passes(
        10_000_000, {"wiki": 0.5, "bible": 0.5}, {"wiki": 2_000_000, "bible": 1_000_000}
    ) == {
        "wiki": 2.5,
        "bible": 5.0,
    }


def test_the_data_section():
    space = load_space(QUICKSTART, [parse_set("data.max_epochs=2.5")])
    assert space.data == {"max_epochs": 2.5} and space.data_value("sampling") == "permutation"
    assert declaration(space)["data"] == {"max_docs": None, "sampling": "permutation"}
    with pytest.raises(
        ValueError,
        match=r"--set data.sampling=random: data.sampling: 'random' is not one of permutation, replacement",
    ):
        load_space(QUICKSTART, [parse_set("data.sampling=random")])


def test_a_study_keeps_the_sampling_it_began_under(tmp_path):
    """A declaration without `data:` (a study begun before) resumes under `replacement`; one that
    records a sampling keeps it; a new study takes the space's."""
    space = load_space(QUICKSTART, [])

    def sampling(name: str, info: dict | None) -> tuple[str, str]:
        opts = SearchOptions(name=name, results_dir=tmp_path, data=DataConfig())
        if info is not None:
            write_study_info(opts.study_dir, info)
        s, o = as_declared_data(space, opts)
        return s.data_value("sampling"), o.data.sampling

    assert sampling("new", None) == ("permutation", "permutation")
    assert sampling("old", {"space": "quickstart", "training": {}}) == (
        "replacement",
        "replacement",
    )
    recorded = {"space": "quickstart", "data": {"sampling": "permutation", "max_docs": None}}
    assert sampling("recorded", recorded) == ("permutation", "permutation")


@pytest.fixture
def tokenised(corpus, tmp_path, monkeypatch):
    """The 13-word corpus tokenised (BPE 320) into this test's cache, as a search leaves it."""
    monkeypatch.setenv("SHAPEBENCH_CACHE", str(tmp_path / "cache"))
    data = prepare(DataConfig(source=str(corpus / "text.txt"), tokenizer="bpe:320"))
    return str(corpus / "text.txt"), len(data.train.part("text"))


def test_the_plan_counts_passes_and_refuses_too_many(tokenised, capsys):
    """600K tokens of the quickstart's runs over a corpus of ~16K: the plan prints the passes and
    exits 2 in one line naming the part and data.max_epochs; raised, it plans and each record says
    how many passes its run makes."""
    source, n = tokenised
    args = [QUICKSTART, "--data", source, "--tokenizer", "bpe:320", "--json"]
    assert plan_main(args) == 2
    out, err = capsys.readouterr()
    epochs = 600_000 / n
    assert f"data: text {n / 1000:.4g}K tokens" in err.replace(",", "")
    last = err.strip().splitlines()[-1]
    assert re.fullmatch(
        rf"{re.escape(QUICKSTART)}:1:1: data\.max_epochs: candidate 0 \(transformer\) trains "
        rf"600K tokens, {epochs:.2f} passes over part 'text' of the data, more than "
        r"data\.max_epochs 4; raise data\.max_epochs, train fewer tokens or use a larger corpus",
        last,
    ), last
    assert plan_main([*args, "--set", "data.max_epochs=100"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["epochs_by_source"] for r in rows] == [{"text": pytest.approx(epochs)}] * 3
    assert [r["tokens_by_source"] for r in rows] == [{"text": n}] * 3


def test_the_search_refuses_too_many_passes(tokenised, tmp_path, capsys):
    """Before anything trains (no Ray): exit 2, one line."""
    source, _ = tokenised
    args = [QUICKSTART, "--data", source, "--tokenizer", "bpe:320"]
    assert search_main([*args, "--results", str(tmp_path / "r"), "--yes"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "more than data.max_epochs 4" in err[0], err


PASSES_SPACE = """name: passes
budget: 100K
count: total
tolerance: 2%
base: {vocab_size: 320, n_heads: 2, layers: {begin: 1, middle: 1, end: 1}}
axes:
  family: [transformer]
training: {tokens: 80K, seq_len: 32, batch_size: 8, lr: 3e-3, eval_tokens: 2K}
quantize: {group_size: 16, calib_sequences: 16}
objectives: [val_loss:min]
trials: 1
"""


@pytest.mark.slow
def test_a_search_with_max_epochs_raised_records_the_passes(corpus, tmp_path, capfd):
    """80K tokens over the 13-word corpus's ~16K: refused at the default data.max_epochs (exit 2,
    one line, before Ray starts); raised to 8, the search runs and its row says how many passes
    it made, how its batches drew, and its declaration records the sampling."""
    import pandas as pd
    import tiny_search

    space = tmp_path / "passes.yaml"
    space.write_text(PASSES_SPACE)
    results = tmp_path / "results"
    args = [
        str(space),
        *tiny_search.cli(corpus),
        *tiny_search.CPU_FLAGS,
        "--results",
        str(results),
        "--yes",
    ]
    assert search_main(args) == 2
    err = [line for line in capfd.readouterr().err.splitlines() if line.strip()]
    assert (
        len(err) == 1
        and "passes over part 'text' of the data, more than data.max_epochs 4" in err[0]
    )
    assert search_main([*args, "--set", "data.max_epochs=8"]) == 0
    row = pd.read_parquet(results / "passes").iloc[0]
    n = json.loads(row["tokens_by_source"])["text"]
    assert row["status"] == "ok" and row["sampling"] == "permutation"
    assert json.loads(row["epochs_by_source"]) == {"text": round(row["tokens_trained"] / n, 4)}
    assert 4 < row["tokens_trained"] / n < 8
    info = json.loads((results / "passes" / "_study.json").read_text())
    assert info["data"] == {"max_docs": None, "sampling": "permutation"}
