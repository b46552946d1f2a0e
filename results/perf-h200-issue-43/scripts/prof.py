"""Each hyper family's 113M step with the Triton kernels and with the PyTorch path (bf16 streams
both), compiled, one process, sequential; the top CUDA kernels of one profiled step."""
import statistics, sys, time
import torch
from torch.profiler import ProfilerActivity, profile

from benchmark.models import hyper
from benchmark.perf.scale import reference_values
from benchmark.space.candidates import resolve
from benchmark.space.language import load_space
from benchmark.space.source import Override
from benchmark.trial.config import TrainConfig
from benchmark.trial.step import ExecPolicy, TrainStep, default_device, prepare_device
from benchmark.trial.training import make_optimizer
from benchmark.models import build_model

fams = sys.argv[1].split(",")
space = load_space("search_spaces/default.yaml", [Override.flag("budget", "budget", "113M")])
dev = default_device(); prepare_device(dev)
x = torch.randint(0, 1000, (16, 2049)).to(dev)
xs, ys = x[:, :-1], x[:, 1:]
plain_fused = hyper.fused
for fam in fams:
    spec = resolve(space, reference_values(space, fam, {})).solution.spec
    for mode in ("kernels", "torch"):
        hyper.fused = plain_fused if mode == "kernels" else (lambda t: False)
        torch.manual_seed(0)
        model = build_model(spec).to(dev).train()
        step = TrainStep(model, make_optimizer(model, TrainConfig(lr=1e-4)), ExecPolicy(), dev, fresh=True)
        t0 = time.perf_counter(); step(xs, ys).item(); first = time.perf_counter() - t0
        for _ in range(3):
            step(xs, ys).item()
        ts = []
        for _ in range(10):
            t0 = time.perf_counter(); step(xs, ys).item(); ts.append(time.perf_counter() - t0)
        print(f"### {fam} {mode}: first {first:.1f} s, median step {statistics.median(ts) * 1e3:.1f} ms "
              f"(min {min(ts) * 1e3:.1f})", flush=True)
        if fam != "transformer":
            with profile(activities=[ProfilerActivity.CUDA]) as p:
                step(xs, ys).item()
            print(p.key_averages().table(sort_by="cuda_time_total", row_limit=14, max_name_column_width=60), flush=True)
        step.close(); del step, model
        torch.cuda.empty_cache()
        if fam == "transformer":
            break
hyper.fused = plain_fused
