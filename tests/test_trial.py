"""One trial end to end on a small local corpus: determinism, schedules, token budgets,
divergence, checkpoints and the errors a user can act on."""

import json
import math

import pandas as pd
import pytest
import torch
from claim_files import abbie_loops_claim
from tiny_trial import CFG, SPEC

from benchmark import ArchSpec
from benchmark.recipe import QuantizeConfig, TrainConfig, fmt_count, parse_amount
from benchmark.store.metrics import TIME_SPLIT
from benchmark.trial.checkpoint import CheckpointError, load_checkpoint
from benchmark.trial.run import run_trial

# A claim's undecided pair, in the claims' words (stats.verdict is the interval's, before adjustment).
UNDECIDED = {"inconclusive": "not decided"}


def test_same_seed_same_losses_different_seed_different(grammar_corpus):
    a = run_trial(SPEC, TrainConfig(**CFG, seed=1), data=grammar_corpus)
    b = run_trial(SPEC, TrainConfig(**CFG, seed=1), data=grammar_corpus)
    c = run_trial(SPEC, TrainConfig(**CFG, seed=2), data=grammar_corpus)
    assert a["status"] == b["status"] == "ok"
    assert a["val_loss"] == b["val_loss"] and a["train_loss"] == b["train_loss"]
    assert a["val_loss"] != c["val_loss"]
    assert a["tokens_trained"] == 79 * 256  # ceil(20K / (8 x 32)) steps of 256 tokens
    assert set(json.loads(a["val_ppl_by_loops"])) == {"1", "2", "3"}
    # r = 1 and 2 are registry metrics; 3 is no metric (kept in val_ppl_by_loops); 4 and 8 were not evaluated
    assert a["val_loss_r1"] > 0 and a["val_loss_r2"] == a["val_loss"] and "val_loss_r3" not in a
    assert a["val_loss_r4"] is None and a["val_loss_r8"] is None
    assert a["val_ppl"] < 0.5 * a["val_ppl_unigram"]  # it learned more than token frequencies


def test_row_has_the_spec_columns(grammar_corpus):
    row = run_trial(SPEC, TrainConfig(**CFG), data=grammar_corpus)
    for col in (
        "family",
        "spec",
        "params_total",
        "params_non_embedding",
        "flops_per_token_train",
        "flops_per_token_infer",
        "tokens_trained",
        "val_loss",
        "val_ppl",
        "tokens_per_s",
        "peak_mem_bytes",
        "wall_s",
        "seed",
        "dataset_id",
        "tokenizer_id",
        "code_version",
        "started_at",
        "finished_at",
        "status",
        "error",
    ):
        assert col in row, col
    assert ArchSpec.from_dict(json.loads(row["spec"])).family == "looped"
    assert row["val_ppl"] == pytest.approx(math.exp(row["val_loss"]))


def test_the_row_says_where_the_trial_time_went(grammar_corpus):
    """compile / train / eval / quantise seconds: parts of wall_s, and train_s is the
    time the measured throughput accounts for, so wall_s - train_s is the trial's overhead."""
    row = run_trial(SPEC, TrainConfig(**{**CFG, "eval_every": 5}), data=grammar_corpus)
    split = [row[k] for k in TIME_SPLIT]
    assert TIME_SPLIT == ("compile_s", "train_s", "eval_s", "quantize_s")
    assert all(v > 0 for v in split[1:])
    assert sum(split) <= row["wall_s"] + 1e-6
    steady = row["tokens_trained"] / row["tokens_per_s"]  # every step at the measured pace
    if row["compile_s"] > 0:  # the first step was slower than the pace: its excess is compile_s
        assert row["train_s"] == pytest.approx(steady, rel=1e-6)
    else:  # an eager first step can beat the pace; then nothing is compile
        assert row["train_s"] <= steady
    assert len(json.loads(row["evals"])) >= 2  # the periodic evaluations are in eval_s, not train_s


def test_rows_carry_the_hyper_connection_diagnostics(grammar_corpus, tmp_path):
    """Hyperloop's row has every diagnostic; a looped model's has none; both survive the store."""
    from benchmark.store.metrics import DIAGNOSTICS
    from benchmark.store.results import read_study, write_row

    hyper = run_trial(
        {**SPEC, "family": "hyperloop", "hyper": {"streams": 2}},
        TrainConfig(**CFG),
        data=grammar_corpus,
        quantize=False,
    )
    plain = run_trial(SPEC, TrainConfig(**CFG), data=grammar_corpus, quantize=False)
    assert 0.0 < hyper["stream_cosine"] < 1.0 - 1e-6  # two streams, not copies
    assert hyper["hres_deviation"] > 0 and hyper["loop_emb_norm"] > 0
    assert 0.0 <= hyper["gate_saturation"] <= 1.0
    assert all(plain[k] is None for k in DIAGNOSTICS)
    for i, row in enumerate((hyper, plain)):
        write_row(tmp_path, {**row, "study": "s", "trial_id": f"t{i}"})
    df = read_study(tmp_path).set_index("family")
    assert df.loc["hyperloop", "stream_cosine"] == hyper["stream_cosine"]
    assert df.loc["looped", DIAGNOSTICS].isna().all()
    # the streams' storage is a column: fp32 on a CPU (`auto`), none without streams
    assert df.loc["hyperloop", "stream_dtype"] == "fp32" and pd.isna(
        df.loc["looped", "stream_dtype"]
    )


def test_divergence_is_recorded_not_raised(grammar_corpus):
    row = run_trial(
        SPEC, TrainConfig(**{**CFG, "lr": 1e4, "grad_clip": 0, "warmup": 0}), data=grammar_corpus
    )
    assert row["status"] == "diverged" and "loss is" in row["error"]
    # its row says how far it got, through the step whose loss was NaN, and where the time went
    step = int(row["error"].split(" at step ")[1].split()[0])
    assert step >= 1 and row["tokens_trained"] == (step + 1) * 8 * 32
    assert row["compile_s"] is not None and row["train_s"] > 0
    assert row["eval_s"] == 0 and row["quantize_s"] is None  # no evaluation, no quantisation
    assert row["compile_s"] + row["train_s"] <= row["wall_s"]


def test_checkpoint_round_trip_and_spec_mismatch(grammar_corpus, tmp_path):
    run_trial(SPEC, TrainConfig(**CFG), data=grammar_corpus, checkpoint_dir=tmp_path / "ck")
    assert {p.name for p in (tmp_path / "ck").iterdir()} == {
        "model.safetensors",
        "spec.json",
        "meta.json",
        "tokenizer.json",
    }
    model, meta = load_checkpoint(tmp_path / "ck", spec=SPEC)
    assert meta["tokenizer_id"] == grammar_corpus.tokenizer.tokenizer_id
    x = torch.randint(0, 300, (1, 8))
    assert torch.isfinite(model(x)).all()
    with pytest.raises(CheckpointError, match="d_model is 32 in the checkpoint, 64 requested"):
        load_checkpoint(tmp_path / "ck", spec={**SPEC, "d_model": 64})
    with pytest.raises(CheckpointError, match="not a shapebench checkpoint"):
        load_checkpoint(tmp_path)


def test_vocab_mismatch_is_a_clear_error(grammar_corpus):
    n = grammar_corpus.tokenizer.vocab_size
    with pytest.raises(
        ValueError,
        match=f"vocab_size: the spec has 100 but tokenizer bpe:300@.* has {n}; set vocab_size: {n}",
    ):
        run_trial({**SPEC, "vocab_size": 100}, TrainConfig(**CFG), data=grammar_corpus)


def test_schedules():
    cfg = TrainConfig(lr=1.0, warmup=10)
    assert cfg.lr_at(0, 110) == pytest.approx(0.1) and cfg.lr_at(9, 110) == pytest.approx(1.0)
    assert cfg.lr_at(60, 110) == pytest.approx(0.55)  # cosine midpoint
    assert cfg.lr_at(110, 110) == pytest.approx(0.1)
    wsd = TrainConfig(lr=1.0, warmup=0.1, schedule="wsd", decay=0.2, min_lr=0.0)
    assert wsd.lr_at(50, 100) == 1.0 and wsd.lr_at(79, 100) == 1.0
    assert wsd.lr_at(90, 100) == pytest.approx(0.5) and wsd.lr_at(100, 100) == pytest.approx(0.0)


def test_token_budgets():
    params = {"total": 1_000_000, "non_embedding": 400_000}
    assert TrainConfig(tokens="20x").total_tokens(params) == 20_000_000
    assert TrainConfig(tokens="20x", tokens_per="non_embedding").total_tokens(params) == 8_000_000
    assert TrainConfig(tokens="5M").total_tokens(params) == 5_000_000
    assert TrainConfig(tokens=12345, batch_size=10, seq_len=100).steps(params) == 13
    assert parse_amount("1.2B") == 1_200_000_000 and parse_amount("113_000_000") == 113_000_000
    assert parse_amount("500K") == 500_000 and fmt_count(113e6) == "113M"
    for bad in ("12Q", "x20", "-5M", "0"):
        with pytest.raises(ValueError):
            TrainConfig(tokens=bad)
    with pytest.raises(ValueError, match="training.schedule: 'linear' is not one of cosine, wsd"):
        TrainConfig(schedule="linear")
    with pytest.raises(ValueError, match="training.warmpu: unknown key"):
        TrainConfig.from_dict({"warmpu": 0.1})


def test_one_trial_from_the_command_line(grammar_corpus, tmp_path, capsys):
    from benchmark.search.command import search_main as main

    spec = tmp_path / "arch.yaml"
    spec.write_text(
        "family: looped\nd_model: 32\nn_heads: 2\nvocab_size: 300\n"
        "layers: {begin: 1, middle: 1, end: 1}\ntraining: {seq_len: 32, batch_size: 8, eval_tokens: 1K}\n"
    )
    text = grammar_corpus.dataset_id.split("@")[0]
    args = [
        "--spec",
        str(spec),
        "--tokens",
        "8K",
        "--data",
        text,
        "--tokenizer",
        "bpe:300",
        "--no-compile",
        "--precision",
        "fp32",
        "--checkpoint",
        str(tmp_path / "ck"),
    ]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert (
        "val_ppl" in out
        and "val_ppl_int4" in out
        and (tmp_path / "ck" / "model.safetensors").is_file()
    )
    spec.write_text("family: looped\nd_model: 32\nn_heads: 2\nlayers: {begin: 1, middle: 0}\n")
    assert main(args) == 2
    assert (
        capsys.readouterr().err
        == f"{spec}:4:20: layers.middle: layers.middle must be > 0 when loops > 1\n"
    )


def test_evaluation_scores_the_head_in_chunks_and_gets_the_same_loss(monkeypatch):
    """Evaluation's head (score_head_loss) runs the head and the softmax over chunks of tokens,
    so the (B, T, vocab) logits are never written whole; its mean is head_loss's, and evaluate
    reads it: 3 x 50 tokens of a 300-token vocabulary in chunks of 64 tokens (3 chunks)."""
    from benchmark import build_model
    from benchmark.trial import step
    from benchmark.trial.evaluate import evaluate

    torch.manual_seed(0)
    model = build_model(SPEC).eval()
    windows = torch.randint(0, SPEC["vocab_size"], (3, 51))
    x, y = windows[:, :-1], windows[:, 1:]
    monkeypatch.setitem(step.SCORE_CHUNK_LOGITS, "cpu", 64 * SPEC["vocab_size"])
    calls = []
    logits = model._logits
    monkeypatch.setattr(model, "_logits", lambda h: calls.append(h.shape[0]) or logits(h))
    with torch.no_grad():
        whole = step.head_loss(model, model.features(x), y, None)
        calls.clear()
        chunked = step.score_head_loss(model, model.features(x), y, None)
    assert calls == [64, 64, 22]
    assert chunked.item() == pytest.approx(whole.item(), rel=1e-6)
    assert (
        chunked.item() > 5.0
    )  # an untrained model: about log(300) = 5.7, not a zero from an empty sum
    calls.clear()
    assert evaluate(model, {"one": windows}, None)["val_loss"] == pytest.approx(
        whole.item(), rel=1e-6
    )
    assert calls == [64, 64, 22]  # one batch of 3 windows, scored in chunks


# --- per-loop metrics: AbbIE evaluates at r = 1, 2, 4, 8 test-time iterations (§4.3, Table 2) -----

ABBIE_D = {
    "family": "abbie-d",
    "d_model": 32,
    "n_heads": 2,
    "vocab_size": 300,
    "layers": {"begin": 1, "middle": 1, "end": 1},
}  # the preset: trained at 2 loops, eval_loops 1, 2, 4, 8
LOOP_CLAIM = abbie_loops_claim(
    "AbbIE-D at its training iterations beats itself at 8", "abbie", better=2, worse=8
)


@pytest.fixture(scope="module")
def abbie_results(grammar_corpus, tmp_path_factory):
    """Three seeds of a tiny AbbIE-D in a results store, as a search writes them."""
    from benchmark.store.results import write_row

    root = tmp_path_factory.mktemp("results")
    for seed in range(3):
        row = run_trial(
            ABBIE_D,
            TrainConfig(**{**CFG, "tokens": "10K", "seed": seed}),
            data=grammar_corpus,
            quantize=False,
        )
        write_row(root / "abbie", {**row, "study": "abbie", "trial_id": f"t{seed}"})
    return root


def test_abbie_rows_carry_the_loss_at_each_loop_count(abbie_results):
    from benchmark.store.results import read_study

    rows = read_study(abbie_results / "abbie").sort_values("seed")
    assert len(rows) == 3 and (rows["status"] == "ok").all()
    for _, row in rows.iterrows():
        ppl = json.loads(row["val_ppl_by_loops"])
        assert set(ppl) == {"1", "2", "4", "8"}
        for r in (1, 2, 4, 8):
            assert row[f"val_loss_r{r}"] == pytest.approx(math.log(ppl[str(r)]), rel=1e-9)
        assert row["val_loss_r2"] == row["val_loss"]  # trained at 2: the final evaluation is r = 2
        assert (
            len({row[f"val_loss_r{r}"] for r in (1, 2, 4, 8)}) == 4
        )  # each count is its own evaluation


def test_a_loop_claim_and_the_leaderboard_read_the_per_loop_losses(abbie_results, tmp_path):
    """A claim comparing AbbIE-D with itself at r = 2 and r = 8 pairs each seed's two losses; the
    leaderboard ranks by val_loss_r4 (--y)."""
    from benchmark.leaderboard import command as cli
    from benchmark.leaderboard import stats
    from benchmark.store.results import read_study

    rows = read_study(abbie_results / "abbie").sort_values("seed")
    per_seed = (rows["val_loss_r2"] - rows["val_loss_r8"]).to_numpy()
    (tmp_path / "claims.yaml").write_text(LOOP_CLAIM)
    assert (
        cli.main(
            [
                str(abbie_results),
                "--x",
                "params",
                "--y",
                "val_loss_r4",
                "--claims",
                str(tmp_path / "claims.yaml"),
                "--format",
                "md",
                "--out",
                str(tmp_path / "site"),
            ]
        )
        == 0
    )
    (claim,) = json.loads((tmp_path / "site" / "claims.json").read_text())["claims"]
    r2, r8 = claim["groups"]
    assert (r2["metric"], r8["metric"]) == ("val_loss_r2", "val_loss_r8")
    assert r2["seeds"] == {str(s): v for s, v in zip(rows["seed"], rows["val_loss_r2"])}
    assert r8["seeds"] == {str(s): v for s, v in zip(rows["seed"], rows["val_loss_r8"])}
    d = claim["pairs"][0]["difference"]
    assert d["method"] == "paired" and d["estimate"] == pytest.approx(per_seed.mean(), rel=1e-9)
    assert d["se"] == pytest.approx(per_seed.std(ddof=1) / math.sqrt(3), rel=1e-9)
    # one pair: its adjusted p is its p, below 0.05 exactly when the 95% interval excludes 0
    assert claim["verdict"] == UNDECIDED.get(v := str(stats.verdict(*d["interval"], -1)), v)
    md = (tmp_path / "site" / "leaderboard.md").read_text()
    assert "| val_loss_r2 vs val_loss_r8 (min) |" in md
    assert "Validation loss at r = 4 (nats/token)" in md


# --- what INT4 costs: the perplexity it adds over full precision (Hyperloop §4, Table 1) ----------

QUANT = QuantizeConfig(group_size=16, calib_sequences=20)  # 16 < d_model 32: two groups per row
TRANSFORMER = {
    "family": "transformer",
    "d_model": 32,
    "n_heads": 2,
    "vocab_size": 300,
    "layers": {"n": 3},
}
INT4_CLAIM = """\
claims:
  - claim: Looped models lose more perplexity to INT4 than the Transformer
    source: {paper: Hyperloop Transformers, where: "§4, Table 1"}
    study: int4
    metric: int4_cost
    order: [transformer, looped]
    groups:
      transformer: {family: transformer}
      looped: {family: looped}
"""


@pytest.fixture(scope="module")
def int4_results(grammar_corpus, tmp_path_factory):
    """Two seeds of a tiny Transformer and a tiny Looped model, quantised per QUANT, in a results
    store as a search writes them."""
    from benchmark.store.results import write_row

    root = tmp_path_factory.mktemp("results")
    for spec in (TRANSFORMER, SPEC):
        for seed in range(2):
            row = run_trial(
                spec,
                TrainConfig(**{**CFG, "tokens": "5K", "seed": seed}),
                data=grammar_corpus,
                quantize=QUANT,
            )
            write_row(
                root / "int4", {**row, "study": "int4", "trial_id": f"{spec['family']}-{seed}"}
            )
    return root / "int4"


def test_the_row_has_what_int4_costs_under_the_spaces_quantize_settings(int4_results):
    from benchmark import build_model
    from benchmark.store.results import read_study
    from benchmark.trial.quant import QuantConfig, model_bytes

    rows = read_study(int4_results)
    assert len(rows) == 4 and (rows["status"] == "ok").all()
    for _, row in rows.iterrows():
        assert row["int4_ppl_increase"] == row["val_ppl_int4"] / row["val_ppl"] - 1
        assert row["int4_rtn_ppl_increase"] == row["val_ppl_int4_rtn"] / row["val_ppl"] - 1
        assert json.loads(row["quantize"]) == {"group_size": 16, "calib_sequences": 20}
        # the group size reached GPTQ: the packed size has one fp16 scale per row and group of 16
        model = build_model(json.loads(row["spec"]))
        assert row["int4_bytes"] == model_bytes(model, QuantConfig(bits=4, group_size=16))
        assert row["int4_bytes"] > model_bytes(model, QuantConfig(bits=4, group_size=128))
    assert rows["extra"].isna().all()  # every quantisation column is in the schema


def test_the_int4_cost_flows_into_a_claim_verdict(int4_results, tmp_path):
    from benchmark.leaderboard import claims, stats
    from benchmark.store.results import read_study

    rows = read_study(int4_results)
    (tmp_path / "claims.yaml").write_text(INT4_CLAIM)
    (result,) = claims.evaluate(claims.load(tmp_path / "claims.yaml"), rows)
    assert result.claim.metric.column == "int4_ppl_increase"  # `int4_cost` is its alias
    cost = {
        f: dict(zip(g["seed"], g["val_ppl_int4"] / g["val_ppl"] - 1))
        for f, g in rows.groupby("family")
    }
    transformer, looped = result.groups
    assert transformer.values == pytest.approx(cost["transformer"], rel=1e-12)
    assert looped.values == pytest.approx(cost["looped"], rel=1e-12)
    (pair,) = result.pairs
    per_seed = [cost["transformer"][s] - cost["looped"][s] for s in (0, 1)]
    assert pair.difference.method == "paired" and pair.difference.estimate == pytest.approx(
        sum(per_seed) / 2
    )
    v = str(stats.verdict(pair.difference.lo, pair.difference.hi, -1))
    assert result.verdict == pair.verdict == UNDECIDED.get(v, v)
    assert result.verdict in ("reproduced", "contradicted", "not decided")


def test_calibration_takes_exactly_the_sequences_asked_for(grammar_corpus):
    from benchmark.trial.run import calibration

    calib = calibration(grammar_corpus, TrainConfig(**CFG), 20)
    assert [tuple(x.shape) for x in calib] == [(8, 32), (8, 32), (4, 32)]
    assert [tuple(x.shape) for x in calibration(grammar_corpus, TrainConfig(**CFG), 3)] == [(3, 32)]
