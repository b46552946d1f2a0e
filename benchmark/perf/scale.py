"""`shapebench perf scale`: one training step of each family as a space solves it at its
budget (the GPU-sized check), each hyper-connection family interleaved with its baseline."""

from __future__ import annotations

import dataclasses

from benchmark.console import console as wide_console
from benchmark.perf.models import HYPER_TARGETS, comparison_groups, paired_line
from benchmark.perf.timing import measure_together
from benchmark.space import Choice, FloatRange, IntRange, Override, choose, load_space, resolve
from benchmark.store import speeds


def reference_values(space, family: str, fixed: dict[str, object]) -> dict[str, object]:
    """One point of `space` for `family`: the values given with --set, else the middle of each
    range and the first of each choice (a stated, repeatable reference, not a search)."""

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


def with_streams(spec, stream_dtype: str):
    """`spec` with its streams stored in `stream_dtype` (hyper.stream_dtype); a model without
    streams is returned as it is."""
    if spec.hyper is None or stream_dtype == spec.hyper.stream_dtype:
        return spec
    return dataclasses.replace(
        spec, hyper=dataclasses.replace(spec.hyper, stream_dtype=stream_dtype)
    )


def run_scale(
    space_path: str,
    budget: str | None,
    families: list[str],
    fixed: dict[str, object],
    precisions: list[str],
    steps: int,
    seq_len: int | None,
    batch_size: int | None,
    stream_dtypes: list[str] = ("auto",),
) -> dict:
    """The table (and, for the families of HYPER_TARGETS asked with their baselines, the paired
    ratios): each group of comparison_groups is built together and its steps go round the paths
    (measure_together), so a ratio is read from back-to-back steps; each path's peak memory is its
    own. A hyper family runs once per stream dtype of `stream_dtypes`."""
    # torch and the trial load when something is measured: `python -m benchmark.perf` reads this
    # module for its flags.
    import torch
    from rich.table import Table

    from benchmark.models.hyper import stream_record
    from benchmark.trial.policy import ExecPolicy, default_device, matmul_peak, prepare_device

    space = load_space(space_path, [Override.flag("budget", "budget", budget)] if budget else [])
    seq_len = seq_len or space.training_value("seq_len")
    batch_size = batch_size or space.training_value("batch_size")
    device = default_device()
    console = wide_console()
    prepare_device(device)  # fp32 matmuls in TF32 on CUDA, as the fp32 path trains
    big = (
        8192 if device.type == "cuda" else 2048
    )  # a size that fills a GPU; bounded in time on a CPU
    peak = {
        "fp32": matmul_peak(torch.float32, n_max=big),
        "bf16": matmul_peak(torch.bfloat16, n_max=big),
    }
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else speeds.machine_key()
    console.print(
        f"{name}: matmul peak fp32 {peak['fp32'] / 1e12:.1f} TFLOP/s (TF32 where CUDA has it), "
        f"bf16 {peak['bf16'] / 1e12:.1f} TFLOP/s; torch {torch.__version__}"
    )
    table = Table(
        title=f"One training step at {space.name}'s budget (seq {seq_len}, micro-batch {batch_size})"
    )
    for col in (
        "family",
        "structure",
        "d_model",
        "params",
        "path",
        "streams",
        "first step s",
        "step s",
        "tokens/s",
        "TFLOP/s",
        "MFU",
        "peak mem GiB",
    ):
        table.add_column(col, justify="right")
    solved = {fam: resolve(space, reference_values(space, fam, fixed)) for fam in families}
    results, rows = {}, []
    for group in comparison_groups(families):
        paths = []  # (family, precision, stream dtype setting, spec, policy)
        for fam in group:
            spec = solved[fam].solution.spec
            for prec in precisions:
                policy = ExecPolicy() if prec == "default" else ExecPolicy(precision=prec)
                for sd in stream_dtypes if spec.hyper is not None else ["auto"]:
                    paths.append((fam, prec, sd, with_streams(spec, sd), policy))
        console.print(f"[dim]{', '.join(group)}: {len(paths)} paths, steps interleaved ...[/dim]")
        measured = measure_together(
            [(spec, policy) for *_, spec, policy in paths],
            steps=steps,
            warmup=3,
            seq_len=seq_len,
            batch_size=batch_size,
        )
        for (fam, prec, sd, spec, policy), m in zip(paths, measured):
            results[(fam, prec, sd)] = m
            autocast = policy.autocast_dtype(device)
            dtype = "bf16" if autocast is not None else "fp32"
            path = f"{dtype} compiled" + (" (default)" if prec == "default" else "")
            streams = stream_record(spec.hyper, device.type, dtype).get("stream_dtype", "-")
            rows.append(
                (
                    fam,
                    [
                        fam,
                        spec.structure(),
                        str(spec.d_model),
                        f"{solved[fam].solution.params['total'] / 1e6:.1f}M",
                        path,
                        streams,
                        f"{m.first_step_s:.1f}",
                        f"{m.step_s:.4f}",
                        f"{m.tokens_per_s:,.0f}",
                        f"{m.flops_per_s / 1e12:.1f}",
                        f"{m.flops_per_s / peak[dtype]:.0%}",
                        f"{m.peak_mem_bytes / 2**30:.1f}",
                    ],
                )
            )
    for _, cells in sorted(rows, key=lambda r: families.index(r[0])):
        table.add_row(*cells)
    console.print(table)
    console.print(
        "MFU: count_flops' training FLOPs per token x tokens/s over the matmul peak measured above "
        "in the path's precision (not the datasheet's). Peak memory: each path's own (the allocator's "
        "high-water mark over what was held before it was built)."
    )
    for line in ratio_lines(results, precisions[0], stream_dtypes):
        console.print(line)
    return results


def ratio_lines(results, prec: str, stream_dtypes) -> list[str]:
    """Each target of HYPER_TARGETS measured with its baseline, per stream dtype, in time per
    token from the paired rounds (paired_line)."""
    lines = []
    for a, b, limit in HYPER_TARGETS:
        for sd in stream_dtypes:
            if (a, prec, sd) in results and (b, prec, "auto") in results:
                line = paired_line(
                    f"{a} (streams {sd}) vs {b}",
                    results[(a, prec, sd)],
                    results[(b, prec, "auto")],
                    limit,
                )
                lines += [line] if line else []
    return lines
