"""--reuse-runs (search/reuse.py): a run whose model, training settings, quantisation, data,
tokenizer and hardware are those of a measured run of another study is that run, taken into this
study under its own name with its curve, and trains nothing; any difference in those trains it."""

import json
import os
from dataclasses import replace

import pandas as pd
import pytest
import tiny_trial

from benchmark.search import reuse, trainable
from benchmark.search.context import TrialContext
from benchmark.store import hardware, location, read_curves, read_study
from benchmark.store.results import write_row
from benchmark.trial.runstate import RunState

CONFIG = {"spec": tiny_trial.SPEC, "optuna_trial": 0, "family": "looped"}
# a row's key columns but its hardware: two rows that differ only there
KEYED = {"spec": "{}", "training": "{}", "quantize": "{}", "dataset_id": "d", "tokenizer_id": "t"}


def _ctx(study_dir, index=None) -> TrialContext:
    return TrialContext(
        study=study_dir.name,
        study_dir=str(study_dir),
        data=None,
        training={**tiny_trial.CFG, "tokens": "6K"},
        quantize={"group_size": 16, "calib_sequences": 4},
        count="total",
        objectives=("val_loss",),
        reuse=index or {},
    )


@pytest.fixture
def trained(monkeypatch):
    """Counts the runs that train (trial/run.py run_trial, as attempts imports it at each call)."""
    import benchmark.trial.run as run

    calls, real = [], run.run_trial

    def counted(*args, **kwargs):
        calls.append(kwargs.get("state").name if kwargs.get("state") else None)
        return real(*args, **kwargs)

    monkeypatch.setattr(run, "run_trial", counted)
    return calls


def test_a_run_another_study_measured_is_taken_with_its_curve_and_trains_nothing(
    grammar_corpus, tmp_path, trained
):
    first = trainable.attempts(CONFIG, _ctx(tmp_path / "a"), "t0000", 0, grammar_corpus, None)
    assert first["status"] == "ok" and trained == ["t0000"]
    # the key of the run before it trains is the key of the row it wrote: what the lookup rests on
    (written,) = read_study(tmp_path / "a").to_dict("records")
    cfg = _ctx(tmp_path / "a").train_config(0)
    planned = reuse.run_key(
        reuse.planned(
            CONFIG["spec"], cfg, _ctx(tmp_path).quantize_config(), grammar_corpus, hardware()
        )
    )
    assert planned == reuse.run_key(written)
    # a tuning run of its study's grid stands for a run of a space without one: its phase is not copied
    write_row(tmp_path / "a", {**written, "phase": "tune", "tuned": '{"lr": 0.003}'})

    index = reuse.index([str(tmp_path)], own=str(tmp_path / "b"))
    assert list(index.values()) == [str(tmp_path / "a" / "trials" / "t0000.a0.parquet")]
    ctx = _ctx(tmp_path / "b", index)
    # a state the run saved part-way here before (a stopped search) is done with once it is taken
    state = RunState(ctx.state_dir(), CONFIG["spec"], cfg, None, name="t0003")
    location.write_bytes(state.path, b"a save part-way")
    row = trainable.attempts({**CONFIG, "optuna_trial": 3}, ctx, "t0003", 0, grammar_corpus, None)
    assert trained == ["t0000"]  # nothing more trained
    assert not location.exists(state.path)
    (taken,) = read_study(tmp_path / "b").to_dict("records")
    assert (taken["study"], taken["trial_id"], taken["optuna_trial"]) == ("b", "t0003", 3)
    assert pd.isna(taken["phase"]) and pd.isna(taken["tuned"])
    for column in ("val_loss", "val_loss_r2", "val_ppl_int4", "tokens_trained", "wall_s", "seed"):
        assert taken[column] == written[column], column
    assert index[planned] == str(tmp_path / "a" / "trials" / "t0000.a0.parquet")
    assert json.loads(taken["extra"])["reused_from"] == "a/trials/t0000.a0.parquet"
    assert row["reused_from"] == "a/trials/t0000.a0.parquet"
    curves = read_curves(str(tmp_path / "b")).dropna(subset=["train_loss"])
    assert set(curves["trial_id"]) == {"t0003"}
    assert curves["train_loss"].tolist() == [p["train_loss"] for p in first["curve"]]
    # taken again from "b", the row names the run that trained, not the copy
    index = reuse.index([str(tmp_path / "b")], own=str(tmp_path / "c"))
    again = trainable.attempts(
        CONFIG, _ctx(tmp_path / "c", index), "t0000", 0, grammar_corpus, None
    )
    assert again["reused_from"] == row["reused_from"] and trained == ["t0000"]

    # another seed, another learning rate: other runs, trained; so is a run of a Train job's workers
    trainable.attempts(CONFIG, ctx, "t0004", 1, grammar_corpus, None)
    lr = {"lr": 1e-3}
    trainable.attempts(CONFIG, ctx, "t0005-g0-s0", 0, grammar_corpus, None, lr, "tune")
    assert trained == ["t0000", "t0004", "t0005-g0-s0"]
    workers = replace(ctx, workers=object())
    assert reuse.taken(workers, CONFIG, "t0006", cfg, grammar_corpus) is None
    assert reuse.taken(ctx, CONFIG, "t0006", cfg, grammar_corpus) is not None


def test_the_key_is_every_column_that_makes_the_run_and_only_those():
    row = {
        "spec": json.dumps({"family": "looped", "d_model": 32}),
        "training": json.dumps({"lr": 3e-3, "seed": 0}),
        "quantize": json.dumps({"group_size": 128}),
        "dataset_id": "embedded-abc",
        "tokenizer_id": "bpe:1024-def",
        "hardware": "AMD EPYC (2 cpus, 1 torch threads)",
    }
    key = reuse.run_key(row)
    # JSON compared as values; what the run measured, where and when it ran, and its code are not the run
    reordered = {**row, "spec": json.dumps({"d_model": 32, "family": "looped"})}
    assert reuse.run_key(reordered) == key
    assert reuse.run_key({**row, "val_loss": 3.1, "code_version": "abc", "study": "x"}) == key
    # a row from before a column existed: its batches drew with replacement, in one process
    old = {**row, "sampling": "replacement", "world_size": 1, "parallel": "none"}
    assert reuse.run_key(old) == key
    for column, other in [
        ("sampling", "permutation"),
        ("world_size", 2),
        ("parallel", "ddp"),
        ("spec", json.dumps({"family": "looped", "d_model": 48})),
        ("training", json.dumps({"lr": 3e-3, "seed": 1})),
        ("quantize", json.dumps({"group_size": 64})),
        ("dataset_id", "hf:fineweb-abc"),
        ("tokenizer_id", "bpe:320-def"),
        ("hardware", "AMD EPYC (2 cpus, 2 torch threads)"),
    ]:
        assert reuse.run_key({**row, column: other}) != key, column


# /proc/cpuinfo's first processor on two KVM guests of one cloud: both say "AMD EPYC"; the first is
# a Zen 3 (family 25 model 1, AVX2), the second a Zen 4 (model 17, AVX-512 with BF16)
ZEN3 = "vendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 1\nmodel name\t: AMD EPYC\nflags\t\t: fpu sse2 avx fma avx2 bmi2\n"
ZEN4 = ZEN3.replace("model\t\t: 1", "model\t\t: 17").replace("bmi2", "bmi2 avx512f avx512_bf16")


def test_two_cpus_a_virtual_machine_names_alike_are_two_hardwares(monkeypatch, tmp_path):
    """A Zen 3 and a Zen 4 guest both name themselves "AMD EPYC"; their kernels differ in width, so
    a run on one is not the other's: the row's `hardware`, and so the reuse key, tells them apart."""
    from benchmark.store import provenance, speeds

    seen = {}
    for name, text in [("zen3", ZEN3), ("zen4", ZEN4)]:
        (tmp_path / name).write_text(text)
        monkeypatch.setattr(speeds, "CPUINFO", str(tmp_path / name))
        seen[name] = provenance.machine(1)
    assert seen == {
        "zen3": "AMD EPYC, family 25 model 1, AVX2 (%d cpus, 1 torch threads)" % os.cpu_count(),
        "zen4": "AMD EPYC, family 25 model 17, AVX512-BF16 (%d cpus, 1 torch threads)"
        % os.cpu_count(),
    }
    row = dict(KEYED)
    assert reuse.run_key({**row, "hardware": seen["zen3"]}) != reuse.run_key(
        {**row, "hardware": seen["zen4"]}
    )


def test_a_gpu_run_on_the_triton_hc_kernels_is_another_hardware(monkeypatch):
    """SHAPEBENCH_HC_KERNELS=triton runs the connections on models/kernels where a GPU and triton
    are: their sums round unlike torch's, so the row says so and a run without them is not it."""
    from benchmark.models import kernels
    from benchmark.store import provenance

    monkeypatch.setattr(kernels, "available", lambda: True)
    monkeypatch.delenv(kernels.ENV, raising=False)
    assert not kernels.in_use()
    torch_path = provenance.machine(1, 1, "NVIDIA H200", kernels.in_use())
    monkeypatch.setenv(kernels.ENV, "triton")
    assert kernels.in_use()
    triton_path = provenance.machine(1, 1, "NVIDIA H200", kernels.in_use())
    assert triton_path == torch_path + ", Triton HC kernels"
    assert provenance.machine(1, 0, "", True) == provenance.machine(1)  # a CPU run: none to take
    assert "Triton" not in provenance.machine(1)
    monkeypatch.setattr(kernels, "available", lambda: False)  # triton absent: torch's code runs
    assert not kernels.in_use()
    row = dict(KEYED)
    assert reuse.run_key({**row, "hardware": torch_path}) != reuse.run_key(
        {**row, "hardware": triton_path}
    )


def test_a_diverged_run_stands_for_one_of_any_quantisation_an_unquantised_one_for_none():
    """A diverged run stopped before quantising (its row's `quantize` is null): the run about to
    train diverges there too, whatever it would quantise with. A run that finished without
    quantising does not stand for one that quantises."""
    base = {"spec": "{}", "training": "{}", "dataset_id": "d", "tokenizer_id": "t", "hardware": "h"}
    planned = {**base, "quantize": json.dumps({"group_size": 128})}
    diverged = {**base, "quantize": None, "status": "diverged"}
    assert reuse.find({reuse.run_key(diverged): "x"}, planned) == "x"
    assert (
        reuse.find({reuse.run_key({**base, "quantize": None, "status": "ok"}): "y"}, planned)
        is None
    )
    assert reuse.find({reuse.run_key({**planned, "status": "ok"}): "z"}, planned) == "z"


def test_only_measured_runs_of_other_studies_stand_for_a_run(tmp_path):
    base = {"spec": "{}", "training": "{}", "quantize": "{}", "dataset_id": "d", "hardware": "h"}
    for study, trial, status, tokenizer in [
        ("a", "t0000", "ok", "t1"),
        ("a", "t0001", "failed", "t2"),
        ("a", "t0002", "diverged", "t3"),
        ("own", "t0000", "ok", "t4"),
    ]:
        write_row(
            tmp_path / study,
            {
                **base,
                "study": study,
                "trial_id": trial,
                "status": status,
                "tokenizer_id": tokenizer,
            },
        )
    index = reuse.index([str(tmp_path)], own=str(tmp_path / "own"))
    found = {
        reuse.run_key({**base, "tokenizer_id": t, "status": status})
        for t, status in (("t1", "ok"), ("t3", "diverged"))
    }
    assert set(index) == found and len(index) == 2
    assert reuse.index([str(tmp_path / "a")], own=str(tmp_path / "own")) == index  # a study itself
    (tmp_path / "empty").mkdir()
    with pytest.raises(reuse.ReuseError, match="--reuse-runs .*empty: no study there"):
        reuse.studies_in(str(tmp_path / "empty"))
    # the search's own study is its own to resume, however its folder is written
    assert reuse.index([str(tmp_path)], own=str(tmp_path / "own") + "/") == index
    assert pd.read_parquet(tmp_path / "a").shape[0] == 3


def test_a_folder_without_a_study_is_one_line_before_anything_trains(corpus, tmp_path, capsys):
    import tiny_search

    from benchmark.main import main

    space = tmp_path / "s.yaml"
    space.write_text(
        "name: s\nbudget: 100K\ncount: total\ntolerance: 2%\n"
        "base: {vocab_size: 320, n_heads: 2, layers: {begin: 1, middle: 1, end: 1}}\n"
        "axes: {family: [transformer]}\ntraining: {tokens: 8K, seq_len: 32, batch_size: 8}\n"
        "objectives: [val_loss:min]\ntrials: 1\n"
    )
    results, missing = tmp_path / "results", tmp_path / "typo"
    argv = ["search", str(space), "--results", str(results), "--reuse-runs", str(missing), "--yes"]
    assert main([*argv, *tiny_search.cli(corpus)]) == 2
    assert capsys.readouterr().err == (
        f"shapebench search: --reuse-runs {missing}: no study there "
        "(no trials/ folder in it or in its folders)\n"
    )
    assert not (results / "s").exists()


def test_the_summary_says_how_many_rows_were_runs_taken():
    from rich.console import Console

    from benchmark.search import summary
    from benchmark.search.driver import SearchSummary

    console = Console(record=True, width=300)
    s = SearchSummary(study_dir="r/s", requested=1, finished_before=0, ran=1, written=16, reused=16)
    summary.show(console, s)
    assert "1 ran now, 16 rows written now (16 of them runs taken from other studies), in 0s" in (
        console.export_text()
    )
    console = Console(record=True, width=300)
    summary.show(console, SearchSummary(study_dir="r/s", requested=1, finished_before=0, written=2))
    assert "2 rows written now, in 0s" in console.export_text()


def test_a_run_its_memory_made_retry_stands_for_the_run_as_planned(tmp_path):
    """A run that ran out of memory twice trained at a quarter of its planned micro-batch and four
    times the accumulation (the same batch; its row says what it trained with, and oom_retries 2):
    the run planned as it was, on the same hardware, is that run; one planned at the smaller
    micro-batch from the start is another."""
    base = {"spec": "{}", "quantize": "{}", "dataset_id": "d", "tokenizer_id": "t", "hardware": "h"}
    trained = json.dumps({"batch_size": 4, "grad_accum": 4, "lr": 3e-3, "seed": 0})
    write_row(
        tmp_path / "a",
        {
            **base,
            "study": "a",
            "trial_id": "t0000",
            "status": "ok",
            "training": trained,
            "oom_retries": 2,
        },
    )
    index = reuse.index([str(tmp_path)], own=str(tmp_path / "own"))
    as_planned = json.dumps({"batch_size": 16, "grad_accum": 1, "lr": 3e-3, "seed": 0})
    assert reuse.find(index, {**base, "training": as_planned}) is not None
    assert reuse.find(index, {**base, "training": trained}) is None
    # without retries the row is its own plan
    assert reuse.as_planned({**base, "training": trained, "oom_retries": 0})["training"] == trained
