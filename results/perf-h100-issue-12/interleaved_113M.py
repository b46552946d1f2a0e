"""On the GPU: at the default space's 113M, each family's default path (bf16, compiled by regions)
against the same model compiled whole, steps interleaved; and the hyper families' paired ratios."""
import sys, time
from benchmark.perf.models import paired_ratio
from benchmark.perf.scale import reference_values
from benchmark.perf.timing import measure_together
from benchmark.space.candidates import resolve
from benchmark.space.language import load_space
from benchmark.trial.step import ExecPolicy

space = load_space("search_spaces/default.yaml")
steps = int(sys.argv[1]) if len(sys.argv) > 1 else 20
paths = {"regions": ExecPolicy(), "model": ExecPolicy(compile_scope="model")}
for group in (["looped", "hyperloop"], ["transformer", "hc", "mhc"]):
    specs = {f: resolve(space, reference_values(space, f, {})).solution.spec for f in group}
    order = [(f, p) for p in paths for f in group]
    t0 = time.time()
    ms = measure_together([(specs[f], paths[p]) for f, p in order], steps=steps, warmup=3, seq_len=2048, batch_size=16)
    res = dict(zip(order, ms))
    print(f"group {group}: {time.time() - t0:.0f} s, peak {ms[0].peak_mem_bytes / 2**30:.1f} GiB (all paths)", flush=True)
    for (f, p), m in res.items():
        print(f"  {f:12s} {specs[f].structure():14s} d{specs[f].d_model} {p:8s} first {m.first_step_s:6.1f} s  step {m.step_s * 1e3:7.1f} ms  {m.tokens_per_s:9,.0f} tok/s  {m.flops_per_s / 1e12:6.1f} TFLOP/s")
    for f in group:
        r, lo, hi, n = paired_ratio(res[(f, "regions")], res[(f, "model")])
        print(f"  {f}: regions over whole model {r:+.1%} [{lo:+.1%}, {hi:+.1%}] ({n} rounds)")
    base = group[0]
    for f in group[1:]:
        for p in paths:
            r, lo, hi, n = paired_ratio(res[(f, p)], res[(base, p)])
            print(f"  {f} over {base} ({p}): {r:+.1%} per token [{lo:+.1%}, {hi:+.1%}] ({n} rounds)")
