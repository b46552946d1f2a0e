"""The unit every search runs: a spec plus training settings in, a row of measurements out."""

from __future__ import annotations

import contextlib
import datetime as dt
import gc
import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Mapping

import torch

from benchmark.arch import ArchSpec, count_flops, count_params
from benchmark.data import (
    DataConfig,
    PreparedData,
    batches,
    cache_root,
    eval_sets,
    passes,
    prepare,
)
from benchmark.models import kernels
from benchmark.models.hyper import stream_record
from benchmark.recipe import QuantizeConfig, TrainConfig, settings_json
from benchmark.store import (
    LOOP_COUNTS,
    code_version,
    count_columns,
    hardware,
    loop_loss,
    package_versions,
    speeds,
)
from benchmark.store.curves import KEY as CURVE
from benchmark.trial.analysis import hyper_diagnostics
from benchmark.trial.checkpoint import save_checkpoint
from benchmark.trial.evaluate import evaluate, evaluate_loops, unigram_perplexity
from benchmark.trial.quant import QuantConfig, calibrate, quantize
from benchmark.trial.runstate import RunState
from benchmark.trial.training import TrialDiverged, train


def now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def row_hardware() -> str:
    """The `hardware` a run trained in this process records: the store's description with whether
    its hyper-connections take the Triton kernels (search/reuse.py keys a planned run by it)."""
    return hardware(kernels.in_use())


def check_vocab(spec: ArchSpec, data: PreparedData) -> None:
    """The embedding must cover every token id; a larger (padded) vocabulary is allowed."""
    if spec.vocab_size < data.tokenizer.vocab_size:
        raise ValueError(
            f"vocab_size: the spec has {spec.vocab_size} but tokenizer "
            f"{data.tokenizer.tokenizer_id} has {data.tokenizer.vocab_size}; "
            f"set vocab_size: {data.tokenizer.vocab_size} or choose another tokenizer"
        )


def describe(spec: ArchSpec, cfg: TrainConfig) -> dict[str, Any]:
    """The columns known before training: identity, shape and cost."""
    params = count_params(spec)
    flops = count_flops(spec, cfg.seq_len)
    return {
        "family": spec.family,
        "spec": spec.to_json(),
        "structure": spec.structure(),
        **count_columns(params),
        "params_attention": params["attention"],
        "params_ffn": params["ffn"],
        "flops_per_token_train": flops["train"],
        "flops_per_token_infer": flops["infer"],
        "training": settings_json(cfg),
        "seed": cfg.seed,
    }


DIAGNOSTIC_SEQUENCES = 8


def diagnostic_tokens(evals: Mapping[str, torch.Tensor], model) -> torch.Tensor:
    """The held-out windows the diagnostics read: the first few of each source, as inputs."""
    per = max(1, DIAGNOSTIC_SEQUENCES // len(evals))
    x = torch.cat([w[:per, :-1] for w in evals.values()])
    return x.to(next(model.parameters()).device)


def loop_columns(by_loops: Mapping[int, dict]) -> dict[str, Any]:
    """The evaluations at each loop count as columns: val_ppl_by_loops holds every count evaluated
    (as the loop-scaling plot reads it), and each of the registry's LOOP_COUNTS evaluated is its
    own metric (val_loss_r4); a count the spec did not evaluate is null."""
    curve = json.dumps({r: e["val_ppl"] for r, e in by_loops.items()}) if by_loops else None
    return {
        "val_ppl_by_loops": curve,
        **{loop_loss(r): by_loops[r]["val_loss"] if r in by_loops else None for r in LOOP_COUNTS},
    }


CALIB_BATCH = 8  # calibration sequences per forward pass


def calibration(data: PreparedData, cfg: TrainConfig, sequences: int) -> list[torch.Tensor]:
    """`sequences` windows of seq_len tokens of the training split, drawn as one batch so that its
    parts follow the training mixture (another seed than training's), in forward passes of
    CALIB_BATCH: GPTQ calibrates on training text (Hyperloop §4: FineWeb-Edu, its training corpus)."""
    x, _ = next(  # (sequences, seq_len)
        batches(data.train, cfg.seq_len, sequences, cfg.seed + 1, sampling=data.sampling)
    )
    return list(x.split(CALIB_BATCH))


def data_columns(data: PreparedData, tokens: int) -> dict[str, Any]:
    """The data a run of `tokens` training tokens read: each part's tokens in the training split,
    the passes it made over each (sampling.passes) and how its batches drew."""
    sizes = {name: len(data.train.part(name)) for name in data.train.weights}
    epochs = {name: round(p, 4) for name, p in passes(tokens, data.train.weights, sizes).items()}
    return {
        "tokens_by_source": json.dumps(sizes),
        "epochs_by_source": json.dumps(epochs),
        "sampling": data.sampling,
    }


def quantized_columns(
    model, evals, data: PreparedData, cfg: TrainConfig, quant: QuantizeConfig, ppl: float
) -> dict[str, Any]:
    """Post-training weight quantisation: INT8 and INT4 with GPTQ (loop-aware Hessians), INT4 with
    round-to-nearest; perplexity of each on the held-out set, the model size at each precision, and
    what INT4 costs: the perplexity it adds over full precision (`ppl`), relative."""
    hessians = calibrate(
        model, calibration(data, cfg, quant.calib_sequences)
    )  # once for both GPTQ widths
    out: dict[str, Any] = {"quantize": settings_json(quant)}
    for bits, method, col in ((8, "gptq", "int8"), (4, "gptq", "int4"), (4, "rtn", "int4_rtn")):
        qcfg = QuantConfig(bits=bits, method=method, group_size=quant.group_size)
        qmodel, report = quantize(model, qcfg, hessians=hessians)
        out[f"val_ppl_{col}"] = evaluate(qmodel, evals, cfg)["val_ppl"]
        if method == "gptq":
            out[f"{col}_bytes"] = report.bytes
            out["bf16_bytes"] = report.bytes_bf16
    out["int4_ppl_increase"] = out["val_ppl_int4"] / ppl - 1
    out["int4_rtn_ppl_increase"] = out["val_ppl_int4_rtn"] / ppl - 1
    return out


def run_trial(
    spec: ArchSpec | Mapping[str, Any],
    cfg: TrainConfig,
    data_cfg: DataConfig | None = None,
    *,
    data: PreparedData | None = None,
    checkpoint_dir: str | Path | None = None,
    on_step: Callable[[int, int, float], None] | None = None,
    on_eval: Callable[[dict], None] | None = None,
    quantize: QuantizeConfig | None = QuantizeConfig(),
    ranks=None,
    on_point: Callable[[dict], None] | None = None,
    state: RunState | None = None,
) -> dict[str, Any]:
    """Train and evaluate one candidate. Returns one results row (docs/reference.md "Results columns"); a NaN/inf
    loss gives status `diverged` instead of raising. `quantize` (a space's `quantize:` section)
    adds the INT8/INT4 columns; None (or False) leaves them out. `ranks`: one rank of a
    data-parallel trial (trial/distributed.py); rank 0 evaluates and returns the row, the other
    ranks train and return {}. The row's `curve` (curve.Curve's points; `on_point` gets each as it
    is made) is no results column: the search writes it beside the row (store/curves.py).
    `state` (trial/runstate.py): the run saves its whole state there as it trains, and continues
    from a state saved earlier (the row's `resumed_from_step` and `resumes` say so)."""
    spec = spec if isinstance(spec, ArchSpec) else ArchSpec.from_dict(spec)
    data = data or prepare(data_cfg or DataConfig())
    check_vocab(spec, data)
    row = {
        **describe(spec, cfg),
        "status": "ok",
        "error": None,
        "started_at": now(),
        "dataset_id": data.dataset_id,
        "tokenizer_id": data.tokenizer.tokenizer_id,
        "code_version": code_version(),
        "packages": json.dumps(package_versions()),
        "hardware": row_hardware(),
    }
    evals = eval_sets(data.val, cfg.seq_len, cfg.eval_tokens)
    t0 = time.perf_counter()
    saved = state.load() if state is not None else None
    try:
        result, cfg, retries = train_fitting(
            spec, cfg, data, evals, on_step, on_eval, ranks, on_point, state=state, saved=saved
        )
        row.update(training=settings_json(cfg), oom_retries=retries)
    except TrialDiverged as e:  # the tokens it trained and where its time went, as for any row
        done = (
            {
                "tokens_trained": e.result.tokens_trained,
                **Clock(e.result).split(cfg),
                CURVE: e.result.curve,
                "loss_spike": e.result.loss_spike,
                **resumed(e.result),
            }
            if e.result
            else {}
        )
        return {
            **row,
            "status": "diverged",
            "error": str(e),
            **done,
            **data_columns(data, done.get("tokens_trained", 0)),
            "wall_s": time.perf_counter() - t0,
            "finished_at": now(),
        }
    model = result.model
    if model is None:  # a data-parallel trial's other rank: rank 0 writes the row
        return {}
    clock = Clock(result)
    with clock("eval_s"):
        final = evaluate(model, evals, cfg)
        row.update(
            {
                "tokens_trained": result.tokens_trained,
                **data_columns(data, result.tokens_trained),
                "train_loss": result.train_loss,
                "val_loss": final["val_loss"],
                "val_ppl": final["val_ppl"],
                "val_ppl_unigram": unigram_perplexity(data.train.counts(spec.vocab_size), evals),
                "val_loss_by_source": json.dumps(final["val_loss_by_source"]),
                **loop_columns(evaluate_loops(model, evals, spec.eval_loops, cfg)),
                "evals": json.dumps(result.evals),
                CURVE: result.curve,
                "loss_spike": result.loss_spike,
                **resumed(result),
                "tokens_per_s": result.tokens_per_s,
                "flops_per_s": result.flops_per_s,
                "peak_mem_bytes": result.peak_mem_bytes,
                "precision": result.precision,
                **result.parallel,
                **hyper_diagnostics(model, diagnostic_tokens(evals, model)),
                **stream_record(spec.hyper, next(model.parameters()).device.type, result.precision),
            }
        )
    if quantize:
        with clock("quantize_s"):
            row.update(quantized_columns(model, evals, data, cfg, quantize, final["val_ppl"]))
    if checkpoint_dir is not None:
        save_checkpoint(
            checkpoint_dir,
            model,
            meta={k: row[k] for k in ("training", "dataset_id", "tokenizer_id", "code_version")},
            tokenizer_json=data.tokenizer.inner.to_str(),
        )
    row["wall_s"] = time.perf_counter() - t0
    row["finished_at"] = now()
    row.update(clock.split(cfg))
    if quantize:  # a search's trial: its speed teaches `--plan` (store/speeds.py)
        remember_speed(spec.family, cfg, row)
    return row


def out_of_memory(e: BaseException) -> bool:
    """An allocation the device could not serve: CUDA's OutOfMemoryError, or a CPU allocator's
    RuntimeError ("DefaultCPUAllocator: can't allocate memory")."""
    return isinstance(e, torch.OutOfMemoryError) or (
        isinstance(e, RuntimeError) and "can't allocate memory" in str(e)
    )


def train_fitting(
    spec, cfg: TrainConfig, data: PreparedData, evals, *hooks, state=None, saved=None
):
    """train(), and after an out-of-memory error the run again from its start at half the
    micro-batch and twice the accumulation (the same batch, so the same optimiser steps), said in
    one line, until it fits or the micro-batch cannot be halved (then the error stands). Returns
    (result, the settings it trained with, the retries). Not inside the step loop: a retry is a
    fresh run with its own batches. A data-parallel rank (`ranks`) is not retried alone: its
    peers hold the same micro-batch. `saved`: the state (trial/runstate.py) the first attempt
    continues from, at the batch after its last step; a retry starts afresh (its micro-batches
    are not the saved run's)."""
    on_step, on_eval, ranks, on_point = hooks
    retries = 0
    while True:
        skip = saved["step"] * cfg.grad_accum if saved else 0  # the batches it trained on before
        stream = batches(
            data.train, cfg.seq_len, cfg.batch_size, cfg.seed, skip=skip, sampling=data.sampling
        )
        try:
            result = train(
                spec,
                cfg,
                stream,
                evals,
                on_step,
                on_eval,
                ranks=ranks,
                on_point=on_point,
                state=state,
                saved=saved,
            )
            return result, cfg, retries
        except Exception as e:
            if not out_of_memory(e) or ranks is not None or cfg.batch_size % 2:
                raise
            half = replace(cfg, batch_size=cfg.batch_size // 2, grad_accum=cfg.grad_accum * 2)
        print(
            f"out of memory at micro-batch {cfg.batch_size} x {cfg.grad_accum} accumulated; "
            f"retrying at {half.batch_size} x {half.grad_accum}, the same batch of "
            f"{cfg.batch_size * cfg.grad_accum} sequences",
            file=sys.stderr,
            flush=True,
        )
        cfg, retries, saved = half, retries + 1, None
        gc.collect()  # the failed run's model and activations, before the next one allocates
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def resumed(result) -> dict[str, int]:
    return {
        "resumed_from_step": result.resumed_from_step,
        "resumes": result.resumes,
        "stalls": result.stalls,
    }


class Clock:
    """Where a trial's wall time goes (the row's TIME_SPLIT columns): `compile_s`, the first
    step's time beyond one steady step, with building the model and the step before it (rows of
    older code counted the first step alone); `train_s`, the training steps without
    it; `eval_s`, every evaluation (periodic, final, per loop count, the unigram floor, the
    diagnostics); `quantize_s`, GPTQ and RTN with their evaluations. The rest of `wall_s`
    (checkpoint, bookkeeping) is in none of them. The overhead a user waits through beyond
    training is wall_s - train_s."""

    def __init__(self, result):
        self.result, self.seconds = result, {"eval_s": result.eval_s, "quantize_s": None}

    @contextlib.contextmanager
    def __call__(self, name: str):
        t = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = (self.seconds[name] or 0.0) + time.perf_counter() - t

    def split(self, cfg: TrainConfig) -> dict[str, float | None]:
        r = self.result
        one_step = cfg.tokens_per_step / r.tokens_per_s if r.tokens_per_s else 0.0
        compile_s = max(0.0, r.first_step_s - one_step)
        return {"compile_s": compile_s, "train_s": r.wall_s - r.eval_s - compile_s, **self.seconds}


def remember_speed(family: str, cfg: TrainConfig, row: Mapping[str, Any]) -> None:
    """This trial's training FLOP/s and its time outside the training steps (wall_s - train_s:
    compile, evaluations, quantisation), for the estimates of later plans on this machine."""
    if not (row.get("tokens_per_s") and row.get("flops_per_s")):
        return
    speeds.record_trial(
        speeds.path_in(cache_root()),
        speeds.policy_key(cfg.precision, cfg.compile),
        family,
        row["flops_per_s"],
        row["wall_s"] - row["train_s"],
    )
