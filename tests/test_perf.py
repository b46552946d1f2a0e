"""The speed benchmark's probes are bounded in time whatever a dtype's speed: on a CPU
where bf16 matmuls are hundreds of times slower than fp32 the probe used to run for ~15 minutes."""

import time

import pytest
import torch

from benchmark import perf
from benchmark.arch.counting import count_flops
from benchmark.arch.spec import ArchSpec
from benchmark.perf import models
from benchmark.trial import policy, step
from benchmark.trial.policy import ExecPolicy


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_matmul_probe_stays_within_its_budget(dtype):
    start = time.perf_counter()
    flops = policy.matmul_peak(dtype, budget_s=1.0)
    assert flops > 0
    assert time.perf_counter() - start < 6.0  # the budget, with room for a loaded machine


def test_the_precision_comparison_names_the_best_path():
    """`benchmark.perf models` prints each path as a share of the fastest, measured in one run."""
    m = lambda tps: perf.Measurement(1.0, 1.0, tps, tps * 1e6)  # noqa: E731
    lines = models._ratios(
        {
            ("transformer", "default"): m(1000.0),
            ("transformer", "eager fp32"): m(800.0),
            ("transformer", "compiled fp32"): m(1000.0),
            ("looped", "default"): m(500.0),
        }
    )
    assert "transformer: default path 1.25x faster than eager fp32" in lines
    assert lines[-1] == (
        "precision here: default 100% of the best, eager fp32 80% of the best, "
        "compiled fp32 100% of the best (best: default)"
    )


def test_the_fallback_probe_on_a_gpu_is_sized_like_a_real_step():
    """A candidate too big to probe at one sequence is probed at probe_shape's size (perf/probe.py).
    A 4-layer, 128-wide model measures a GPU's kernel launches, not its matmuls: on CUDA that size
    is ~85M non-embedding parameters and 8 x 1024 tokens per step; on a CPU a small model."""
    from benchmark import count_params

    big, seq, batch = perf.probe_shape("cuda")
    assert 80e6 < count_params(big)["non_embedding"] < 90e6 and seq * batch == 8192
    small, seq, batch = perf.probe_shape("cpu")
    assert count_params(small)["non_embedding"] < 1e6 and seq * batch == 1024


def test_auto_precision_on_a_cpu_follows_its_measured_matmuls(monkeypatch, tmp_path):
    """`precision: auto` picks bf16 on a CPU with a native bf16 instruction only where a timed
    probe found its matmuls at least BF16_MARGIN faster than fp32; the probe times the dtypes in
    alternating rounds, runs once per machine and is then read from the file."""
    from benchmark.store import speeds

    monkeypatch.setenv(speeds.ENV, str(tmp_path / "perf.json"))
    monkeypatch.setattr(policy, "_BF16_FASTER", {})
    monkeypatch.setattr(speeds, "cpu_flags", lambda: frozenset({"avx2", "amx_bf16"}))
    calls = []

    def fake_peak(dtype, budget_s, device=None):
        calls.append((dtype, budget_s))
        return {torch.float32: 100e9, torch.bfloat16: 400e9}[dtype]

    monkeypatch.setattr(policy, "matmul_peak", fake_peak)
    assert policy.bf16_faster_here() and policy.bf16_faster_here()
    share = policy.PROBE_BUDGET_S / policy.PROBE_ROUNDS
    assert calls == [(torch.float32, share), (torch.bfloat16, share)] * policy.PROBE_ROUNDS
    assert ExecPolicy().autocast_dtype(torch.device("cpu")) == torch.bfloat16
    assert '"matmul_rounds"' in (tmp_path / "perf.json").read_text()  # kept for the next process
    other = tmp_path / "other.json"  # another machine's file: just under the margin, fp32
    monkeypatch.setenv(speeds.ENV, str(other))
    speeds.record_precision_probe(other, 100e9, 100e9 * policy.BF16_MARGIN * 0.99)
    assert not policy.bf16_faster_here()
    assert ExecPolicy().autocast_dtype(torch.device("cpu")) is None
    assert ExecPolicy(precision="bf16").autocast_dtype(torch.device("cpu")) == torch.bfloat16


def test_auto_precision_is_fp32_where_bf16_is_emulated_and_a_slowed_round_decides_nothing(
    monkeypatch, tmp_path
):
    """On a CPU whose flags hold no native bf16 instruction (an AVX2 EPYC) `auto` is fp32 without a
    probe, whatever an old probe recorded; where the flags allow bf16, a first fp32 round slowed
    400x by other work (as a busy shared CPU did to a single-pass probe) does not pick bf16."""
    from benchmark.store import speeds

    monkeypatch.setenv(speeds.ENV, str(tmp_path / "perf.json"))
    monkeypatch.setattr(policy, "_BF16_FASTER", {})
    monkeypatch.setattr(speeds, "cpu_flags", lambda: frozenset({"fma", "avx", "avx2"}))
    monkeypatch.setattr(policy, "matmul_peak", lambda *a, **k: pytest.fail("probed"))
    speeds.record_precision_probe(tmp_path / "perf.json", 0.2e9, 1.0e9)  # an inverted old probe
    assert not policy.bf16_faster_here()
    assert ExecPolicy().autocast_dtype(torch.device("cpu")) is None

    monkeypatch.setenv(speeds.ENV, str(tmp_path / "fresh.json"))
    monkeypatch.setattr(speeds, "cpu_flags", lambda: None)  # flags unknown: the probe decides
    fp32 = iter([0.2e9] + [80e9] * (policy.PROBE_ROUNDS - 1))
    peaks = {torch.float32: lambda: next(fp32), torch.bfloat16: lambda: 1.3e9}
    monkeypatch.setattr(policy, "matmul_peak", lambda dtype, *a, **k: peaks[dtype]())
    assert not policy.bf16_faster_here()
    assert speeds.precision_probe(tmp_path / "fresh.json") == {"fp32": 80e9, "bf16": 1.3e9}


def test_compared_paths_are_timed_in_interleaved_rounds(monkeypatch):
    """`measure_together` warms each path up in turn, then times one step of each per round, so a
    slow stretch of a shared CPU falls on every path alike; only the first step function drops
    the compiled code of the others (`fresh`)."""
    calls, fresh_seen = [], []

    class Recorder:
        def __init__(self, model, optimizer, policy, device, fresh=True):
            self.family = model.spec.family
            fresh_seen.append(fresh)

        def __call__(self, x, y):
            calls.append(self.family)
            return torch.zeros(())

        def close(self):
            pass

    monkeypatch.setattr(step, "TrainStep", Recorder)
    tiny = {"d_model": 32, "n_heads": 2, "vocab_size": 64}
    specs = [ArchSpec.from_dict({"family": f, **tiny}) for f in ("transformer", "looped")]
    out = perf.measure_together(
        [(s, ExecPolicy(compile=False)) for s in specs], steps=3, warmup=2, seq_len=8, batch_size=2
    )
    # warm-ups, then rounds in alternating order (ABBA), so a linear drift weighs on both alike
    rounds = ["transformer", "looped", "looped", "transformer", "transformer", "looped"]
    assert calls == ["transformer"] * 2 + ["looped"] * 2 + rounds
    assert fresh_seen == [True, False]
    assert len(out) == 2 and all(m.tokens_per_s > 0 for m in out)
    # a time budget: rounds stop where the next would pass the deadline, never under MIN_ROUNDS
    calls.clear()
    out = perf.measure_together(
        [(s, ExecPolicy(compile=False)) for s in specs],
        steps=20,
        warmup=1,
        seq_len=8,
        batch_size=2,
        until=time.perf_counter(),
    )
    assert [len(m.step_times) for m in out] == [perf.MIN_ROUNDS] * 2 and len(
        calls
    ) == 2 + 2 * perf.MIN_ROUNDS
    out = perf.measure_together(
        [(s, ExecPolicy(compile=False)) for s in specs],
        steps=20,
        warmup=1,
        seq_len=8,
        batch_size=2,
        until=time.perf_counter() + 600,
    )
    assert [len(m.step_times) for m in out] == [20, 20]
    # `focus`: after MIN_ROUNDS rounds only the paths an interval is read from go on
    calls.clear()
    out = perf.measure_together(
        [(s, ExecPolicy(compile=False)) for s in specs],
        steps=5,
        warmup=1,
        seq_len=8,
        batch_size=2,
        focus=[1],
    )
    assert [len(m.step_times) for m in out] == [perf.MIN_ROUNDS, 5]
    assert calls[2 + 2 * perf.MIN_ROUNDS :] == ["looped"] * (5 - perf.MIN_ROUNDS)


def test_every_hyper_connection_family_is_timed_beside_its_baseline():
    from benchmark.arch.spec import FAMILIES

    groups = perf.comparison_groups(list(FAMILIES))
    assert sorted(f for g in groups for f in g) == sorted(FAMILIES)  # each family once
    for a, b, _ in perf.HYPER_TARGETS:
        assert any(a in g and b in g for g in groups), (a, b)
    assert perf.comparison_groups(["mhc", "looped"]) == [
        ["mhc"],
        ["looped"],
    ]  # no baseline asked: alone


def test_a_target_is_met_or_missed_only_where_the_paired_interval_says_so():
    """Each round times the two paths back to back; the per-round ratios give an interval, and a
    verdict needs the whole interval on one side of the target (seen: the same ratio read +3.7%
    and +7.5% in two 30-round runs on a 2-core VM)."""

    def m(times):
        step_s = sorted(times)[len(times) // 2]
        return perf.Measurement(step_s, 1.0, 1.0 / step_s, 1e6, 0, tuple(times))

    base = [1.00, 1.30, 0.90, 1.10, 1.00, 1.20]  # a drifting machine

    def res(over):
        return {
            ("looped", "default"): m(base),
            ("hyperloop", "default"): m([t * over for t in base]),
        }

    est, lo, hi, rounds = perf.paired_ratio(res(1.02)[("hyperloop", "default")], m(base))
    assert (
        rounds == 6 and est == pytest.approx(0.02) and (lo, hi) == pytest.approx((0.02, 0.02))
    )  # the drift cancels
    assert models._ratios(res(1.02))[0].endswith("over 6 paired rounds (target <= 3%: met)")
    assert models._ratios(res(1.05))[0].endswith("(target <= 3%: missed)")
    wobble = [1.0, 1.08, 0.99, 1.06, 1.01, 1.04]  # the ratio itself varies by round
    noisy = {
        ("looped", "default"): m(base),
        ("hyperloop", "default"): m([t * r for t, r in zip(base, wobble)]),
    }
    line, caution = models._ratios(noisy)[:2]
    assert caution.startswith(
        "(each interval is this run's rounds"
    )  # runs at other hours differed by more
    assert line.startswith("hyperloop vs looped: +2.9% time per token, 95% interval -0.7% to +6.8%")
    assert line.endswith("(target <= 3%: not resolved at this noise)")
    # the point is the rounds' geometric mean ratio, the interval's centre, not the medians' ratio
    # (1.166 s over 1.1 s, +6.0%: path by path the medians came from different rounds)
    assert perf.paired_ratio(noisy[("hyperloop", "default")], noisy[("looped", "default")])[
        0
    ] == pytest.approx(0.0295, abs=1e-4)


def test_a_time_budget_gives_the_compared_groups_what_the_others_leave(monkeypatch, tmp_path):
    """`perf models --minutes M` ends within about M minutes: the families without a target run
    MIN_ROUNDS rounds first, then the groups with a target share the time left by their paths."""
    from benchmark.store import speeds

    # this test's fake CPU has slow bf16, whatever this machine's probe found (its speeds file and
    # the process's cached choice are set aside)
    monkeypatch.setenv(speeds.ENV, str(tmp_path / "perf.json"))
    monkeypatch.setattr(policy, "_BF16_FASTER", {})
    seen = []

    def fake_together(paths, steps, seq_len, batch_size, until, focus):
        assert (
            (seq_len, batch_size) == (models.SEQ_LEN, models.BATCH) == (256, 16)
        )  # the reference step
        seen.append(
            (
                {s.family for s, _ in paths},
                len(paths),
                until - time.perf_counter(),
                [(paths[i][0].family, paths[i][1].compile) for i in focus],
            )
        )
        return [perf.Measurement(1.0, 1.0, 1000.0, 1e9, 0, (1.0,) * perf.MIN_ROUNDS) for _ in paths]

    monkeypatch.setattr(models, "measure_together", fake_together)
    monkeypatch.setattr(
        policy, "matmul_peak", lambda dtype, *a, **kw: 1e11 if dtype == torch.float32 else 1e9
    )
    models.run_models(["transformer", "hc", "depth", "looped", "hyperloop"], steps=30, minutes=1.0)
    assert [(fams, n) for fams, n, _, _ in seen] == [
        ({"depth"}, 2),
        ({"transformer", "hc"}, 5),
        ({"looped", "hyperloop"}, 4),
    ]
    # after MIN_ROUNDS a group goes on with its default paths and the first family's precisions
    # (default, eager fp32, whole model: compiled fp32 by regions is the default on this fake CPU)
    assert seen[1][3] == [
        ("transformer", True),
        ("hc", True),
        ("transformer", False),
        ("transformer", True),
    ]
    assert seen[2][3] == [("looped", True), ("hyperloop", True)]
    # depth's deadline is now (its MIN_ROUNDS only); the first compared group gets the time left in
    # proportion to the training FLOPs of the paths it goes on with (3 Transformer paths and HC's
    # against Looped's and Hyperloop's: 176.3M against 129.7M per token, 57.6%), the last all that
    # is left then (here the whole minute: these fakes take no time)
    flops = {
        f: count_flops(perf.reference_spec(f), 256)["train"]
        for f in ("transformer", "hc", "looped", "hyperloop")
    }
    assert (flops["transformer"], flops["hc"], flops["looped"], flops["hyperloop"]) == (
        43852800,
        44737536,
        64699392,
        64975872,
    )
    first = 3 * flops["transformer"] + flops["hc"]
    assert seen[0][2] <= 0 and seen[1][2] == pytest.approx(
        60 * first / (first + flops["looped"] + flops["hyperloop"]), abs=1
    )
    assert seen[1][2] == pytest.approx(34.6, abs=1) and seen[2][2] == pytest.approx(60, abs=1)


def test_runs_at_different_hours_judge_a_target_by_their_spread(tmp_path):
    """One run's interval covers its rounds only (on the 2-core VM, Hyperloop over Looped read
    +0.5% to +3.6% and +4.3% to +11.9% ten minutes apart); each run's estimate is kept per model
    code, and from three runs the target is judged by a t interval between runs."""
    from benchmark.store import speeds

    path = tmp_path / "perf.json"

    def run(over, code="abc", when=1.7e9, n=models.RUN_ROUNDS):
        rounds = ([1.0, 1.2, 0.9, 1.1] * n)[:n]
        res = {
            ("looped", "default"): perf.Measurement(1.0, 1.0, 1.0, 1e6, 0, tuple(rounds)),
            ("hyperloop", "default"): perf.Measurement(
                1.0, 1.0, 1.0, 1e6, 0, tuple(t * over for t in rounds)
            ),
        }
        return models.across_runs(res, path, code, when)

    assert run(1.02, n=models.RUN_ROUNDS - 1) == [  # a short run does not join the history
        "hyperloop vs looped: this run's 9 paired rounds are too few to join the runs between which targets are "
        "judged (at least 10: give it more time)"
    ]
    speeds.record_ratio(
        path, "hyperloop/looped", "abc", 0.5, 3, 1.7e9 - 1
    )  # one kept before the rule: not read
    assert run(1.02) == [
        "hyperloop vs looped: 1 run(s) of this code here so far; from 3, an interval between runs"
    ]
    assert run(1.08, when=1.7e9 + 600)[0].startswith("hyperloop vs looped: 2 run(s)")
    line = run(1.03, when=1.7e9 + 3600)[0]
    # log ratios 0.0198, 0.0770, 0.0296: mean 0.0421 (+4.3%), s.e. 0.0177, t(2) 4.303: -0.0338 to 0.1181
    assert line == (
        "hyperloop vs looped over the last 3 runs of this code here (2023-11-14 22:13 to 2023-11-14 23:13 UTC): "
        "+4.3%, 95% interval -3.3% to +12.5% between runs (target <= 3%: not resolved)"
    )
    kept = speeds.ratio_runs(path, "hyperloop/looped", "abc")  # the short run is kept but not read
    assert [(round(r, 4), n) for _, r, n in kept] == [
        (0.5, 3),
        (0.0198, 10),
        (0.077, 10),
        (0.0296, 10),
    ]
    short = run(1.5, when=1.7e9 + 7200, n=models.RUN_ROUNDS - 1)  # a short run reads them,
    assert short[0].endswith("(at least 10: give it more time)") and short[1] == line  # joins not
    assert run(1.01, code="faster")[0].startswith(
        "hyperloop vs looped: 1 run(s)"
    )  # changed code: a new history
    for k in range(speeds.KEEP_RUNS + 2):  # the latest KEEP_RUNS kept
        run(1.01 + 0.001 * k, code="steady", when=1.7e9 + k)
    assert run(1.01, code="steady")[0].endswith("(target <= 3%: met)")
    assert len(speeds.ratio_runs(path, "hyperloop/looped", "steady")) == speeds.KEEP_RUNS
    assert models.model_code() == models.model_code() and len(models.model_code()) == 12


def test_paths_timed_together_each_report_their_own_peak_memory(monkeypatch):
    """`measure_together` builds every path before the rounds: the peak of the second path must not
    count the first's weights and optimiser state (seen: `perf scale` then read a baseline-plus-HC
    peak as HC's)."""
    from benchmark.trial import memory

    mem = {"held": 1000, "peak": 1000}  # a fake allocator: bytes held now, the high-water mark
    size = {"transformer": 300, "hc": 500}

    class Allocating:
        def __init__(self, model, optimizer, policy, device, fresh=True):
            self.size = size[model.spec.family]
            mem["held"] += self.size  # weights and optimiser state stay held

        def __call__(self, x, y):
            mem["peak"] = max(mem["peak"], mem["held"] + self.size // 10)  # the step's activations
            return torch.zeros(())

        def close(self):
            pass

    monkeypatch.setattr(step, "TrainStep", Allocating)
    monkeypatch.setattr(memory, "held_memory_bytes", lambda device: mem["held"])
    monkeypatch.setattr(memory, "peak_memory_bytes", lambda device: mem["peak"])
    monkeypatch.setattr(memory, "reset_peak_memory", lambda device: mem.update(peak=mem["held"]))
    tiny = {"d_model": 32, "n_heads": 2, "vocab_size": 64}
    specs = [ArchSpec.from_dict({"family": f, **tiny}) for f in ("transformer", "hc")]
    out = perf.measure_together(
        [(s, ExecPolicy(compile=False)) for s in specs], steps=3, warmup=1, seq_len=8, batch_size=2
    )
    assert [m.peak_mem_bytes for m in out] == [330, 550]  # each its own size plus its activations


def test_scale_times_each_hyper_family_with_its_baseline_at_each_stream_dtype(monkeypatch):
    """`perf scale --stream-dtypes auto,fp32`: the Transformer, HC and mHC are built together and
    their steps interleaved, HC and mHC once per storage of their streams; the ratios read each
    against the Transformer from the paired rounds."""
    from benchmark.perf import scale

    groups = []

    def fake_together(paths, steps, warmup, seq_len, batch_size):
        groups.append([(s.family, s.hyper and s.hyper.stream_dtype) for s, _ in paths])
        base = [1.0, 1.2, 0.9, 1.1]  # a drifting machine: the paired ratios cancel it
        slower = {None: 1.0, "auto": 1.08, "fp32": 1.2}
        return [
            perf.Measurement(
                1.0,
                1.0,
                1.0,
                1e9,
                0,
                tuple(t * slower[s.hyper and s.hyper.stream_dtype] for t in base),
            )
            for s, _ in paths
        ]

    monkeypatch.setattr(scale, "measure_together", fake_together)
    monkeypatch.setattr(policy, "matmul_peak", lambda dtype, *a, **kw: 1e12)
    results = scale.run_scale(
        "search_spaces/default.yaml",
        "20M",
        ["transformer", "hc", "mhc", "looped"],
        {},
        ["default"],
        4,
        64,
        2,
        ["auto", "fp32"],
    )
    assert groups == [
        [("transformer", None), ("mhc", "auto"), ("mhc", "fp32"), ("hc", "auto"), ("hc", "fp32")],
        [("looped", None)],
    ]
    lines = scale.ratio_lines(results, "default", ["auto", "fp32"])
    assert lines[0].startswith(
        "mhc (streams auto) vs transformer: +8.0% time per token, 95% interval +8.0% to +8.0%"
    )
    assert lines[0].endswith("over 4 paired rounds (target <= 10%: met)")
    assert lines[1].startswith("mhc (streams fp32) vs transformer: +20.0%") and lines[1].endswith(
        "missed)"
    )
    assert [ln.split(":")[0] for ln in lines[2:]] == [
        "hc (streams auto) vs transformer",
        "hc (streams fp32) vs transformer",
    ]
