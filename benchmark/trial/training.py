"""One trial: a spec plus training settings in, a row of measurements out.

AdamW (β = (0.9, 0.95), weight decay 0.1 by `models.weight_decays`), gradient clipping at 1.0, linear warmup
then cosine or warmup-stable-decay, a token budget given as a count ("5M") or a multiple of the
parameters ("20x"), periodic evaluation, bf16 autocast and torch.compile where they help (with a
switch to turn them off), seeded so the same spec, settings and seed give the same losses on CPU.
A NaN/inf loss stops the trial as `diverged`.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterator, Mapping

import torch

from benchmark.arch import ArchSpec, count_flops, count_params
from benchmark.models import build_model, weight_decays
from benchmark.recipe import TrainConfig
from benchmark.trial.curve import Curve, largest_rise
from benchmark.trial.evaluate import evaluate
from benchmark.trial.memory import peak_memory_bytes, reset_peak_memory
from benchmark.trial.policy import device_of, policy_of, precision_name, prepare_device
from benchmark.trial.runstate import RunState, restore
from benchmark.trial.step import TrainStep
from benchmark.trial.watchdog import Watchdog, stall_fault


class TrialDiverged(RuntimeError):
    """The training loss became NaN or infinite. `result` (set by `train`, without the model)
    holds what the trial did until then: the tokens it trained, through the step whose loss was
    not finite, and the timings its row's time split reads."""

    result: "TrainResult | None" = None
    step: int = 0  # the first step whose loss was not finite


def make_optimizer(model: torch.nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    """AdamW; weight decay where `models.weight_decays` says (matrices, not norms, static
    hyper-connection parameters or loop embeddings)."""
    named = list(model.named_parameters())
    decay = [p for name, p in named if weight_decays(name, p)]
    other = [p for name, p in named if not weight_decays(name, p)]
    groups = [
        {"params": decay, "weight_decay": cfg.weight_decay},
        {"params": other, "weight_decay": 0.0},
    ]
    # On CUDA the fused kernel: one launch for every parameter instead of ~20 passes over them.
    fused = bool(named) and named[0][1].device.type == "cuda"
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), fused=fused or None)


def single_columns(batch_size: int, grad_accum: int) -> dict[str, Any]:
    """The data-parallel columns of a one-process trial (a Train job's: trial/distributed.py)."""
    return {
        "world_size": 1,
        "parallel": "none",
        "backend": None,
        "rank_batch_size": batch_size,
        "rank_grad_accum": grad_accum,
        "peak_mem_bytes_by_rank": None,
    }


@dataclass
class TrainResult:
    model: torch.nn.Module
    steps: int
    tokens_trained: int
    train_loss: float
    losses: list[float] = field(default_factory=list)  # every step's training loss
    evals: list[dict] = field(default_factory=list)  # periodic evaluations (step, val_loss)
    curve: list[dict] = field(default_factory=list)  # the training curve's points (curve.Curve)
    loss_spike: float = 0.0  # curve.largest_rise of every step's loss
    tokens_per_s: float = 0.0
    flops_per_s: float = 0.0
    wall_s: float = 0.0
    first_step_s: float = 0.0  # the first step, setup and compilation included
    timed_from: float | None = None  # perf_counter when the first step ended
    eval_s: float = 0.0  # periodic evaluations during training
    peak_mem_bytes: int = 0
    precision: str = "fp32"  # what the steps ran in (step.precision_name)
    parallel: dict = field(
        default_factory=dict
    )  # the row's data-parallel columns (distributed.columns)
    resumed_from_step: int = 0  # the step a saved state continued it from (runstate.py); 0: never
    resumes: int = 0  # how many times it continued from a saved state
    stalls: int = 0  # how many times the watchdog ended it (trial/watchdog.py)


def train(
    spec: ArchSpec,
    cfg: TrainConfig,
    batches,
    eval_data: Mapping[str, torch.Tensor] | None = None,
    on_step: Callable[[int, int, float], None] | None = None,
    on_eval: Callable[[dict], None] | None = None,
    ranks=None,
    on_point: Callable[[dict], None] | None = None,
    state: RunState | None = None,
    saved: dict[str, Any] | None = None,
) -> TrainResult:
    """Train a fresh model of `spec` on `batches` (an iterator of (x, y) token tensors) for the
    configured token budget. `on_step(step, total, loss)` reports progress; `on_eval(record)`
    receives every periodic evaluation (step, tokens, val_loss, val_ppl, ...); `on_point(point)`
    every point of the training curve as it is made (curve.Curve).

    `ranks` (trial/distributed.py Ranks): one rank of a data-parallel trial. Every rank draws the
    same global batches and trains on its share; evaluation runs on rank 0 (the other ranks get
    `on_eval(None)` at the same steps, so that every rank reports as often), and the result's
    model is rank 0's full model, None on the other ranks.

    `state` (runstate.RunState) saves the run's whole state when it is due; `saved` (its load())
    continues the run from the step it holds: `batches` must then start at that step's batch.
    Every rank of a data-parallel trial is given both (a save is a collective; rank 0 writes)."""
    # From here: building the model and the step (the first trial in a process imports the
    # compiler then, ~2.5 s on a 2-core CPU) counts with the first step, in the row's compile_s.
    t0 = time.perf_counter()
    device = device_of(cfg) if ranks is None else ranks.device
    prepare_device(device)
    reset_peak_memory(device)  # a reused worker's earlier trials must not count in this one's peak
    torch.manual_seed(cfg.seed)
    model = build_model(spec).to(device).train()
    opt = make_optimizer(model, cfg)
    step_fn = TrainStep(
        model,
        opt,
        policy_of(cfg),
        device,
        clip=cfg.grad_clip,
        parallel=None if ranks is None else ranks.ready(model, cfg),
    )
    params = count_params(spec)
    total = cfg.steps(params)
    result = TrainResult(
        model=model,
        steps=total,
        tokens_trained=0,
        train_loss=float("nan"),
        precision=precision_name(step_fn.dtype, device),
    )
    curve = Curve(total, cfg.tokens_per_step, lambda step: cfg.lr_at(step, total), on_point)
    if state is not None and ranks is not None:
        state.bind(ranks)  # saves and restores gather and share among the ranks
    start = _continue(saved, model, opt, result, curve, ranks) if saved else 0
    if saved and on_eval is not None:
        # the evaluations made before the save, told again: the last may never have reached the
        # trial when the run was lost, and a trial numbered anew on resume has none of them
        # (the searcher tells Optuna only tokens past the last it told: searcher.py on_trial_result)
        for record in result.evals:
            on_eval(record)
    watch = state.watchdog(lambda: len(result.losses)) if state is not None else None
    result.stalls = state.stalls() if state is not None else 0
    try:
        loop = _Loop(
            step_fn=step_fn,
            device=device,
            cfg=cfg,
            total=total,
            batches=batches,
            eval_data=eval_data,
            on_step=on_step,
            on_eval=on_eval,
            start=start,
            save=_saver(state, model, opt, result, curve) if state is not None else None,
            state=state,
            watch=watch,
        )
        _loop(loop, result, curve)
    except TrialDiverged as e:  # its row still says how far it got and where the time went
        # On CUDA the losses are read every SYNC_EVERY_CUDA steps: the clock has run up to 15
        # steps past the NaN, but only the steps through it count as trained.
        result.tokens_trained = (e.step + 1) * cfg.tokens_per_step
        curve.flush(e.step - 1)
        result.curve, result.loss_spike = curve.points, largest_rise(result.losses)
        _time(result, cfg, spec, device, t0)
        e.result = replace(result, model=None)
        raise
    finally:
        step_fn.close()  # the model leaves compiled or not, eager for what follows
        if watch is not None:
            watch.close()
    _time(result, cfg, spec, device, t0)
    result.train_loss = result.losses[-1]
    result.curve, result.loss_spike = curve.points, largest_rise(result.losses)
    result.peak_mem_bytes = peak_memory_bytes(device)
    result.parallel = single_columns(cfg.batch_size, cfg.grad_accum)
    if ranks is not None:  # every rank's peak, and rank 0 keeps the whole model for what follows
        result.parallel = ranks.columns(result.peak_mem_bytes)
        result.peak_mem_bytes = max(json.loads(result.parallel["peak_mem_bytes_by_rank"]))
        result.model = ranks.full_model(model)
    if result.model is not None:
        result.model.eval()
    return result


def _continue(
    saved: dict[str, Any], model, opt, result: TrainResult, curve: Curve, ranks=None
) -> int:
    """A fresh model, optimiser, result and curve put back where the saved run was; its step."""
    restore(saved, model, opt, ranks)
    result.losses, result.evals = list(saved["losses"]), list(saved["evals"])
    result.tokens_trained = saved["tokens_trained"]
    result.resumed_from_step, result.resumes = saved["step"], saved.get("resumes", 0) + 1
    curve.restore(saved["curve"])
    return saved["step"]


def _saver(state: RunState, model, opt, result: TrainResult, curve: Curve):
    def save(step: int) -> None:
        record = {
            "losses": result.losses,
            "evals": result.evals,
            "tokens_trained": result.tokens_trained,
            "curve": curve.state(),
            "resumes": result.resumes,
        }
        state.save(step, model, opt, record)

    return save


def _time(result: TrainResult, cfg: TrainConfig, spec: ArchSpec, device, t0: float) -> None:
    """The result's timings: wall, first step (setup and compilation included), and the pace after it."""
    timed_from = result.timed_from
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # the timers read what the GPU has finished
    end = time.perf_counter()
    result.wall_s = end - t0
    result.first_step_s = (timed_from or end) - t0
    timed = end - (timed_from or t0) - result.eval_s
    # a continued run's clock started at its saved step: the tokens before it are not this pace's
    before = result.resumed_from_step * cfg.tokens_per_step
    timed_tokens = result.tokens_trained - before - (cfg.tokens_per_step if timed_from else 0)
    result.tokens_per_s = (
        timed_tokens / timed
        if timed_tokens
        else result.tokens_trained / max(result.wall_s - result.eval_s, 1e-9)
    )
    result.flops_per_s = result.tokens_per_s * count_flops(spec, cfg.seq_len)["train"]


@dataclass(frozen=True, kw_only=True)
class _Loop:
    """What the training loop runs: the step (its model and optimiser) on `device`, for `total`
    steps of `cfg` over `batches`, evaluating on `eval_data`, and who hears of each (train's on_step
    and on_eval)."""

    step_fn: TrainStep
    device: torch.device
    cfg: TrainConfig
    total: int
    batches: Iterator[tuple[torch.Tensor, torch.Tensor]]
    eval_data: Mapping[str, torch.Tensor] | None
    on_step: Callable[[int, int, float], None] | None
    on_eval: Callable[[dict], None] | None
    start: int = 0  # the first step to train: a continued run's saved step
    state: RunState | None = None  # when to save the run's state
    save: Callable[[int], None] | None = None  # saves the run's state after that many steps
    watch: Watchdog | None = None  # hears of every step, evaluation and save


def _loop(loop: _Loop, result: TrainResult, curve: Curve) -> None:
    """The steps, into `result` and `curve`. `result.timed_from` is when the first one ended (it
    pays for compilation, so throughput is timed after it); periodic evaluations add their time to
    `result.eval_s`."""
    step_fn, device, cfg, total, eval_data = (
        loop.step_fn,
        loop.device,
        loop.cfg,
        loop.total,
        loop.eval_data,
    )
    pending, last = [], float("nan")
    fault = stall_fault() if loop.watch is not None else None
    for step in range(loop.start, total):
        for group in step_fn.optimizer.param_groups:
            group["lr"] = cfg.lr_at(step, total)
        micro = [next(loop.batches) for _ in range(cfg.grad_accum)]
        mine = micro if step_fn.parallel is None else step_fn.parallel.share(micro)
        loss = step_fn.accumulate([(to_device(x, device), to_device(y, device)) for x, y in mine])
        if fault is not None:
            fault(step + 1)
        pending.append(
            torch.stack([loss.float(), step_fn.grad_norm.float()])
        )  # (2,): read together
        evaluating = eval_data is not None and cfg.evaluates(step + 1, total)
        # the last step needs no save: the run's row follows at once
        saving = loop.state is not None and step + 1 < total and loop.state.due(step + 1)
        first = step == loop.start
        if len(pending) >= sync_every(device) or first or step + 1 == total or evaluating or saving:
            last = _read_losses(
                pending, result, step, total, curve
            )  # the one host sync, every few steps on CUDA
        result.tokens_trained += sum(x.numel() for x, _ in micro)
        if first:
            result.timed_from = time.perf_counter()
        if loop.on_step is not None:
            loop.on_step(step + 1, total, last)
        if loop.watch is not None:
            loop.watch.beat()
        if evaluating:
            t = time.perf_counter()
            scored = (
                step_fn.model
                if step_fn.parallel is None
                else step_fn.parallel.full_model(step_fn.model)
            )
            record = None
            if scored is not None:
                # eagerly, as the final evaluation runs: through the compiled regions no_grad, eval
                # mode and a short last batch would each compile every region again
                with torch.compiler.set_stance("force_eager"):
                    record = {
                        "step": step + 1,
                        "tokens": result.tokens_trained,
                        **evaluate(scored, eval_data, cfg),
                    }
                result.evals.append(record)
                step_fn.model.train()
            if loop.on_eval is not None:
                loop.on_eval(record)
            result.eval_s += time.perf_counter() - t
        if saving:  # after the step's evaluation, which the saved record then holds
            loop.save(step + 1)
        if loop.watch is not None and (evaluating or saving):
            loop.watch.beat(step=False)


# Steps between reads of the loss on CUDA: reading it waits for the GPU, so a divergence is seen up
# to this many steps late rather than every step paying a host sync. On a CPU reading is free.
SYNC_EVERY_CUDA = 16


def sync_every(device: torch.device) -> int:
    return SYNC_EVERY_CUDA if device.type == "cuda" else 1


def _read_losses(
    pending: list[torch.Tensor], result: TrainResult, step: int, total: int, curve: Curve
) -> float:
    """Read the losses (and gradient norms) kept on the device since the last read, into the
    result and the curve; TrialDiverged at a NaN/inf loss."""
    values = torch.stack(pending).tolist()  # (n, 2): loss, gradient norm
    first = step + 1 - len(values)
    pending.clear()
    for k, (loss, norm) in enumerate(values):
        if not math.isfinite(loss):
            diverged = TrialDiverged(f"loss is {loss} at step {first + k} of {total}")
            diverged.step = first + k
            raise diverged
        result.losses.append(loss)
        curve.add(first + k, loss, norm)
    return values[-1][0]


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A batch onto the device: on CUDA from pinned memory without blocking the host."""
    if device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)
