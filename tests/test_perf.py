"""The speed benchmark's probes are bounded in time whatever a dtype's speed (issue 12): on a CPU
where bf16 matmuls are hundreds of times slower than fp32 the probe used to run for ~15 minutes."""

import time

import pytest
import torch

from benchmark import perf


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_matmul_probe_stays_within_its_budget(dtype):
    start = time.perf_counter()
    flops = perf.matmul_peak(dtype, budget_s=1.0)
    assert flops > 0
    assert time.perf_counter() - start < 6.0  # the budget, with room for a loaded machine


def test_the_precision_comparison_names_the_best_path():
    """`benchmark.perf models` prints each path as a share of the fastest, measured in one run."""
    m = lambda tps: perf.Measurement(1.0, 1.0, tps, tps * 1e6)  # noqa: E731
    lines = perf._ratios({("transformer", "default"): m(1000.0), ("transformer", "eager fp32"): m(800.0),
                          ("transformer", "compiled fp32"): m(1000.0), ("looped", "default"): m(500.0)})
    assert "transformer: default path 1.25x faster than eager fp32" in lines
    assert lines[-1] == ("precision here: default 100% of the best, eager fp32 80% of the best, "
                         "compiled fp32 100% of the best (best: default)")


def test_the_throughput_probe_on_a_gpu_is_sized_like_a_real_step(monkeypatch):
    """A 4-layer, 128-wide probe measures a GPU's kernel launches, not its matmuls: on CUDA the
    probe is ~85M non-embedding parameters and 8 x 1024 tokens per step, in the default precision."""
    from benchmark import count_params
    from benchmark.trial import step

    seen = []

    def fake_measure(spec, policy, steps, warmup, seq_len, batch_size):
        seen.append((count_params(spec)["non_embedding"], seq_len * batch_size, policy))
        return perf.Measurement(1.0, 1.0, 1.0, 1.23e14)

    monkeypatch.setattr(perf, "measure", fake_measure)
    monkeypatch.setattr(step, "default_device", lambda: torch.device("cuda"))
    assert perf.machine_flops() == 1.23e14
    params, tokens, policy = seen[0]
    assert 80e6 < params < 90e6 and tokens == 8192 and policy.precision == "auto" and not policy.compile
    assert perf.machine_flops() == 1.23e14 and len(seen) == 1        # recorded for this machine: probed once
    small, seq, batch = perf.probe_shape("cpu")
    assert count_params(small)["non_embedding"] < 1e6 and seq * batch == 1024
