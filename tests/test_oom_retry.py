"""An out-of-memory error during training retries the run at half the micro-batch and twice the
accumulation (the same batch), said in one line and recorded in the row; not the same run again.
The fault is test-only: a stand-in for train() that fails as the allocator would above a
micro-batch, and trains for real below it."""

import json

import pytest
import torch
from tiny_trial import CFG, SPEC

from benchmark.recipe import TrainConfig
from benchmark.trial import run as trial_run
from benchmark.trial.run import out_of_memory, run_trial


@pytest.fixture
def memory_limit(monkeypatch):
    """train() runs out of memory above a micro-batch of `limit[0]` sequences."""
    limit, real = [2], trial_run.train
    seen: list[tuple[int, int]] = []

    def limited(spec, cfg, *args, **kwargs):
        seen.append((cfg.batch_size, cfg.grad_accum))
        if cfg.batch_size > limit[0]:
            raise torch.OutOfMemoryError(f"CUDA out of memory (test: micro-batch {cfg.batch_size})")
        return real(spec, cfg, *args, **kwargs)

    monkeypatch.setattr(trial_run, "train", limited)
    return limit, seen


def test_the_retry_halves_the_micro_batch_and_keeps_the_batch(grammar_corpus, memory_limit, capsys):
    """8 x 1 runs out, 4 x 2 runs out, 2 x 4 trains: two lines, and the row says 2 retries and
    the micro-batch and accumulation it trained with; the tokens are the declared batch's."""
    limit, seen = memory_limit
    row = run_trial(SPEC, TrainConfig(**CFG), data=grammar_corpus, quantize=None)
    assert seen == [(8, 1), (4, 2), (2, 4)]
    assert row["status"] == "ok" and row["oom_retries"] == 2
    assert (row["rank_batch_size"], row["rank_grad_accum"]) == (2, 4)
    training = json.loads(row["training"])
    assert (training["batch_size"], training["grad_accum"]) == (2, 4)
    steps = TrainConfig(**CFG).steps({"total": 1})  # an absolute 20K tokens at 8 x 32 a step
    assert row["tokens_trained"] == steps * 8 * 32
    lines = [line for line in capsys.readouterr().err.splitlines() if "out of memory" in line]
    assert lines == [
        "out of memory at micro-batch 8 x 1 accumulated; retrying at 4 x 2, the same batch of 8 sequences",
        "out of memory at micro-batch 4 x 2 accumulated; retrying at 2 x 4, the same batch of 8 sequences",
    ]


def test_a_run_that_fits_is_not_retried(grammar_corpus, memory_limit):
    limit, seen = memory_limit
    limit[0] = 8
    row = run_trial(SPEC, TrainConfig(**CFG), data=grammar_corpus, quantize=None)
    assert seen == [(8, 1)] and row["oom_retries"] == 0
    # the row also says what data it read: the part's tokens and the passes its tokens made
    n = len(grammar_corpus.train.part("text"))
    assert json.loads(row["tokens_by_source"]) == {"text": n}
    assert json.loads(row["epochs_by_source"]) == {"text": round(row["tokens_trained"] / n, 4)}
    assert row["sampling"] == "permutation"


def test_an_odd_micro_batch_is_not_halved(grammar_corpus, memory_limit):
    """3 sequences cannot be halved into the same batch: the error stands, after one try."""
    limit, seen = memory_limit
    with pytest.raises(torch.OutOfMemoryError):
        run_trial(SPEC, TrainConfig(**{**CFG, "batch_size": 3}), data=grammar_corpus, quantize=None)
    assert seen == [(3, 1)]


def test_what_counts_as_out_of_memory():
    assert out_of_memory(torch.OutOfMemoryError("CUDA out of memory"))
    cpu = (
        "[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory: you tried"
    )
    assert out_of_memory(RuntimeError(cpu))
    assert not out_of_memory(RuntimeError("shape mismatch")) and not out_of_memory(ValueError())
