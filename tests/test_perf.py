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
