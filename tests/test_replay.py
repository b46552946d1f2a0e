"""`shapebench replay ROW` (search/replay.py): a run trained again from its row alone, on the
machine and code that trained it, gives its numbers to the last digit; a corpus or tokenizer other
than the row's trains nothing and says which."""

import json
import random

import pytest
import tiny_trial
import torch

from benchmark.data import DataConfig, prepare
from benchmark.main import main
from benchmark.recipe import QuantizeConfig, TrainConfig
from benchmark.search import replay
from benchmark.search.preflight import OLD_SAMPLING
from benchmark.store.results import write_row
from benchmark.trial.run import run_trial


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    """A study folder holding one measured run of the tiny trial (quantised, as a search's is)
    and the flags that name its corpus and tokenizer."""
    root = tmp_path_factory.mktemp("replayed")
    rng, words = random.Random(1), "the cat dog sat ran on under a mat log hill".split()
    source = root / "text.txt"
    source.write_text(
        "\n\n".join(
            " ".join(
                f"The {rng.choice(words[1:3])} {rng.choice(words[3:5])} on a mat." for _ in range(4)
            )
            + f" {rng.choice(words[8:])} {i}."
            for i in range(400)
        )
    )
    flags = ["--data", str(source), "--tokenizer", "bpe:300", "--cache", str(root / "cache")]
    data = prepare(DataConfig(source=flags[1], tokenizer="bpe:300", cache_dir=flags[-1]))
    cfg = TrainConfig(**{**tiny_trial.CFG, "tokens": "6K", "seed": 3})
    row = run_trial(
        tiny_trial.SPEC, cfg, data=data, quantize=QuantizeConfig(group_size=16, calib_sequences=4)
    )
    row.pop("curve", None)
    study = root / "results" / "study"
    path = write_row(study, {**row, "study": "study", "trial_id": "t0000-s3", "attempt": 0})
    return path, flags, row


def test_a_row_trained_again_here_gives_its_numbers_to_the_last_digit(measured, capsys):
    path, flags, row = measured
    assert main(["replay", path, *flags, "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert (
        printed["trained"]
        == printed["replayed"]
        == {
            "hardware": row["hardware"],
            "code_version": row["code_version"],
            "status": "ok",
        }
    )
    lines = {m["metric"]: m for m in printed["metrics"]}
    assert {"train_loss", "val_loss", "val_loss_r2", "int4_ppl_increase"} <= set(lines)
    assert lines["val_loss"]["row"] == row["val_loss"]
    for metric, line in lines.items():
        assert line["difference"] == 0, metric
    assert main(["replay", path, *flags]) == 0
    text = capsys.readouterr().out
    assert "trained again" in text and text.rstrip().endswith("the same to the last digit")


def test_a_row_trains_again_at_its_own_torch_threads(measured, monkeypatch):
    path, _, _ = measured
    row = replay.read_row(path)
    assert replay.threads(row) == torch.get_num_threads()  # the machine that trained it: this
    seen = []
    monkeypatch.setattr(
        "benchmark.trial.run.run_trial", lambda *a, **k: seen.append(torch.get_num_threads())
    )
    before = torch.get_num_threads()
    other = {
        **row,
        "hardware": row["hardware"].replace(f"{before} torch threads", "1 torch threads"),
    }
    data = replay.data_config(other, path, "embedded", "bpe", None)
    assert (data.sampling, data.max_docs) == (row["sampling"], None)
    assert replay.data_config(
        {**other, "sampling": None}, path, "embedded", "bpe", None
    ).sampling == (
        OLD_SAMPLING  # a row from before the column: batches drew with replacement
    )

    class Data:  # the row's identities, so that only the threads are checked
        dataset_id, tokenizer = (
            row["dataset_id"],
            type("T", (), {"tokenizer_id": row["tokenizer_id"]}),
        )

    replay.replay(other, Data)
    assert seen == [1] and torch.get_num_threads() == before


def test_another_corpus_or_tokenizer_trains_nothing_and_says_which(measured, capsys, tmp_path):
    path, flags, _ = measured
    other = tmp_path / "other.txt"
    other.write_text("\n\n".join(f"A dog ran to the hill number {i}." for i in range(300)))
    assert main(["replay", path, "--data", str(other), "--tokenizer", "bpe:300"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("shapebench replay: dataset_id: the row's is ") and "--data" in err
    data = prepare(DataConfig(source=flags[1], tokenizer="bpe:280", cache_dir=flags[-1]))
    with pytest.raises(replay.ReplayError, match="^tokenizer_id: the row's is "):
        replay.check_data(replay.read_row(path), data)


def test_a_run_of_several_workers_is_refused(measured, tmp_path):
    path, _, row = measured
    several = write_row(
        tmp_path / "study",
        {**row, "study": "study", "trial_id": "t0001", "attempt": 0, "world_size": 2},
    )
    with pytest.raises(replay.ReplayError, match="world_size 2: a run of several workers"):
        replay.read_row(several)


def test_the_threads_a_hardware_says_are_read_back_as_machine_wrote_them():
    """provenance.machine writes a row's `hardware`; machine_threads reads its torch threads back
    (a replay trains at them), for CPU and GPU rows alike; a text without them says so."""
    from benchmark.store import provenance

    for threads in (1, 3, 16):
        assert provenance.machine_threads(provenance.machine(threads)) == threads
        gpu_row = provenance.machine(threads, 8, "NVIDIA H100 80GB HBM3", True)
        assert provenance.machine_threads(gpu_row) == threads
    assert provenance.machine_threads("AMD EPYC") is None
    with pytest.raises(replay.ReplayError, match="does not say its torch threads"):
        replay.threads({"hardware": "AMD EPYC"})
