"""Speed of the training path on this machine.

    python -m benchmark.perf models [--steps 8] [--families transformer,looped,...]
    python -m benchmark.perf scale [SPACE] [--budget 113M] [--families transformer,hyperloop]
                                   [--set shape.layers=12 ...] [--precisions default,fp32]

`models` trains every family for a few steps at a reference size (~4.8M non-embedding
parameters, seq 256, batch 16) with the default execution policy, plus eager float32 for
comparison, and prints tokens/s, achieved FLOP/s and the ratio to this machine's bf16 and fp32
matmul peak, all measured in one run. Timings are noisy on a shared CPU, so the families compared
with each other (HYPER_TARGETS) and the paths of one family are timed in interleaved rounds
(measure_together), and the ratios printed come from those rounds.

`scale` measures one training step of each family as a space solves it at its budget (default:
the default space at 113M, with its sequence length and micro-batch): tokens/s, model-FLOPs
utilisation against the bf16 matmul peak measured in the same run, and peak memory. It is the
GPU-sized check (issue 17); on a CPU a 113M step takes minutes.

`machine_flops()` is the throughput used for time estimates (`run_search.py --plan`): the last
measured value cached on disk, else a short probe.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from benchmark.arch.counting import count_flops, count_params
from benchmark.arch.spec import FAMILIES, ArchSpec
from benchmark.store import speeds

# A dtype whose matmuls are this many times slower than fp32 is not benchmarked (a training step
# in it would take minutes on such a CPU).
SLOW_BF16 = 4
REFERENCE = {"d_model": 256, "n_heads": 4, "vocab_size": 8192, "ffn": {"ratio": 2.75}}
LOOPED_SPLIT = {"begin": 2, "middle": 2, "end": 2}  # 6 unique layers, like the 6-layer Transformer


def reference_spec(family: str) -> ArchSpec:
    """Every family at the same unique layers (6) and width, so per-token times compare."""
    raw = {"family": family, **REFERENCE}
    preset_looped = ArchSpec.from_dict({"family": family}).layers.middle > 0
    raw["layers"] = LOOPED_SPLIT if preset_looped else {"n": 6}
    return ArchSpec.from_dict(raw)


@dataclass(frozen=True)
class Measurement:
    step_s: float          # median seconds per step after warm-up
    first_step_s: float    # includes compilation
    tokens_per_s: float
    flops_per_s: float     # achieved training FLOP/s (count_flops' train FLOPs per token x tokens/s)
    peak_mem_bytes: int = 0  # the step's peak (CUDA allocator; on a CPU the process's high-water mark)
    step_times: tuple[float, ...] = ()  # the timed steps, one per round of measure_together (paired_ratio)


def measure(spec: ArchSpec, policy, steps: int = 8, warmup: int = 2,
            seq_len: int = 256, batch_size: int = 16, seed: int = 0) -> Measurement:
    """One training path's speed: `steps` timed steps after `warmup` (the first includes compiling)."""
    return measure_together([(spec, policy)], steps, warmup, seq_len, batch_size, seed)[0]


def measure_together(paths: list[tuple[ArchSpec, object]], steps: int = 8, warmup: int = 2,
                     seq_len: int = 256, batch_size: int = 16, seed: int = 0) -> list[Measurement]:
    """Several (spec, policy) paths measured side by side: each is built and warmed up in turn,
    then the timed steps go round the paths, one step each per round, so that a slow stretch of a
    shared CPU slows every path alike. Measured one after another, the same two families' ratio
    moved by 20 points between runs on a 2-core VM (Hyperloop over Looped: +24% in one run, +4%
    with interleaved steps the same day); their ratios are what `_ratios` reports. Peak memory
    is that of all the paths together (`measure`: one path's)."""
    import torch

    from benchmark.models import build_model
    from benchmark.trial.config import TrainConfig
    from benchmark.trial.step import TrainStep, default_device, prepare_device
    from benchmark.trial.training import (
        make_optimizer,
        peak_memory_bytes,
        reset_peak_memory,
    )

    device = default_device()
    prepare_device(device)
    reset_peak_memory(device)
    gen = torch.Generator().manual_seed(seed)
    vocab = min(spec.vocab_size for spec, _ in paths)
    data = torch.randint(0, vocab, (batch_size, seq_len + 1), generator=gen).to(device)
    x, y = data[:, :-1], data[:, 1:]

    def timed(step) -> float:
        t = time.perf_counter()
        step(x, y).item()  # .item() synchronises (CUDA) so the step is really done
        return time.perf_counter() - t

    def build(spec, policy, fresh: bool):
        torch.manual_seed(seed)
        model = build_model(spec).to(device).train()
        opt = make_optimizer(model, TrainConfig(lr=1e-4))  # the trial's optimiser (fused AdamW on CUDA)
        return TrainStep(model, opt, policy, device, fresh=fresh)

    def run() -> list[list[float]]:
        """Each path's step times; its models are freed when it returns."""
        built, times = [], []
        try:
            for i, (spec, policy) in enumerate(paths):
                # only the first drops dynamo's compiled code: the others' must stay for the rounds
                built.append(build(spec, policy, fresh=i == 0))
                times.append([timed(built[-1]) for _ in range(warmup)])
            for _ in range(steps):
                for step, ts in zip(built, times):
                    ts.append(timed(step))
        finally:
            for step in built:
                step.close()  # compiled methods refer to their modules: left on, they keep the model alive
        return times

    times = run()
    peak = peak_memory_bytes(device)  # the high-water mark of all the paths together
    out = []
    for (spec, _), ts in zip(paths, times):
        step_s = statistics.median(ts[warmup:])
        tps = batch_size * seq_len / step_s
        out.append(Measurement(step_s, ts[0], tps, tps * count_flops(spec, seq_len)["train"], peak,
                               tuple(ts[warmup:])))
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return out


# ---- the throughput used for estimates ------------------------------------------------------

def _speeds_file() -> Path:
    from benchmark.data import cache_root

    return speeds.path_in(cache_root())


def machine_flops(probe: bool = True) -> float:
    """This machine's training FLOP/s when no trial has measured better: the value recorded by
    `benchmark.perf models` or an earlier probe, else a short eager probe (a few seconds;
    conservative, since compiled runs are faster)."""
    cached = speeds.machine_fallback(_speeds_file())
    if cached is not None:
        return cached
    if not probe:
        raise LookupError("no measured throughput for this machine yet")
    from benchmark.trial.step import ExecPolicy, default_device

    spec, seq_len, batch_size = probe_shape(default_device().type)
    m = measure(spec, ExecPolicy(compile=False), steps=3, warmup=1, seq_len=seq_len, batch_size=batch_size)
    record_flops(m.flops_per_s, source="probe")
    return m.flops_per_s


def probe_shape(device_type: str) -> tuple[ArchSpec, int, int]:
    """(spec, seq_len, batch) of the throughput probe. On a CPU a small model, so the probe takes
    seconds. On a GPU a step sized like a real one (~100M parameters, 8 x 1024 tokens, in the
    default precision): a tiny model there measures kernel launches, not the GPU, and would put
    113M estimates off by an order of magnitude. Keyed, like every speed, by the machine (its GPU's
    name included: store/speeds.machine_key); finished trials replace it (store/speeds.py)."""
    if device_type == "cuda":
        spec = ArchSpec.from_dict({"d_model": 768, "n_heads": 12, "layers": {"n": 12}, "vocab_size": 8192})
        return spec, 1024, 8
    return ArchSpec.from_dict({"d_model": 128, "n_heads": 4, "layers": {"n": 4}, "vocab_size": 4096}), 128, 8


def record_flops(flops_per_s: float, source: str) -> None:
    """Remember this machine's training FLOP/s for estimates (atomic write; best effort)."""
    speeds.record_machine(_speeds_file(), flops_per_s, source)


def estimates(precision: str = "auto", compile: bool = True):
    """family -> Speed for `--plan`: what finished trials measured here under this policy
    (store/speeds.py), else machine_flops() with the plan's fixed overhead."""
    from benchmark.space.plan import TRIAL_OVERHEAD_S

    return speeds.estimator(_speeds_file(), speeds.policy_key(precision, compile), machine_flops(), TRIAL_OVERHEAD_S)


# ---- the benchmark ------------------------------------------------------------------------

# Issue 12's goals for the hyper-connection families: time per token over their baselines (the
# mHC paper's fused kernel costs 6.7% at n = 4).
HYPER_TARGETS = (("hyperloop", "looped", 0.03), ("mhc", "transformer", 0.10), ("hc", "transformer", 0.10))


def comparison_groups(families: list[str]) -> list[list[str]]:
    """The families whose steps are interleaved (measure_together): each baseline of
    HYPER_TARGETS with the families compared against it, every other family alone; in the order
    of `families`."""
    groups: list[list[str]] = []
    for fam in families:
        if any(fam in g for g in groups):
            continue
        baseline = next((b for a, b, _ in HYPER_TARGETS if a == fam and b in families), fam)
        groups.append([baseline] + [a for a, b, _ in HYPER_TARGETS if b == baseline and a in families])
    return groups


def run_models(families: list[str], steps: int) -> dict:
    import torch
    from rich.console import Console
    from rich.table import Table

    from benchmark.trial.step import ExecPolicy, default_device, matmul_peak

    console = Console()
    console = console if console.is_terminal else Console(width=200)  # a log keeps every column
    peak = {"fp32": matmul_peak(torch.float32), "bf16": matmul_peak(torch.bfloat16)}
    slow_bf16 = peak["bf16"] < peak["fp32"] / SLOW_BF16
    console.print(f"matmul peak here: fp32 {peak['fp32'] / 1e9:.0f} GFLOP/s, bf16 {peak['bf16'] / 1e9:.0f} GFLOP/s "
                  f"({torch.get_num_threads()} threads, {default_device()}); default path: "
                  f"{ExecPolicy().autocast_dtype(default_device()) or 'fp32'} (precision: auto), compiled by regions")
    default, eager = ExecPolicy(), ExecPolicy(precision="fp32", compile=False)
    chosen = default.autocast_dtype(default_device())
    auto = "bf16" if chosen is not None else "fp32"  # the whole-model row in the chosen precision
    compared = [("compiled fp32", ExecPolicy(precision="fp32", compile=True)),
                (f"compiled {auto}, whole model", ExecPolicy(precision=auto, compile=True, compile_scope="model"))]
    if not slow_bf16:
        compared.append(("compiled bf16", ExecPolicy(precision="bf16", compile=True)))
    else:  # a step would take minutes: say so rather than never finish
        console.print(f"compiled bf16 skipped: bf16 matmul here is {peak['fp32'] / peak['bf16']:.0f}x slower than fp32")
    # the path `auto` chose is the default row: measuring it twice would compare it with itself
    same = [name for name, p in compared if p.compile_scope == "regions" and p.autocast_dtype(default_device()) == chosen]
    compared = [(name, p) for name, p in compared if name not in same]
    if same:
        console.print(f"default = {same[0]} here")
    rows, results = [], {}
    for group in comparison_groups(families):
        # the first family also runs the other precisions, to show what `auto` chose against
        paths = [(fam, name, policy) for fam in group
                 for name, policy in [("default", default), ("eager fp32", eager)] + (compared if fam == families[0] else [])]
        console.print(f"[dim]{', '.join(group)}: {len(paths)} paths, steps interleaved ...[/dim]")
        measured = measure_together([(reference_spec(fam), policy) for fam, _, policy in paths], steps=steps)
        for (fam, name, _), m in zip(paths, measured):
            results[(fam, name)] = m
    for fam, name in sorted(results, key=lambda k: families.index(k[0])):  # the table in the families' order
        rows.append((fam, reference_spec(fam).structure(), name, results[(fam, name)]))
    table = Table(title="Training speed at the reference size (seq 256, batch 16)")
    for col in ("family", "structure", "params (non-emb)", "path", "first step s", "step s",
                "tokens/s", "GFLOP/s", "/ fp32 peak", "/ bf16 peak"):
        table.add_column(col, justify="right")
    for fam, structure, name, m in rows:
        p = count_params(reference_spec(fam))["non_embedding"]
        table.add_row(fam, structure, f"{p / 1e6:.2f}M", name, f"{m.first_step_s:.1f}", f"{m.step_s:.3f}",
                      f"{m.tokens_per_s:,.0f}", f"{m.flops_per_s / 1e9:.1f}",
                      f"{m.flops_per_s / peak['fp32']:.0%}", "-" if slow_bf16 else f"{m.flops_per_s / peak['bf16']:.0%}")
    console.print(table)
    summary = _ratios(results)
    for line in summary:
        console.print(line)
    if ("transformer", "default") in results:
        record_flops(results[("transformer", "default")].flops_per_s, source="benchmark.perf models")
    return results


def paired_ratio(a: Measurement, b: Measurement) -> tuple[float, float, int]:
    """a's time per step over b's from the rounds of measure_together, each round's two steps taken
    back to back so that the shared CPU's drift mostly cancels: (lo, hi) of the 95% interval of
    a / b - 1 (stats.ratio_interval) and the number of rounds. On the 2-core VM two 30-round runs
    of the same code read Hyperloop over Looped +3.7% and +7.5%: a target is `met` or `missed`
    only where this interval says so."""
    from benchmark.leaderboard.stats import ratio_interval

    rounds = min(len(a.step_times), len(b.step_times))  # below 2 the interval is NaN
    return (*map(float, ratio_interval(a.step_times[:rounds], b.step_times[:rounds])), rounds)


def _ratios(results) -> list[str]:
    """The comparisons the model-zoo issue asks for, as time-per-token ratios."""
    from benchmark.leaderboard.stats import LEVEL, VERDICTS, verdict
    said = dict(zip(VERDICTS, ("met", "missed", "not resolved at this noise")))  # interval below the limit: met

    def t(fam, path="default"):
        return 1 / results[(fam, path)].tokens_per_s if (fam, path) in results else None
    lines = []
    for a, b, limit in HYPER_TARGETS:
        if t(a) and t(b):
            over = t(a) / t(b) - 1
            line = f"{a} vs {b}: {over:+.1%} time per token"
            lo, hi, rounds = paired_ratio(results[(a, "default")], results[(b, "default")])
            if rounds >= 3:
                found = said[str(verdict(lo - limit, hi - limit, expected_sign=-1))]
                line += f", {LEVEL:.0%} interval {lo:+.1%} to {hi:+.1%} over {rounds} paired rounds"
            else:  # too few rounds for an interval: the medians' ratio alone
                found = "met" if over <= limit else "missed"
            lines.append(f"{line} (target <= {limit:.0%}: {found})")
    for fam in sorted({f for f, _ in results}):
        if t(fam) and t(fam, "eager fp32"):
            lines.append(f"{fam}: default path {t(fam, 'eager fp32') / t(fam):.2f}x faster than eager fp32")
    paths = {p: t(f, p) for f, p in results if f == next(iter(results))[0]}
    if len(paths) > 2:
        best = min(paths, key=paths.get)
        lines.append("precision here: " + ", ".join(f"{p} {paths[best] / v:.0%} of the best" for p, v in paths.items())
                     + f" (best: {best})")
    return lines


# ---- one step at a space's budget (the GPU-sized check) ------------------------------------------

def reference_values(space, family: str, fixed: dict[str, object]) -> dict[str, object]:
    """One point of `space` for `family`: the values given with --set, else the middle of each
    range and the first of each choice (a stated, repeatable reference, not a search)."""
    from benchmark.space.candidates import choose
    from benchmark.space.domains import Choice, FloatRange, IntRange

    def pick(axis):
        if axis.key == "family":
            return family
        if axis.key in fixed:
            return fixed[axis.key]
        d = axis.domain
        if isinstance(d, IntRange):
            grid = d.grid()
            return grid[len(grid) // 2]
        if isinstance(d, FloatRange):
            return (d.lo * d.hi) ** 0.5 if d.log else (d.lo + d.hi) / 2
        return d.values[0] if isinstance(d, Choice) else d.value
    return choose(space, pick)


def run_scale(space_path: str, budget: str | None, families: list[str], fixed: dict[str, object],
              precisions: list[str], steps: int, seq_len: int | None, batch_size: int | None) -> dict:
    import torch
    from rich.console import Console
    from rich.table import Table

    from benchmark.space.candidates import resolve
    from benchmark.space.language import load_space
    from benchmark.trial.step import (
        ExecPolicy,
        default_device,
        matmul_peak,
        prepare_device,
    )

    space = load_space(space_path).with_overrides(budget=budget)
    seq_len = seq_len or space.training_value("seq_len")
    batch_size = batch_size or space.training_value("batch_size")
    device = default_device()
    console = Console()
    console = console if console.is_terminal else Console(width=200)
    prepare_device(device)  # fp32 matmuls in TF32 on CUDA, as the fp32 path trains
    big = 8192 if device.type == "cuda" else 2048  # a size that fills a GPU; bounded in time on a CPU
    peak = {"fp32": matmul_peak(torch.float32, n_max=big), "bf16": matmul_peak(torch.bfloat16, n_max=big)}
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else speeds.machine_key()
    console.print(f"{name}: matmul peak fp32 {peak['fp32'] / 1e12:.1f} TFLOP/s (TF32 where CUDA has it), "
                  f"bf16 {peak['bf16'] / 1e12:.1f} TFLOP/s; torch {torch.__version__}")
    table = Table(title=f"One training step at {space.name}'s budget (seq {seq_len}, micro-batch {batch_size})")
    for col in ("family", "structure", "d_model", "params", "path", "first step s", "step s", "tokens/s",
                "TFLOP/s", "MFU", "peak mem GiB"):
        table.add_column(col, justify="right")
    results = {}
    for fam in families:
        cand = resolve(space, reference_values(space, fam, fixed))
        spec = cand.solution.spec
        for prec in precisions:
            policy = ExecPolicy() if prec == "default" else ExecPolicy(precision=prec)
            path = f"{policy.autocast_dtype(device) or 'fp32'} compiled" + (" (default)" if prec == "default" else "")
            console.print(f"[dim]{fam} {spec.structure()} / {path} ...[/dim]")
            m = measure(spec, policy, steps=steps, warmup=3, seq_len=seq_len, batch_size=batch_size)
            results[(fam, prec)] = m
            dtype = "bf16" if policy.autocast_dtype(device) is not None else "fp32"
            table.add_row(fam, spec.structure(), str(spec.d_model), f"{cand.solution.params['total'] / 1e6:.1f}M",
                          path, f"{m.first_step_s:.1f}", f"{m.step_s:.4f}", f"{m.tokens_per_s:,.0f}",
                          f"{m.flops_per_s / 1e12:.1f}", f"{m.flops_per_s / peak[dtype]:.0%}",
                          f"{m.peak_mem_bytes / 2**30:.1f}")
    console.print(table)
    console.print("MFU: count_flops' training FLOPs per token x tokens/s over the matmul peak measured above "
                  "in the path's precision (not the datasheet's).")
    return results


def _setting(text: str) -> tuple[str, object]:
    import yaml

    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE such as shape.layers=12, got {text!r}")
    return key.strip(), yaml.safe_load(value)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmark.perf", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["models", "scale"])
    ap.add_argument("space", nargs="?", default="search_spaces/default.yaml", help="scale: the space (default: %(default)s)")
    ap.add_argument("--steps", type=int, default=8, help="timed steps per family and path")
    ap.add_argument("--families", help="comma-separated families (models: all; scale: transformer,hyperloop)")
    ap.add_argument("--budget", help="scale: the budget (default: the space's)")
    ap.add_argument("--set", type=_setting, action="append", default=[], metavar="KEY=VALUE",
                    help="scale: an axis value, e.g. shape.layers=12 (default: each range's middle, each choice's first)")
    ap.add_argument("--precisions", default="default", help="scale: comma-separated: default, bf16, fp32")
    ap.add_argument("--seq-len", type=int, help="scale: sequence length (default: the space's)")
    ap.add_argument("--batch-size", type=int, help="scale: micro-batch (default: the space's)")
    args = ap.parse_args(argv)
    default = FAMILIES if args.what == "models" else ("transformer", "hyperloop")
    families = [f.strip() for f in (args.families or ",".join(default)).split(",") if f.strip()]
    unknown = set(families) - set(FAMILIES)
    if unknown:
        ap.error(f"unknown families: {', '.join(sorted(unknown))}")
    if args.what == "models":
        run_models(families, args.steps)
        return 0
    precisions = [p.strip() for p in args.precisions.split(",") if p.strip()]
    bad = set(precisions) - {"default", "bf16", "fp32"}
    if bad:
        ap.error(f"unknown precisions: {', '.join(sorted(bad))} (default, bf16, fp32)")
    run_scale(args.space, args.budget, families, dict(args.set), precisions, args.steps, args.seq_len,
              args.batch_size)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
