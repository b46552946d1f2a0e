"""`python -m benchmark.perf scale`: one training step of each family as a space solves it at its
budget (the GPU-sized check)."""

from __future__ import annotations

from benchmark.perf.timing import measure
from benchmark.store import speeds


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
    from rich.table import Table

    from benchmark.console import console as wide_console
    from benchmark.space.candidates import resolve
    from benchmark.space.language import load_space
    from benchmark.space.source import Override
    from benchmark.trial.step import (
        ExecPolicy,
        default_device,
        matmul_peak,
        prepare_device,
    )

    space = load_space(space_path, [Override.flag("budget", "budget", budget)] if budget else [])
    seq_len = seq_len or space.training_value("seq_len")
    batch_size = batch_size or space.training_value("batch_size")
    device = default_device()
    console = wide_console()
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
