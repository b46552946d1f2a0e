"""`shapebench perf models`: every family's training step at a reference size, its
paths (default, eager fp32, the other precisions) side by side, and the hyper families' speed
targets (HYPER_TARGETS) judged with paired intervals."""

from __future__ import annotations

import hashlib
import math
import time
from pathlib import Path

from benchmark.arch import ArchSpec, count_flops, count_params
from benchmark.console import console as wide_console
from benchmark.perf import timing
from benchmark.perf.timing import MIN_ROUNDS, Measurement, measure_together
from benchmark.store import speeds

# A dtype whose matmuls are this many times slower than fp32 is not benchmarked (a training step
# in it would take minutes on such a CPU).
SLOW_BF16 = 4
REFERENCE = {"d_model": 256, "n_heads": 4, "vocab_size": 8192, "ffn": {"ratio": 2.75}}
LOOPED_SPLIT = {"begin": 2, "middle": 2, "end": 2}  # 6 unique layers, like the 6-layer Transformer
SEQ_LEN, BATCH = 256, 16  # the reference step's tokens
MIN_RUNS = 3  # runs of the same code before a target is judged between runs (across_runs)
# Paired rounds a run needs to join them: the interval between runs weighs every run alike, so a
# run's own noise must be small beside the spread between hours: a full run gives a few dozen
# rounds on a 2-core CPU, a 1-minute run of two families a handful (benchmarks/2026-11-24-perf-cpu-epyc.md).
RUN_ROUNDS = 10


def reference_spec(family: str) -> ArchSpec:
    """Every family at the same unique layers (6) and width, so per-token times compare."""
    raw = {"family": family, **REFERENCE}
    preset_looped = ArchSpec.from_dict({"family": family}).layers.middle > 0
    raw["layers"] = LOOPED_SPLIT if preset_looped else {"n": 6}
    return ArchSpec.from_dict(raw)


# The goals for the hyper-connection families: time per token over their baselines (the mHC
# paper's fused kernel costs 6.7% at n = 4).
HYPER_TARGETS = (
    ("hyperloop", "looped", 0.03),
    ("mhc", "transformer", 0.10),
    ("hc", "transformer", 0.10),
)


def comparison_groups(families: list[str]) -> list[list[str]]:
    """The families whose steps are interleaved (measure_together): each baseline of
    HYPER_TARGETS with the families compared against it, every other family alone; in the order
    of `families`."""
    groups: list[list[str]] = []
    for fam in families:
        if any(fam in g for g in groups):
            continue
        baseline = next((b for a, b, _ in HYPER_TARGETS if a == fam and b in families), fam)
        groups.append(
            [baseline] + [a for a, b, _ in HYPER_TARGETS if b == baseline and a in families]
        )
    return groups


def run_models(families: list[str], steps: int, minutes: float | None = None) -> dict:
    """The `models` table and ratios. With `minutes`, the run ends within about that time from here (ten
    minutes by default, so the slowest machines still finish it): the groups without a target of
    HYPER_TARGETS time MIN_ROUNDS rounds, then each group with one gets the time left in proportion
    to the training FLOPs of the paths it goes on timing after those (`read`, `cost` below) and
    times up to `steps` rounds in it (at least MIN_ROUNDS)."""
    end = time.perf_counter() + 60 * minutes if minutes else None
    # torch and the trial load when something is measured: the plan reads perf/ for its estimates.
    import torch
    from rich.table import Table

    from benchmark.trial.policy import ExecPolicy, default_device, matmul_peak

    console = wide_console()
    peak = {"fp32": matmul_peak(torch.float32), "bf16": matmul_peak(torch.bfloat16)}
    slow_bf16 = peak["bf16"] < peak["fp32"] / SLOW_BF16
    console.print(
        f"matmul peak here: fp32 {peak['fp32'] / 1e9:.0f} GFLOP/s, bf16 {peak['bf16'] / 1e9:.0f} GFLOP/s "
        f"({torch.get_num_threads()} threads, {default_device()}); default path: "
        f"{ExecPolicy().autocast_dtype(default_device()) or 'fp32'} (precision: auto), compiled by regions"
    )
    default, eager = ExecPolicy(), ExecPolicy(precision="fp32", compile=False)
    chosen = default.autocast_dtype(default_device())
    auto = "bf16" if chosen is not None else "fp32"  # the whole-model row in the chosen precision
    compared = [
        ("compiled fp32", ExecPolicy(precision="fp32", compile=True)),
        (
            f"compiled {auto}, whole model",
            ExecPolicy(precision=auto, compile=True, compile_scope="model"),
        ),
    ]
    if not slow_bf16:
        compared.append(("compiled bf16", ExecPolicy(precision="bf16", compile=True)))
    else:  # a step would take minutes: say so rather than never finish
        console.print(
            f"compiled bf16 skipped: bf16 matmul here is {peak['fp32'] / peak['bf16']:.0f}x slower than fp32"
        )
    # the path `auto` chose is the default row: measuring it twice would compare it with itself
    same = [
        name
        for name, p in compared
        if p.compile_scope == "regions" and p.autocast_dtype(default_device()) == chosen
    ]
    compared = [(name, p) for name, p in compared if name not in same]
    if same:
        console.print(f"default = {same[0]} here")
    rows, results = [], {}
    # the first family also runs the other precisions, to show what `auto` chose against; in a
    # group the default paths come first, side by side, as the targets compare them
    groups = comparison_groups(families)
    plans = [
        [
            (fam, name, policy)
            for name, policy in [("default", default), ("eager fp32", eager)] + compared
            for fam in group
            if name in ("default", "eager fp32") or fam == families[0]
        ]
        for group in groups
    ]
    targeted = [len(group) > 1 for group in groups]  # a group joins only a baseline and its targets
    # With a time budget, after MIN_ROUNDS rounds a group times only the paths that a ratio reads
    # from its rounds (the default paths) or that the precision comparison reads (the first
    # family's): the other families' eager steps are the slowest paths, and nothing reads them.
    read = [
        [i for i, (fam, name, _) in enumerate(paths) if name == "default" or fam == families[0]]
        for paths in plans
    ]
    # A round's time, forecast by its FLOPs, so the compared groups get about as many rounds each
    # (by path counts alone, Looped and Hyperloop, whose steps are 1.5x the Transformer's, got 20
    # rounds where the Transformer's group got 32, and their 3% target is the finest).
    cost = [
        sum(count_flops(reference_spec(plans[i][k][0]), SEQ_LEN)["train"] for k in read[i])
        for i in range(len(plans))
    ]
    # groups without a target first, with the fewest rounds; then those with one share the rest
    order = sorted(range(len(plans)), key=lambda i: targeted[i])
    for k, i in enumerate(order):
        paths, now, until, allowed, focus = plans[i], time.perf_counter(), None, "", None
        if end is not None:
            share = cost[i] / sum(cost[j] for j in order[k:]) if targeted[i] else 0.0
            until, focus = now + max(0.0, end - now) * share, read[i]
            allowed = f" for {until - now:.0f} s" if share else f", {MIN_ROUNDS} rounds"
            if share and len(focus) < len(paths):
                allowed += f" ({len(focus)} of them after {MIN_ROUNDS} rounds)"
        console.print(
            f"[dim]{', '.join(dict.fromkeys(f for f, _, _ in paths))}: {len(paths)} paths, "
            f"steps interleaved{allowed} ...[/dim]"
        )
        measured = measure_together(
            [(reference_spec(fam), policy) for fam, _, policy in paths],
            steps=steps,
            seq_len=SEQ_LEN,
            batch_size=BATCH,
            until=until,
            focus=focus,
        )
        for (fam, name, _), m in zip(paths, measured):
            results[(fam, name)] = m
    results = dict(
        sorted(results.items(), key=lambda kv: families.index(kv[0][0]))
    )  # the families' order
    for fam, name in results:
        rows.append((fam, reference_spec(fam).structure(), name, results[(fam, name)]))
    table = Table(title=f"Training speed at the reference size (seq {SEQ_LEN}, batch {BATCH})")
    for col in (
        "family",
        "structure",
        "params (non-emb)",
        "path",
        "first step s",
        "step s",
        "tokens/s",
        "GFLOP/s",
        "/ fp32 peak",
        "/ bf16 peak",
    ):
        table.add_column(col, justify="right")
    for fam, structure, name, m in rows:
        p = count_params(reference_spec(fam))["non_embedding"]
        table.add_row(
            fam,
            structure,
            f"{p / 1e6:.2f}M",
            name,
            f"{m.first_step_s:.1f}",
            f"{m.step_s:.3f}",
            f"{m.tokens_per_s:,.0f}",
            f"{m.flops_per_s / 1e9:.1f}",
            f"{m.flops_per_s / peak['fp32']:.0%}",
            "-" if slow_bf16 else f"{m.flops_per_s / peak['bf16']:.0%}",
        )
    console.print(table)
    summary = _ratios(
        results, across_runs(results, timing.speeds_file(), model_code(), time.time())
    )
    for line in summary:
        console.print(line)
    return results


def paired_ratio(a: Measurement, b: Measurement) -> tuple[float, float, float, int]:
    """a's time per step over b's from the rounds of measure_together, each round's two steps taken
    back to back so that the shared CPU's drift mostly cancels: the estimate of a / b - 1 (the
    rounds' geometric mean ratio, the interval's centre), (lo, hi) of its 95% interval
    (stats.ratio_interval) and the number of rounds. A target is `met` or `missed` only where this
    interval says so. The interval is this run's: on a shared machine two runs an hour apart can
    give disjoint intervals, as the hours differ by more than one run's rounds do
    (benchmarks/2026-11-24-perf-cpu-epyc.md)."""
    # The leaderboard's statistics (scipy) load only for a report: the plan reads perf/ for its estimates.
    from benchmark.leaderboard.stats import ratio_interval

    rounds = min(len(a.step_times), len(b.step_times))  # below 2 the interval is NaN
    return (*map(float, ratio_interval(a.step_times[:rounds], b.step_times[:rounds])), rounds)


def _judged(lo: float, hi: float, limit: float, unresolved: str) -> str:
    """A time-ratio target's verdict from an interval (lo, hi): `met` only with the whole interval
    at or under `limit`, `missed` with all of it over, else `unresolved`."""
    from benchmark.leaderboard.stats import VERDICTS, verdict  # scipy, as paired_ratio

    return dict(zip(VERDICTS, ("met", "missed", unresolved)))[
        str(verdict(lo - limit, hi - limit, expected_sign=-1))
    ]


def paired_line(label: str, a: Measurement, b: Measurement, limit: float) -> str | None:
    """`label`: a's time per token over b's from their paired rounds, with its interval, judged
    against the target `limit`; None with fewer than MIN_ROUNDS rounds (no interval)."""
    from benchmark.leaderboard.stats import LEVEL  # scipy, as paired_ratio

    est, lo, hi, rounds = paired_ratio(a, b)
    if rounds < MIN_ROUNDS:
        return None
    return (
        f"{label}: {est:+.1%} time per token, {LEVEL:.0%} interval {lo:+.1%} to {hi:+.1%} over {rounds} "
        f"paired rounds (target <= {limit:.0%}: {_judged(lo, hi, limit, 'not resolved at this noise')})"
    )


def _ratios(results, between: list[str] = ()) -> list[str]:
    """The comparisons the model-zoo issue asks for, as time-per-token ratios: from the paired
    rounds where there are enough (the table's medians, taken path by path, can sit outside the
    paired interval), else the medians' ratio; then `between`, the same over runs (across_runs)."""

    def t(fam, path="default"):
        return 1 / results[(fam, path)].tokens_per_s if (fam, path) in results else None

    lines = []
    for a, b, limit in HYPER_TARGETS:
        if t(a) and t(b):
            line = paired_line(
                f"{a} vs {b}", results[(a, "default")], results[(b, "default")], limit
            )
            if line is None:  # too few rounds for an interval: the medians' ratio alone
                over = t(a) / t(b) - 1
                found = "met" if over <= limit else "missed"
                line = f"{a} vs {b}: {over:+.1%} time per token (target <= {limit:.0%}: {found})"
            lines.append(line)
    if any("paired rounds" in line for line in lines):
        lines.append(
            "(each interval is this run's rounds; on a shared CPU a run at another time can read outside it)"
        )
    lines += between
    for fam in sorted({f for f, _ in results}):
        if t(fam) and t(fam, "eager fp32"):
            lines.append(
                f"{fam}: default path {t(fam, 'eager fp32') / t(fam):.2f}x faster than eager fp32"
            )
    paths = {p: t(f, p) for f, p in results if f == next(iter(results))[0]}
    if len(paths) > 2:
        best = min(paths, key=paths.get)
        lines.append(
            "precision here: "
            + ", ".join(f"{p} {paths[best] / v:.0%} of the best" for p, v in paths.items())
            + f" (best: {best})"
        )
    return lines


def model_code() -> str:
    """A hash of the code a training step runs (the models, the step): runs of `perf models` are
    pooled across hours only while it is unchanged, so that a faster kernel starts a new history."""
    root = Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    for f in sorted([*(root / "models").glob("*.py"), root / "trial" / "step.py"]):
        h.update(f.name.encode() + f.read_bytes())
    return h.hexdigest()[:12]


def across_runs(results, path, code: str, now: float) -> list[str]:
    """Each target's paired estimate from this run joins the earlier runs of the same code on this
    machine (store/speeds.py); from three runs on, a t interval between runs judges the target. One
    run's interval says how steady its rounds were, not how the ratio moves with a shared CPU's
    hours (paired_ratio): that needs runs at different times, and their spread is this interval."""
    from benchmark.leaderboard.stats import LEVEL, interval, mean_se  # scipy, as paired_ratio

    lines = []
    for a, b, limit in HYPER_TARGETS:
        if (a, "default") not in results or (b, "default") not in results:
            continue
        est, _, _, rounds = paired_ratio(results[(a, "default")], results[(b, "default")])
        if rounds < MIN_ROUNDS:
            continue
        joins = rounds >= RUN_ROUNDS
        if joins:
            speeds.record_ratio(path, f"{a}/{b}", code, math.log1p(est), rounds, now)
        else:  # the verdict of the runs kept is still printed
            lines.append(
                f"{a} vs {b}: this run's {rounds} paired rounds are too few to join the runs between which "
                f"targets are judged (at least {RUN_ROUNDS}: give it more time)"
            )
        runs = [
            r for r in speeds.ratio_runs(path, f"{a}/{b}", code) if r[2] >= RUN_ROUNDS
        ]  # and those kept before
        if len(runs) < MIN_RUNS:
            if joins:
                lines.append(
                    f"{a} vs {b}: {len(runs)} run(s) of this code here so far; from {MIN_RUNS}, an interval "
                    "between runs"
                )
            continue
        mean, se, n = (float(v) for v in mean_se([r for _, r, _ in runs]))
        lo, hi = (math.expm1(float(v)) for v in interval(mean, se, n - 1))
        found = _judged(lo, hi, limit, "not resolved")
        span = " to ".join(
            time.strftime("%Y-%m-%d %H:%M", time.gmtime(w)) for w in (runs[0][0], runs[-1][0])
        )
        lines.append(
            f"{a} vs {b} over the last {len(runs)} runs of this code here ({span} UTC): {math.expm1(mean):+.1%}, "
            f"{LEVEL:.0%} interval {lo:+.1%} to {hi:+.1%} between runs (target <= {limit:.0%}: {found})"
        )
    return lines
