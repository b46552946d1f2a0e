"""docs/reference.md, generated: every architecture-spec key, family preset, search-space key,
training setting, results column and metric, with the type, default and allowed values read off
the dataclasses, the space language, the results schema and the metric registry. Only the one-line
meaning of each key is written here; everything else comes from the code, so the page cannot
drift from it (tests/test_docs.py fails when docs/reference.md is stale or a key has no meaning).

    python -m benchmark.docs_reference          # rewrites docs/reference.md
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from benchmark.arch import PRESETS, SPEC_KEYS, Key, keys
from benchmark.recipe import DataSettings, QuantizeConfig, TrainConfig
from benchmark.space import SHAPE_KEYS, TOP_KEYS
from benchmark.store import METRICS, SCHEMA, SCHEMA_VERSION

PAGE = Path(__file__).resolve().parent.parent / "docs" / "reference.md"

# ---- the meaning of each key: one line, written here and nowhere else ----------------------

SPEC_NOTES = {
    "family": "a paper's preset (the table below); explicit keys override it",
    "vocab_size": "tokens in the vocabulary (the tokenizer's size)",
    "d_model": "residual width; usually the dimension the budget solver sets",
    "n_heads": "attention heads",
    "n_kv_heads": "key/value heads; fewer than `n_heads` is grouped-query attention (default: `n_heads`)",
    "head_dim": "width of one head (default: `d_model / n_heads`); must be even for RoPE",
    "tie_embeddings": "share the token embedding with the LM head",
    "rope_theta": "RoPE base",
    "norm_eps": "RMSNorm epsilon",
    "ffn": "the feed-forward section",
    "ffn.kind": "`swiglu` (narrow-wide-narrow) or `hourglass` (K residual SwiGLU sub-blocks, wide-narrow-wide)",
    "ffn.d_ff": "SwiGLU hidden width (default: `ffn.ratio` x `d_model`)",
    "ffn.ratio": "SwiGLU width over `d_model` (2.75 when neither is given: Hyperloop App. A)",
    "ffn.K": "hourglass sub-blocks per FFN (shape paper eq. 3-5); 1 for SwiGLU",
    "ffn.d_h": "hourglass bottleneck width (default: `ffn.dh_ratio` x `d_model`)",
    "ffn.dh_ratio": "hourglass bottleneck over `d_model` (0.4 when neither is given: shape paper Fig. 3)",
    "ffn.multiple_of": "round derived FFN widths to a multiple of this",
    "layers": "the middle-cycle split; `layers: 12` is a plain stack of 12",
    "layers.begin": "layers before the looped block (all layers of a plain Transformer)",
    "layers.middle": "layers of the block that loops (Hyperloop §2.1; AbbIE's body)",
    "layers.end": "layers after the looped block",
    "layers.n": "shorthand for a plain stack: `layers.begin` = n",
    "loops": "times the middle block runs in training",
    "eval_loops": "loop counts evaluated at test time (AbbIE: 1, 2, 4, 8)",
    "injection": "how each loop sees its input: `none` h = B(h); `residual` h = B(h) + h (AbbIE-D); "
    "`concat` h = B(W[e; h]) (Depth); `hyper` (Hyperloop)",
    "loop_residual_from": "AbbIE-D: first iteration that adds h after the block (eq. 4 has 0)",
    "hyper": "hyper-connections; absent or null: one ordinary residual stream",
    "hyper.streams": "n parallel residual streams",
    "hyper.every": "where connections sit: `sublayer` (HC, mHC), `layer`, every k layers, or `loop` (Hyperloop)",
    "hyper.mixing": "H_res: `identity`, `diagonal` (Hyperloop), `sinkhorn` (mHC), `static` / `dynamic` (HC)",
    "hyper.sinkhorn_iters": "Sinkhorn iterations of mHC's H_res (mHC eq. 9)",
    "hyper.loop_embedding": "Hyperloop's per-loop embedding e_l (eq. 3)",
    "hyper.tanh": "HC's tanh on the dynamic part; false gives the paper's \"W/O tanh\" rows",
    "hyper.read": "a whole-layer span adds `block` F(u) (Hyperloop eq. 3 as written) or `delta` F(u) - u",
    "hyper.stream_dtype": "storage precision of the n streams: `auto` is bf16 under bf16 autocast on CUDA "
    "(mHC eq. 10-19), fp32 elsewhere",
    "hyper.init": "`home` breaks the streams' symmetry as the public implementations do; `symmetric` is the ablation",
    "lora_rank": "per-loop LoRA rank on the looped layers (relaxed recursive baseline); 0 = none",
}

SHAPE_NOTES = {
    "shape.layers": "unique layers, split by `shape.middle_frac` for looped families",
    "shape.middle_frac": "fraction of the unique layers in the looped block",
    "shape.unrolled_layers": "layers run per token: a Transformer gets them all, a looped model fewer unique ones",
    "shape.d_model_per_layer": "width over depth (the shape paper's aspect ratio)",
    "shape.head_dim": "head width; n_heads follows from the solved d_model",
}

SPACE_NOTES = {
    "name": "the study's name (results folder, Optuna study)",
    "description": "one line shown in plans and leaderboards",
    "budget": "the parameter budget (`113M`), or a ladder `[0.5M, 1M, 2M]`; `--budget` overrides",
    "count": "what the budget counts: `total`, `non_embedding` or `non_embedding_head` (docs/search-spaces.md); "
    "`--count` overrides",
    "tolerance": "allowed distance of each candidate from the budget (`0.5%` or 0.005); under `solve: none`, "
    "of the anchor alone",
    "solve": "the free dimension solved to meet the budget: `d_model`, `ffn.d_ff`, `ffn.d_h` or `ffn`; or "
    "`none` (with an `anchor`): every candidate keeps the anchor's d_model, heads and FFN width and "
    "its own parameter count",
    "align": "hardware-friendly multiples: `{d_model: 64, ffn: 64, head_dim: 8}`",
    "anchor": "a spec fragment solved once; every candidate keeps its d_model (solve another dimension, or "
    "`solve: none` for its whole shape)",
    "base": "a fixed spec fragment every candidate starts from",
    "variants": "named spec fragments, decided as the first axis `variant`",
    "axes": "dotted spec or `shape.*` keys -> domains (`[a, b]`, `{int: [lo, hi]}`, `{float: ...}`, "
    '`{choice: ..., when: "..."}`), decided in file order',
    "training": "training settings (the TrainConfig table below)",
    "quantize": "quantisation settings (the QuantizeConfig table below)",
    "data": "data settings (the DataSettings table below); the corpus and tokenizer are `--data` and `--tokenizer`",
    "objectives": "metrics of the registry with `:min` / `:max`, e.g. `[val_loss:min, flops_per_token_train:min]`",
    "trials": "candidates to sample; `--trials` overrides",
    "seeds": "seeds per candidate; `--seeds` overrides",
    "pruner": "`asha` (default: successive halving over tokens, with one objective measured in training) or "
    "`none` (every trial trains to its end: a study of claims)",
    "diverged": "what a final seed that diverged counts as in its candidate's value: `worst` (default: a "
    "uniform guess, loss ln V and perplexity V) or `fail` (the candidate fails)",
    "controlled": "`true`: the shape held, not preferred (a claim's arms): `shape.head_dim` exact (n_heads = "
    "d_model / head_dim), an FFN ratio the space gives exact, 2 heads or more; with an `anchor` "
    "and `solve: ffn`, the FFN width is the one dimension that differs",
    "tune": "each candidate tuned with an equal budget: `{grid: {lr: [1e-3, 3e-3]}, seeds: [100, 101], metric: "
    "val_loss, margin: noise, ties: middle, extend: {lr: [3e-4, 3e-2]}}` trains every grid point on the "
    "tuning seeds, ties the points within the margin of the best, extends an edge choice, then trains the "
    "final seeds at the chosen point (docs/search-spaces.md#tuning); needs `pruner: none`",
}

TRAINING_NOTES = {
    "tokens": "training tokens: absolute (`5M`) or per parameter (`20x`)",
    "tokens_per": "which parameter count `Nx` multiplies (in a search space: the budget's `count` unless given; `budget`: the declared budget, the same tokens for every candidate of that budget)",
    "seq_len": "tokens per sequence",
    "batch_size": "sequences per micro-batch",
    "grad_accum": "micro-batches per optimiser step",
    "lr": "peak learning rate",
    "min_lr": "end of the decay (default: lr / 10, Hyperloop App. A)",
    "schedule": "`cosine`, or `wsd` warmup-stable-decay (AbbIE §3.2)",
    "warmup": "a fraction of the steps (< 1) or a number of steps (>= 1)",
    "decay": "`wsd`: fraction of the steps in the final decay",
    "weight_decay": "AdamW weight decay on the matrices that decay (docs/architectures.md)",
    "beta1": "AdamW beta1",
    "beta2": "AdamW beta2",
    "grad_clip": "max gradient norm; 0 turns clipping off",
    "eval_every": "steps between evaluations (ASHA's rungs); 0: `val_points` of them",
    "val_points": "held-out evaluations spread evenly over the run when `eval_every` is 0, besides the final one "
    "(the row's `evals`, the curve's validation points)",
    "eval_tokens": "held-out tokens per source",
    "precision": "`auto` (bf16 where it is faster), `bf16` or `fp32`",
    "compile": "compile by regions (false: eager)",
    "seed": "the seed of weights and batches",
    "device": "`auto`, `cpu`, `cuda`, `cuda:1`, ...",
}

QUANTIZE_NOTES = {
    "group_size": "input columns per quantisation group (GPTQ §5 and Hyperloop §4: 128)",
    "calib_sequences": "training-split windows of `seq_len` tokens for GPTQ's Hessians (Hyperloop §4: 1024)",
}

DATA_NOTES = {
    "max_docs": "documents read from each part of the source; null: the whole split (an `hf:` "
    "dataset to its end)",
    "max_epochs": "the most passes a run may make over any part of the corpus; a plan and a search "
    "refuse more in one line (4: Muennighoff et al. 2023; the papers train one pass)",
    "sampling": "`permutation`: each part's windows without replacement within a pass, a per-seed "
    "order; `replacement`: random starts (studies begun before keep it)",
}

# Columns that are not metrics of the registry (a metric's column is described by the metric).
COLUMN_NOTES = {
    "schema_version": f"the row's schema version ({SCHEMA_VERSION} today; older files still read)",
    "study": "the study's name",
    "trial_id": "the trial's id within the study (one per candidate and seed)",
    "attempt": "retry number of this trial (a failure is retried once)",
    "status": "`ok`, `failed`, `pruned`, `diverged` or `infeasible`",
    "error": "the error line of a failed or infeasible trial",
    "family": "the spec's family",
    "structure": "layers in Hyperloop Table 1's notation, e.g. `2L→4L(×3)→2L`",
    "spec": "the fully resolved ArchSpec (JSON)",
    "training": "the TrainConfig it trained with (JSON)",
    "quantize": "the quantisation settings it ran with (JSON)",
    "axes": "the sampled axis values (JSON)",
    "budget_count": "what the budget counted (`total`, `non_embedding`, `non_embedding_head`)",
    "train_loss": "training loss at the end",
    "val_ppl_unigram": "perplexity of the training unigram distribution on the same held-out text (a floor to beat)",
    "val_loss_by_source": "validation loss per corpus part (JSON)",
    "tokens_by_source": "tokens of each corpus part in the training split (JSON)",
    "epochs_by_source": "passes the run made over each corpus part: its share of the tokens trained over the part's tokens (JSON)",
    "sampling": "how training batches drew their windows: permutation (without replacement within a pass) or replacement",
    "val_ppl_by_loops": "validation perplexity per evaluated loop count (JSON)",
    "evals": "evaluations during training: step, tokens trained and losses (JSON); the validation points of the "
    "curve (`<study>/_curves/`, store/curves.py)",
    "loss_spike": "the largest rise of the training loss above its best so far, nats (every step's loss; the "
    "claims' instability rule reads it)",
    "resumed_from_step": "the step the run last continued from after it was stopped (a lost worker, "
    "Ctrl-C, `--time-budget`), from the state it saved (`--checkpoint-every`); 0: it never stopped",
    "resumes": "how many times the run continued from a saved state",
    "stalls": "how many times the watchdog ended the run for making no step (`--step-timeout`); "
    "each time it continued from its last save",
    "phase": "a tuned study's row: `tune` (a run of the `tune:` grid, never ranked or judged) or `final`",
    "tuned": "the training settings the `tune:` grid set for this row (JSON): a tuning run's point, or the "
    "point a final row's candidate chose",
    "bf16_bytes": "model size at bf16",
    "flops_per_s": "achieved training FLOP/s",
    "precision": "what the steps ran in: `bf16`, `fp32`, `fp32+tf32`",
    "stream_dtype": "what a hyper-connected model's n streams were stored in: `bf16` or `fp32` (`hyper.stream_dtype`); null without streams",
    "world_size": "ranks that trained the trial (1: one process; docs/clusters.md)",
    "parallel": "how the ranks shared the model: `none`, `ddp` or `fsdp`",
    "backend": "torch.distributed backend of a data-parallel trial: `gloo` or `nccl`",
    "rank_batch_size": "sequences in each rank's micro-batch",
    "rank_grad_accum": "micro-batches each rank runs per optimiser step",
    "oom_retries": "times an out-of-memory error retried the run at half the micro-batch and twice the accumulation",
    "peak_mem_bytes_by_rank": "each rank's peak memory, bytes (JSON list; `peak_mem_bytes` is their max)",
    "seed": "the trial's seed",
    "optuna_trial": "the Optuna trial number",
    "node_id": "the Ray node that ran the trial",
    "dataset_id": "corpus id with its fingerprint",
    "tokenizer_id": "tokenizer id with its fingerprint",
    "code_version": "git commit of the code (with `+dirty` when changed)",
    "packages": "versions of the packages that matter (JSON)",
    "hardware": "CPU (model; on x86 its family, model and widest vector instructions), cores, torch threads, GPUs (and `Triton HC kernels` where SHAPEBENCH_HC_KERNELS=triton ran them)",
    "started_at": "start, UTC (ISO 8601)",
    "finished_at": "end, UTC (ISO 8601)",
    "extra": "columns a caller added beyond the schema (JSON)",
}


def note_problems() -> list[str]:
    """Keys without a meaning here, and meanings of keys that no longer exist."""
    wanted = {
        "SPEC_NOTES": (SPEC_KEYS, SPEC_NOTES),
        "SHAPE_NOTES": (SHAPE_KEYS, SHAPE_NOTES),
        "SPACE_NOTES": (TOP_KEYS, SPACE_NOTES),
        "TRAINING_NOTES": (keys(TrainConfig), TRAINING_NOTES),
        "QUANTIZE_NOTES": (keys(QuantizeConfig), QUANTIZE_NOTES),
        "DATA_NOTES": (keys(DataSettings), DATA_NOTES),
        "COLUMN_NOTES": (_plain_columns(), COLUMN_NOTES),
    }
    out = []
    for table, (names, notes) in wanted.items():
        out += [
            f"{name}: no meaning in {table} (benchmark/docs_reference.py)"
            for name in names
            if name not in notes
        ]
        out += [f"{name}: in {table} but not a key any more" for name in notes if name not in names]
    return out


def _plain_columns() -> list[str]:
    metric_columns = {m.column for m in METRICS}
    return [name for name in SCHEMA.names if name not in metric_columns]


# ---- rendering -----------------------------------------------------------------------------


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _table(header: tuple[str, ...], rows: list[tuple]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _type(key: Key) -> str:
    if key.section:
        return "section"
    names = {"list": "list of int", "parsed": " or ".join(t.__name__ for t in key.types)}
    return names.get(key.kind, key.kind if key.kind != "enum" else "choice")


def _allowed(key: Key) -> str:
    parts = []
    if key.choices:
        parts.append(
            " | ".join(f"`{c}`" for c in key.choices)
            + (" or an integer" if int in key.types else "")
        )
    lo = key.above if key.above is not None else key.at_least
    if lo is not None and key.at_most is not None:
        parts.append(f"{'(' if key.above is not None else '['}{lo:g}, {key.at_most:g}]")
    elif lo is not None:
        parts.append(f"{'>' if key.above is not None else '>='} {lo:g}")
    if key.nullable:
        parts.append("null")
    return ", ".join(parts)


def _default(key: Key) -> str:
    if key.section:
        return ""
    if key.default is None:
        return "derived" if key.nullable else "—"
    value = list(key.default) if isinstance(key.default, tuple) else key.default
    return f"`{json.dumps(value) if not isinstance(value, str) else value}`"


def _keys_table(rules: dict[str, Key], notes: dict[str, str]) -> str:
    return _table(
        ("key", "type", "default", "allowed", "meaning"),
        [
            (f"`{name}`", _type(k), _default(k), _allowed(k), notes.get(name, "—"))
            for name, k in rules.items()
        ],
    )


def _presets() -> str:
    return _table(
        ("family", "keys it sets"),
        [
            (f"`{family}`", f"`{json.dumps(preset)}`" if preset else "(the defaults)")
            for family, preset in PRESETS.items()
        ],
    )


def _columns() -> str:
    by_column = {m.column.format(count="total"): m for m in METRICS if "{" not in m.column}
    rows = []
    for field in SCHEMA:
        m = by_column.get(field.name)
        meaning = COLUMN_NOTES.get(field.name, "—") if m is None else m.axis_label()
        rows.append(
            (f"`{field.name}`", str(field.type), meaning, f"metric `{m.name}`" if m else "")
        )
    return _table(("column", "type", "meaning", "registry"), rows)


def _metrics() -> str:
    return _table(
        ("metric", "column", "direction", "kind", "objective", "unit", "aliases"),
        [
            (
                f"`{m.name}`",
                f"`{m.column}`",
                m.direction,
                m.kind,
                "yes" if m.searchable else "no",
                m.unit,
                ", ".join(f"`{a}`" for a in m.aliases),
            )
            for m in METRICS
        ],
    )


def render() -> str:
    return (
        "\n\n".join(
            [
                "# Reference: spec keys, space keys, training settings, results columns, metrics",
                "<!-- generated by `python -m benchmark.docs_reference`; edit the code, not this page -->",
                "Generated from the code: `ArchSpec` (benchmark/arch/spec.py), the presets "
                "(benchmark/arch/presets.py), the space language (benchmark/space/language.py, shape.py), "
                "`TrainConfig` (benchmark/recipe/settings.py), the results schema (benchmark/store/results.py) and "
                "the metric registry (benchmark/store/metrics.py). `derived`: left unset, the value follows "
                "from the others. How the pieces fit: [architectures](architectures.md), "
                "[search spaces](search-spaces.md), [searches and results](searches-and-results.md).",
                "## Architecture spec keys",
                "A spec is a mapping (YAML or dict) validated by `ArchSpec.from_dict`; a search space names "
                'the same keys dotted (`hyper.streams`). Unknown keys are an error with a "did you mean".',
                _keys_table(SPEC_KEYS, SPEC_NOTES),
                "## Family presets",
                "`family` fills these keys before the spec's own keys override them.",
                _presets(),
                "## Search-space keys",
                "The top level of a space file:",
                _table(("key", "meaning"), [(f"`{k}`", SPACE_NOTES.get(k, "—")) for k in TOP_KEYS]),
                "Derived shape axes (`axes:` keys under `shape.`), turned into spec keys by the space:",
                _keys_table(SHAPE_KEYS, SHAPE_NOTES),
                "## Training settings (`training:`)",
                _keys_table(keys(TrainConfig), TRAINING_NOTES),
                "## Quantisation settings (`quantize:`)",
                _keys_table(keys(QuantizeConfig), QUANTIZE_NOTES),
                "## Data settings (`data:`)",
                "Set in the space or with `--set data.max_epochs=8`; a study records `max_docs` and "
                "`sampling` in its declaration.",
                _keys_table(keys(DataSettings), DATA_NOTES),
                "## Results columns",
                f"Schema version {SCHEMA_VERSION}. One row per trial attempt, one Parquet file each: "
                '`pandas.read_parquet("results/<study>")`.',
                _columns(),
                "## Metrics",
                "What `objectives:`, `shapebench board --x/--y/--objectives` and claims may name. `params` reads "
                "the column of the study's count rule. Only `quality` and `cost` metrics are objectives.",
                _metrics(),
            ]
        )
        + "\n"
    )


def main(argv: list[str] | None = None) -> int:
    problems = note_problems()
    for line in problems:
        print(f"warning: {line}", file=sys.stderr)
    PAGE.write_text(render(), encoding="utf-8")
    print(f"wrote {PAGE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
