"""Synthetic studies the leaderboard tests read (imported as `synthetic_studies`: pytest puts tests/
on the path): trials at realistic magnitudes, every family, seeds and failures, written the way the
results store writes them."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from benchmark import ArchSpec

# --- a synthetic study: realistic magnitudes, every family, seeds, failures ------------------------

# (layers, loops, extra spec keys) per family, after the presets the seed papers describe.
LAYOUTS = {
    "transformer": ({"begin": 8}, 1, {}),
    "looped": ({"begin": 2, "middle": 4, "end": 2}, 3, {}),
    "hyperloop": (
        {"begin": 2, "middle": 4, "end": 2},
        3,
        {
            "hyper": {
                "streams": 4,
                "every": "loop",
                "mixing": "diagonal",
                "read": "block",
                "init": "home",
            }
        },
    ),
    "mhc": ({"begin": 8}, 1, {"hyper": {"streams": 4, "every": "sublayer", "mixing": "sinkhorn"}}),
    "hc": ({"begin": 8}, 1, {"hyper": {"streams": 4, "every": "sublayer", "mixing": "dynamic"}}),
    "abbie-c": ({"begin": 2, "middle": 4, "end": 2}, 2, {"eval_loops": [1, 2, 4, 8]}),
    "abbie-d": ({"begin": 2, "middle": 4, "end": 2}, 2, {"eval_loops": [1, 2, 4, 8]}),
    "depth": ({"begin": 2, "middle": 4, "end": 2}, 2, {"eval_loops": [1, 2, 4, 8]}),
    "lora-looped": ({"begin": 2, "middle": 4, "end": 2}, 3, {"lora_rank": 16}),
}
# Perplexity relative to a Transformer of the same budget, and its shape over test-time loops
# (AbbIE Fig. 6: AbbIE-D is flat past its training depth, Depth collapses).
QUALITY = {
    "transformer": 1.00,
    "looped": 1.03,
    "hyperloop": 0.98,
    "mhc": 0.99,
    "hc": 0.995,
    "abbie-c": 1.04,
    "abbie-d": 1.01,
    "depth": 1.06,
    "lora-looped": 1.02,
}
BY_LOOPS = {
    "abbie-c": {1: 1.4, 2: 1.0, 4: 1.08, 8: 1.25},
    "abbie-d": {1: 1.25, 2: 1.0, 4: 0.99, 8: 1.0},
    "depth": {1: 2.1, 2: 1.0, 4: 1.9, 8: 3.4},
    "looped": {1: 1.6, 2: 1.12, 3: 1.0, 4: 1.01},
    "hyperloop": {1: 1.5, 2: 1.1, 3: 1.0, 4: 0.995},
    "lora-looped": {1: 1.55, 2: 1.1, 3: 1.0, 4: 1.02},
}
STATUS_P = {"ok": 0.87, "failed": 0.07, "diverged": 0.04, "pruned": 0.02}
NAN_WHEN_BAD = ["val_loss", "val_ppl", "val_ppl_int4", "tokens_per_s", "val_ppl_by_loops"]


def synthetic_trials(
    study="demo", shapes=3, seeds=3, budgets=(30e6, 113e6), seed=0, vary_loops=(), statuses=STATUS_P
) -> pd.DataFrame:
    """One row per trial. `shapes` candidates per family and budget, each run under `seeds` seeds;
    `vary_loops` lists training loop counts to sweep for looped and hyperloop (Hyperloop Fig. 2)."""
    rng = np.random.default_rng(seed)
    rows = []
    for grow, budget in enumerate(budgets):
        for family, (layers, loops, extra) in LAYOUTS.items():
            # Bigger budgets go deeper: two more middle (or plain) layers per step up.
            deeper = "middle" if "middle" in layers else "begin"
            layers = {**layers, deeper: layers[deeper] + 2 * grow}
            loop_counts = (
                vary_loops if vary_loops and family in ("looped", "hyperloop") else (loops,)
            )
            for shape in range(shapes):
                d_model = int(64 * round(math.sqrt(budget / 400) / 64)) + 64 * (shape % 8)
                base = _spec(family, layers, d_model, shape, extra)
                quality = QUALITY[family] * (1 + rng.uniform(-0.03, 0.03))
                for n_loops in loop_counts:
                    # Resolved through ArchSpec, as the results store writes it.
                    spec = json.loads(ArchSpec.from_dict({**base, "loops": n_loops}).to_json())
                    loop_gain = (n_loops / loops) ** -0.04 if len(loop_counts) > 1 else 1.0
                    rows += _seed_rows(
                        rng, study, spec, budget, quality * loop_gain, seeds, statuses
                    )
    return pd.DataFrame(rows)


def _spec(family, layers, d_model, shape, extra):
    hourglass = (
        family == "transformer" and shape % 2 == 1
    )  # some Transformers use the hourglass FFN
    ffn = (
        {"kind": "hourglass", "K": 4, "d_h": d_model // 2}
        if hourglass
        else {"kind": "swiglu", "d_ff": int(2.75 * d_model) + 16 * (shape // 8)}
    )  # many shapes: distinct widths
    return {
        "family": family,
        "d_model": d_model,
        "n_heads": d_model // 64,
        "layers": layers,
        "ffn": ffn,
        **extra,
    }


def _seed_rows(rng, study, spec, budget, quality, seeds, statuses):
    params = budget * (1 + rng.uniform(-0.004, 0.004))
    non_emb = params - 32000 * spec["d_model"]
    attention = non_emb * rng.uniform(0.2, 0.45)
    lay = spec["layers"]
    depth = lay["begin"] + lay["middle"] * spec["loops"] + lay["end"]
    flops = 6 * non_emb * depth / sum(lay.values())
    rows = []
    for s in range(seeds):
        status = rng.choice(list(statuses), p=list(statuses.values()))
        ppl = (22.0 if budget > 5e7 else 32.0) * quality * (1 + rng.normal(0, 0.004))
        curve = BY_LOOPS.get(spec["family"])
        start = pd.Timestamp("2026-03-01T09:00:00Z") + pd.Timedelta(
            minutes=int(rng.integers(0, 5000))
        )
        row = {
            "study": study,
            "trial_id": f"{study}-{len(rows)}-{rng.integers(1 << 40):010x}",
            "status": status,
            "error": None
            if status == "ok"
            else f"{status}: RuntimeError: loss is NaN at step 812\ntraceback...",
            "family": spec["family"],
            "spec": json.dumps(spec, sort_keys=True),
            "params_total": params,
            "params_non_embedding": non_emb,
            "params_attention": attention,
            "params_ffn": non_emb - attention,
            "flops_per_token_train": flops,
            "flops_per_token_infer": flops / 3,
            "tokens_trained": 20 * params,
            "val_loss": math.log(ppl),
            "val_ppl": ppl,
            "val_ppl_int4": ppl * (1 + rng.uniform(0.005, 0.03)),
            "int4_bytes": params / 2 + 4e5,
            "tokens_per_s": 4e12 / flops * rng.uniform(0.85, 1.0),
            "peak_mem_bytes": 18 * params,
            "wall_s": 20 * params / 4e4,
            "seed": s,
            "dataset_id": "fineweb-edu-sample-10BT@v1",
            "tokenizer_id": "bpe-32k@v1",
            "code_version": "3f2c1ab",
            "started_at": start.isoformat(),
            "finished_at": (start + pd.Timedelta(hours=2)).isoformat(),
            "budget": budget,
            "budget_distance": params / budget - 1,
            "val_ppl_by_loops": json.dumps({str(k): ppl * v for k, v in curve.items()})
            if curve
            else None,
        }
        if "hyper" in spec:  # analysis.hyper_diagnostics, at magnitudes seen in tiny trained models
            row.update(
                {
                    "stream_cosine": rng.uniform(0.9, 0.999),
                    "hres_deviation": rng.uniform(0.05, 0.15),
                    "gate_saturation": rng.uniform(0, 0.05),
                    "loop_emb_norm": rng.uniform(0.1, 0.2)
                    if spec["family"] == "hyperloop"
                    else None,
                }
            )
        if status != "ok":
            row.update({k: None if k == "val_ppl_by_loops" else float("nan") for k in NAN_WHEN_BAD})
        rows.append(row)
    return rows


def write_study(root: Path, trials: pd.DataFrame, rows_per_file=1) -> Path:
    """Writes trials the way the results store does: one Parquet file per chunk under
    <root>/<study>/trials/, plus a half-written temporary file that readers must skip."""
    folder = root / trials["study"].iloc[0] / "trials"
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(0, len(trials), rows_per_file):
        trials.iloc[i : i + rows_per_file].to_parquet(folder / f"{i:07d}.parquet", index=False)
    (folder / ".tmp-partial.parquet").write_bytes(b"PAR1 half a file")
    return folder.parent


def seed_rows(study: str, losses: dict[str, list[float]], **spec) -> pd.DataFrame:
    """A claims test's study as the search writes it: per family, one `ok` row per seed with the
    given validation loss, at one shape (`spec` added to each family's), 1.5M parameters."""
    out = []
    for family, per_seed in losses.items():
        family_spec = {
            "family": family,
            "d_model": 96,
            "layers": {"begin": 1, "middle": 2, "end": 1},
            **spec,
        }
        for seed, loss in enumerate(per_seed):
            out.append(
                {
                    "study": study,
                    "trial_id": f"{family}-s{seed}",
                    "status": "ok",
                    "family": family,
                    "spec": json.dumps(family_spec),
                    "seed": seed,
                    "val_loss": loss,
                    "val_ppl": math.exp(loss),
                    "params_total": 1_500_000,
                    "budget": 1_500_000,
                    "tokens_trained": 800_768,
                }
            )
    return pd.DataFrame(out)
