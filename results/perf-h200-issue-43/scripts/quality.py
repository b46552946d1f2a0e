"""bf16 against fp32 streams, paired by seed, on the reference study's settings (GPU only)."""
import json, os, sys, time
import numpy as np
from scipy import stats

from benchmark.data import DataConfig, prepare
from benchmark.perf.scale import reference_values, with_streams
from benchmark.space.candidates import resolve
from benchmark.space.language import load_space
from benchmark.space.source import Override
from benchmark.trial.config import TrainConfig
from benchmark.trial.run import run_trial

deadline = time.time() + float(sys.argv[1])
out = open(os.path.join(os.environ.get("OUT", "."), "quality.jsonl"), "a")
data = prepare(DataConfig(source="embedded:wiki,bible", tokenizer="bpe:2048"))
cases = [("hc", "search_spaces/reference/hc.yaml", None, {}),
         ("hyperloop", "search_spaces/reference/hyperloop.yaml", "1M", {})]
specs = {}
for fam, path, budget, fixed in cases:
    space = load_space(path, [Override.flag("budget", "budget", budget)] if budget else [])
    cand = resolve(space, reference_values(space, fam, fixed))
    specs[fam] = (cand.solution.spec, space.trial_training)
    print(fam, cand.solution.spec.structure(), cand.solution.spec.d_model, flush=True)
losses = {}
for seed in range(5):
    for fam, (spec, training) in specs.items():
        for sd in ("bf16", "fp32"):
            if time.time() > deadline:
                break
            cfg = TrainConfig.from_dict({**training, "seed": seed, "compile": False})
            t = time.time()
            row = run_trial(with_streams(spec, sd), cfg, data=data, quantize=None)
            rec = {"family": fam, "stream_dtype": sd, "row_stream_dtype": row.get("stream_dtype"), "seed": seed,
                   "val_loss": row.get("val_loss"), "status": row["status"], "precision": row.get("precision"),
                   "tokens_per_s": row.get("tokens_per_s"), "wall_s": time.time() - t}
            out.write(json.dumps(rec) + "\n"); out.flush()
            print(rec, flush=True)
            losses[(fam, sd, seed)] = row.get("val_loss")
for fam in specs:
    seeds = [s for s in range(5) if (fam, "bf16", s) in losses and (fam, "fp32", s) in losses]
    d = np.array([losses[(fam, "bf16", s)] - losses[(fam, "fp32", s)] for s in seeds], dtype=float)
    if len(d) >= 2:
        half = stats.t.ppf(0.975, len(d) - 1) * d.std(ddof=1) / np.sqrt(len(d))
        print(f"{fam}: bf16 - fp32 streams val_loss {d.mean():+.4f} [{d.mean() - half:+.4f}, {d.mean() + half:+.4f}] "
              f"over {len(d)} paired seeds; per seed {np.round(d, 4).tolist()}", flush=True)
