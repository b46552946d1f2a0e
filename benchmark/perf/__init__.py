"""Speed of the training path on this machine.

    shapebench perf models [--minutes 9] [--steps 60] [--families transformer,looped,...]
    shapebench perf scale [SPACE] [--budget 113M] [--families transformer,hyperloop]
                                   [--set shape.layers=12 ...] [--precisions default,fp32]
                                   [--stream-dtypes auto,fp32]

`models` trains every family for a few steps at a reference size (~4.8M non-embedding
parameters, seq 256, batch 16) with the default execution policy, plus eager float32 for
comparison, and prints tokens/s, achieved FLOP/s and the ratio to this machine's bf16 and fp32
matmul peak, all measured in one run. Timings are noisy on a shared CPU, so the families compared
with each other (HYPER_TARGETS) and the paths of one family are timed in interleaved rounds
(measure_together), and the ratios printed come from those rounds. The run fits in --minutes
(ten by default, so that the slowest machines finish it): families without a target take three
rounds, the compared groups share the rest, up to --steps rounds; after three they go on with
the paths their ratios read (the default paths, and the first family's precisions). One run's
interval covers its rounds; each run's estimates are also kept on this machine (per hash of the
model code), and from the third run a target is judged between runs, as a shared CPU's hours need.

`scale` measures one training step of each family as a space solves it at its budget (default:
the default space at 113M, with its sequence length and micro-batch): tokens/s, model-FLOPs
utilisation against the bf16 matmul peak measured in the same run, and each path's own peak
memory. Each hyper-connection family is timed in interleaved rounds with its baseline (as
`models` does) and its time per token over the baseline printed with a paired interval;
`--stream-dtypes auto,fp32` times a hyper family with each storage of its streams. It is the
GPU-sized check; on a CPU a 113M step takes minutes.

`probe_speed()` is what time estimates fall back on before any trial has run here
(`shapebench plan`): a short run of the plan's first candidate trained as its trial will be,
measured once per policy and shape and cached on disk (perf/probe.py).
"""

from benchmark.perf.models import (
    HYPER_TARGETS,
    comparison_groups,
    paired_ratio,
    reference_spec,
    run_models,
)
from benchmark.perf.probe import estimates, probe_speed
from benchmark.perf.scale import run_scale
from benchmark.perf.timing import (
    MIN_ROUNDS,
    Measurement,
    measure,
    measure_together,
    probe_shape,
)

__all__ = [
    "HYPER_TARGETS",
    "MIN_ROUNDS",
    "Measurement",
    "comparison_groups",
    "estimates",
    "measure",
    "measure_together",
    "paired_ratio",
    "probe_shape",
    "probe_speed",
    "reference_spec",
    "run_models",
    "run_scale",
]
