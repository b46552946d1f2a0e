"""The first estimate on a machine (`shapebench plan` before any trial has run here under the
trial's policy): a short run of the plan's first candidate trained as its trial will be: the
precision `auto` resolves to here, compiled when the trial compiles, the trial's sequence length
and micro-batch. A probe that trained otherwise (a small model, eager) said 2.8x the first
quickstart trial's wall on a Xeon whose compiled bf16 steps ran far faster than its eager ones
(benchmarks/2026-11-27-xeon-amx-plan-and-suite.md). The probe's first step beyond a steady one is the
compilation the trial's first step pays too. Recorded per machine, policy and shape
(store/speeds.py), so a plan probes once; finished trials replace it (speeds.estimator).
"""

from __future__ import annotations

import hashlib
import json
import time

from benchmark.arch.counting import count_flops
from benchmark.arch.spec import ArchSpec
from benchmark.perf.timing import measure_together, probe_shape, speeds_file
from benchmark.space.plan import TRIAL_REST_S
from benchmark.store import speeds

# The probe's time after it starts: the first (compiling) step, then steady steps until this has
# passed (at least MIN_ROUNDS of them), so a plan waits for seconds, not the trial.
PROBE_S = 20.0
# The largest step the probe takes, in seconds at the matmul peak of the trial's precision here: a
# candidate's step beyond it is probed with fewer sequences (a step's speed per token barely moves
# with the micro-batch once its matmuls are large); one whose single sequence is beyond it is
# probed at probe_shape's small size, so that a 113M candidate on a CPU takes seconds, not minutes.
STEP_AT_PEAK_S = 0.25


def estimates(plan, cfg):
    """family -> Speed for `--plan`: what finished trials measured here under the trials' policy
    (store/speeds.py), else a probe of the plan's first candidate trained as its trial will be
    under `cfg`, the trials' TrainConfig."""
    first = plan.candidates[0].spec if plan.candidates else None
    return speeds.estimator(
        speeds_file(),
        speeds.policy_key(cfg.precision, cfg.compile),
        lambda: probe_speed(first, cfg),
    )


def probe_key(spec: ArchSpec, cfg) -> str:
    """What a probe's speed holds for: the policy (speeds.policy_key), the spec, the step's shape."""
    shape = json.dumps([spec.to_dict(), cfg.seq_len, cfg.batch_size], sort_keys=True)
    return f"{speeds.policy_key(cfg.precision, cfg.compile)}|{hashlib.sha256(shape.encode()).hexdigest()[:16]}"


def probe_speed(spec: ArchSpec, cfg) -> speeds.Speed:
    """The training FLOP/s and time outside training of `spec` trained under `cfg` (a TrainConfig)
    on this machine: a recorded probe's, else a probe now (PROBE_S and its first step)."""
    path, key = speeds_file(), probe_key(spec, cfg)
    known = speeds.probe(path, key)
    if known is None:
        known = run_probe(spec, cfg)
        speeds.record_probe(path, key, *known)
    flops_per_s, compile_s = known
    return speeds.Speed(flops_per_s, compile_s + TRIAL_REST_S, 0)


def run_probe(spec: ArchSpec, cfg) -> tuple[float, float]:
    """(training FLOP/s, seconds the first step took beyond a steady one) of `spec` under `cfg`."""
    import torch  # torch and the trial only when a probe runs: a plan with recorded speeds stays light

    from benchmark.trial.policy import default_device, matmul_peak, policy_of, prepare_device

    policy, device = policy_of(cfg), default_device()
    prepare_device(device)
    peak = matmul_peak(policy.autocast_dtype(device) or torch.float32, budget_s=0.5, device=device)
    seq_len = cfg.seq_len
    batch = min(
        cfg.batch_size, int(STEP_AT_PEAK_S * peak / (count_flops(spec, seq_len)["train"] * seq_len))
    )
    if batch < 1:  # one sequence is too long a step: the small model, in the trial's policy
        spec, seq_len, batch = probe_shape(device.type)
    m = measure_together(
        [(spec, policy)],
        steps=1000,
        warmup=1,
        seq_len=seq_len,
        batch_size=batch,
        until=time.perf_counter() + PROBE_S,
    )[0]
    return m.flops_per_s, max(0.0, m.first_step_s - m.step_s)
