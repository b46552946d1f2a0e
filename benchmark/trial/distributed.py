"""One trial on several workers: a Ray Train job (TorchTrainer) inside its Ray Tune trial, DDP by
default, FSDP2 (`fully_shard`) when the model with its optimiser state would not fit one GPU or
on request.

What stays as in one process: the global batch (every rank draws the same global batches and
trains on its contiguous share, `Split`), the loss (the whole `lm_loss` is one module's forward,
step.LossModule, so DDP's hooks see all of it), one gradient average per optimiser step (no sync
on the other micro-batches), the step's reported loss (the ranks' mean). Evaluation, the
diagnostics and quantisation run once, on rank 0, which returns the row.

Around the search: rank 0's intermediate evaluations go to Tune (and so to ASHA and Optuna)
through `TuneReportCallback`; every rank reports as often, as Ray Train asks. The workers'
placement group of a trial that ASHA stops (its controller dies with it) is removed by the search
driver (`release_workers`; ray-project/ray#54305: it stayed reserved and the next trial waited).
A lost worker fails the Train run, and the trial raises into Tune's retry (`lost_worker`); an
error in the training code is a failed attempt, as in one process.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import uuid
from dataclasses import dataclass
from typing import Any, Callable

from benchmark.arch import count_params
from benchmark.data import prepare

PARALLELS = ("auto", "ddp", "fsdp")

# `auto` shards (FSDP2) when fp32 weights, gradients and AdamW's two moments (16 bytes a
# parameter) would take more than this share of one GPU: the rest is for activations.
FSDP_FROM_MEMORY_SHARE = 0.5
STATE_BYTES_PER_PARAM = 16


@dataclass(frozen=True)
class Split:
    """How one optimiser step's `batch_size x grad_accum` sequences are shared by `world` ranks:
    each rank runs `micro` micro-batches of `size` sequences, its contiguous share of the global
    batch. `size` is at most `batch_size` (the micro-batch the memory was sized for), and micro-
    batches are equal so that the mean of the ranks' mean losses is the global batch's mean."""

    world: int
    micro: int
    size: int

    @property
    def per_rank(self) -> int:
        return self.micro * self.size


def split(batch_size: int, grad_accum: int, world: int) -> Split:
    total = batch_size * grad_accum
    if world < 1 or total % world:
        raise ValueError(
            f"training.batch_size x grad_accum: {total} sequences a step do not split over "
            f"{world} workers; make it a multiple of {world}"
        )
    per = total // world
    micro = next(k for k in range(1, per + 1) if per % k == 0 and per // k <= batch_size)
    return Split(world, micro, per // micro)


def choose(parallel: str, params: int, device) -> str:
    """`auto`: DDP, or FSDP2 where the model's training state would not fit one GPU."""
    if parallel != "auto":
        return parallel
    if device.type == "cuda":
        import torch

        memory = torch.cuda.get_device_properties(device).total_memory
        if STATE_BYTES_PER_PARAM * params > FSDP_FROM_MEMORY_SHARE * memory:
            return "fsdp"
    return "ddp"


class Ranks:
    """This process's place in a data-parallel trial: its rank, the group's size, its device and
    how the model is wrapped. Built inside a Ray Train worker (`from_train_context`), or over any
    initialised torch.distributed group (the tests' one-process gloo group)."""

    def __init__(self, device, backend: str, parallel: str, split: Split):
        import torch.distributed as dist

        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.device, self.backend, self.requested, self.split = device, backend, parallel, split
        self.main = self.rank == 0
        self.parallel = parallel
        self.unused: list[str] = []

    def ready(self, model, cfg) -> "Ranks":
        """Before the step compiles: which parallelism, and which parameters a step leaves
        without a gradient (DDP then waits for them for ever unless told: find_unused_parameters)."""
        self.parallel = choose(self.requested, count_params(model.spec)["total"], self.device)
        self.unused = unused_parameters(model, cfg.seq_len, self.device)
        return self

    def wrap(self, loss, optimizer):
        """The loss module under DDP, or FSDP2-sharded (`shard`, which hands `optimizer` the
        sharded parameters)."""
        if self.parallel == "fsdp":
            return shard(loss, self.world, optimizer)
        from torch.nn.parallel import DistributedDataParallel as DDP

        ids = [self.device.index] if self.device.type == "cuda" else None
        return DDP(loss, device_ids=ids, find_unused_parameters=bool(self.unused))

    def sync(self, wrapped, last: bool):
        """Gradients are averaged in the last micro-batch's backward only."""
        if self.parallel == "fsdp":
            wrapped.set_requires_gradient_sync(last)
            return contextlib.nullcontext()
        return contextlib.nullcontext() if last else wrapped.no_sync()

    def mean(self, t):
        """The ranks' mean of a scalar (a sum divided: gloo has no AVG)."""
        import torch.distributed as dist

        t = t.clone()
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t / self.world

    def share(self, micro: list) -> list:
        """This rank's micro-batches of one step's global batch (all ranks drew the same)."""
        import torch

        x = torch.cat([x for x, _ in micro])
        y = torch.cat([y for _, y in micro])
        lo = self.rank * self.split.per_rank
        x, y = x[lo : lo + self.split.per_rank], y[lo : lo + self.split.per_rank]
        return list(zip(x.split(self.split.size), y.split(self.split.size)))

    def columns(self, peak_bytes: int) -> dict[str, Any]:
        """The row's data-parallel columns, with every rank's peak memory (a collective)."""
        import torch.distributed as dist

        peaks = [None] * self.world
        dist.all_gather_object(peaks, int(peak_bytes))
        return {
            "world_size": self.world,
            "parallel": self.parallel,
            "backend": self.backend,
            "rank_batch_size": self.split.size,
            "rank_grad_accum": self.split.micro,
            "peak_mem_bytes_by_rank": json.dumps(peaks),
        }

    def full_model(self, model):
        """Rank 0's whole model for evaluation (a collective under FSDP2: the shards are
        gathered into an unsharded copy); None on the other ranks."""
        if self.parallel != "fsdp":
            return model if self.main else None
        # torch, the model and the trial load here, in a worker: the driver reads this module
        # (Workers, release_workers) without them.
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        from benchmark.models import build_model

        state = get_model_state_dict(
            model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
        )
        if not self.main:
            return None
        whole = build_model(model.spec)
        whole.load_state_dict(state)
        return whole.to(self.device).train(model.training)


def unused_parameters(model, seq_len: int, device) -> list[str]:
    """Parameters one eager step of one short sequence leaves without a gradient. The probe
    runs in a forked RNG (Depth's initial state draws from it) and leaves no gradient behind."""
    import torch  # torch and the trial in a worker only, as full_model

    from benchmark.trial.step import lm_loss

    x = torch.zeros(1, min(seq_len, 8), dtype=torch.long, device=device)
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        lm_loss(model, x, x, None).backward()
    unused = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    model.zero_grad(set_to_none=True)
    return unused


def shard(loss, world: int, optimizer):
    """FSDP2: each block that runs once per forward is its own unit (all-gathered just before it
    runs, freed after); looped blocks, blocks whose sublayers hyper-connections call one by one,
    the gates, embedding and head stay in the root unit, gathered for the whole forward (their
    methods are called directly or several times a forward, which FSDP2's forward hooks would
    not see). Gradients are reduced as sums and divided here: gloo silently sums FSDP2's AVG
    (pytorch#162338). `fully_shard` replaces each parameter by a sharded one (a DTensor): the
    optimiser, built on the whole ones, is pointed at them, or it would step parameters no
    longer in the model."""
    from torch.distributed.fsdp import fully_shard

    model = loss.model
    whole = {id(p): name for name, p in model.named_parameters()}
    connected = {id(sub) for sub, name in model.regions() if name == "branch"}
    once = [*model.begin, *model.end] + (list(model.middle) if model.spec.loops == 1 else [])
    for block in once:
        if not any(id(sub) in connected for sub in getattr(block, "sublayers", ())):
            fully_shard(block)
    fully_shard(loss)
    for unit in [loss, *(b for b in once if hasattr(b, "set_gradient_divide_factor"))]:
        unit.set_force_sum_reduction_for_comms(True)
        unit.set_gradient_divide_factor(float(world))
    sharded = dict(model.named_parameters())
    for group in optimizer.param_groups:
        group["params"] = [sharded[whole[id(p)]] for p in group["params"]]
    return loss


# ---- inside a Ray Tune trial: the Train job ---------------------------------------------------


def lost_worker(error: BaseException) -> bool:
    """Whether a Train run failed because a worker process or its node was lost (then the trial
    raises, into Tune's retry), rather than by an error in the training code (a failed attempt).
    Ray Train reports a lost worker as a failed health check (`health_check_failure`) whose
    cause is the actor's death."""
    from ray.exceptions import ActorDiedError, NodeDiedError, RayActorError, WorkerCrashedError

    lost = (ActorDiedError, RayActorError, NodeDiedError, WorkerCrashedError)

    def died(e) -> bool:
        return isinstance(e, lost) or any(
            died(c)
            for c in (getattr(e, "health_check_failure", None), getattr(e, "cause", None))
            if c is not None
        )

    failures = getattr(error, "worker_failures", None)
    if failures:
        return any(died(f) for f in failures.values())
    return died(error) or type(error).__name__ == "ControllerError"


@dataclass(frozen=True, kw_only=True)
class Workers:
    """A data-parallel trial's workers: how many, each one's CPUs and GPUs, and the wrapper."""

    count: int
    cpus: float = 1.0
    gpus: float = 0.0
    parallel: str = "auto"

    def __post_init__(self):
        if self.count < 1:
            raise ValueError(f"workers: {self.count} must be at least 1")
        if self.parallel not in PARALLELS:
            raise ValueError(f"parallel: '{self.parallel}' is not one of {', '.join(PARALLELS)}")

    @property
    def backend(self) -> str:
        return "nccl" if self.gpus else "gloo"


def run_distributed(
    spec,
    cfg,
    workers: Workers,
    data_cfg,
    *,
    name: str,
    quantize=None,
    checkpoint_dir=None,
    on_step=None,
    report: Callable[[dict | None], dict] | None = None,
    state=None,
) -> dict[str, Any]:
    """Run one trial as a Train job of `workers` and return rank 0's row. `report(record)` turns
    rank 0's periodic evaluation into the dict Tune receives (every rank reports; Tune reads rank
    0's). Raises the Train error when the run failed (`lost_worker` says whether a worker was lost).
    `state` (trial/runstate.py RunState): every rank saves the run's state with it and continues
    from it, so that the trial Tune runs again after a lost worker (or a stalled rank the watchdog
    ended) goes on from the last save."""
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer
    from ray.tune.trainable.trainable_fn_utils import _in_tune_session

    callbacks: list = []
    if _in_tune_session():
        from ray import tune
        from ray.tune.integration.ray_train import TuneReportCallback

        callbacks = [TuneReportCallback(), _recorder(tune.get_context().get_trial_id())]
    per_worker = {"CPU": workers.cpus, **({"GPU": workers.gpus} if workers.gpus else {})}
    trainer = TorchTrainer(
        _worker,
        train_loop_config={
            "spec": spec,
            "cfg": cfg,
            "workers": workers,
            "data": data_cfg,
            "quantize": quantize,
            "checkpoint_dir": checkpoint_dir,
            "on_step": on_step,
            "report": report,
            "state": state,
        },
        torch_config=TorchConfig(backend=workers.backend, timeout_s=collective_timeout_s(state)),
        # One node per trial, as resources.py sizes it: NVLink between its GPUs.
        scaling_config=ScalingConfig(
            num_workers=workers.count,
            use_gpu=bool(workers.gpus),
            resources_per_worker=per_worker,
            placement_strategy="STRICT_PACK",
        ),
        run_config=RunConfig(
            name=f"{name}-{uuid.uuid4().hex[:8]}",
            callbacks=callbacks,
            storage_path=os.path.join(tempfile.gettempdir(), "shapebench-train"),
            failure_config=FailureConfig(max_failures=0),
        ),  # Tune retries the trial
    )
    return trainer.fit().return_value


def _worker(config: dict[str, Any]) -> dict[str, Any] | None:
    """One rank: train its share; rank 0 evaluates, quantises and returns the row."""
    # Ray Train, torch and the trial load here, in the worker, as full_model
    import ray.train
    import torch

    from benchmark.trial.run import run_trial

    workers: Workers = config["workers"]
    torch.set_num_threads(max(1, int(workers.cpus)))
    cfg = config["cfg"]
    device = ray.train.torch.get_device() if workers.gpus else torch.device("cpu")
    ranks = Ranks(
        device,
        workers.backend,
        workers.parallel,
        split(cfg.batch_size, cfg.grad_accum, workers.count),
    )
    report = config["report"]

    def on_eval(record):  # every rank reports as often: a barrier in Ray Train
        ray.train.report(report(record) if (report and record is not None) else {})

    row = run_trial(
        config["spec"],
        cfg,
        data=prepare(config["data"]),
        ranks=ranks,
        on_step=config["on_step"] if ranks.main else None,
        on_eval=on_eval,
        quantize=config["quantize"],
        checkpoint_dir=config["checkpoint_dir"] if ranks.main else None,
        state=config["state"],
    )
    return row if ranks.main else None


# Ray Train's own collective timeout (TorchConfig.timeout_s), kept where nothing asks for longer
COLLECTIVE_TIMEOUT_S = 1800


def collective_timeout_s(state) -> int:
    """How long a collective waits before it fails the run: longer than the run's watchdog limit
    (`--step-timeout`), so that a hang is ended by the watchdog (its one line, the stall counted,
    the run continued from its save) and never by a collective's error first; never under Ray's
    default, which also covers the first step's compilation, before the watchdog starts. The
    default watchdog limit (trial/watchdog.py, at least STALL_MIN_S) ends a hang before it."""
    limit = state.stall_after_s if state is not None and state.watch else None
    return max(COLLECTIVE_TIMEOUT_S, int(limit or 0) + 60)


KV_NAMESPACE = "shapebench"  # Ray's key-value store: a trial's workers' placement group


def _workers_key(trial_id: str) -> bytes:
    return f"workers-group:{trial_id}".encode()


def _recorder(trial_id: str):
    """A Train callback, run in the job's controller, that records its workers' placement group
    under the Tune trial's id in Ray's key-value store, where the search driver finds it
    (`release_workers`). Ray places the group from the controller but ties its life to the job's
    driver, so a controller killed with its stopped Tune trial leaves it reserved
    (ray-project/ray#54305); Ray's own cleaner asks the state API, which a Ray without its
    dashboard, as this project starts it, does not answer."""
    from ray.train.v2._internal.execution.callback import WorkerGroupCallback

    class Record(WorkerGroupCallback):
        def after_worker_group_start(self, worker_group):
            from ray.experimental.internal_kv import _internal_kv_put

            pg = worker_group.get_worker_group_state().placement_group_handle.placement_group
            _internal_kv_put(
                _workers_key(trial_id), pg.id.binary(), overwrite=True, namespace=KV_NAMESPACE
            )

    return Record()


def release_workers(trial_id: str) -> bool:
    """Remove the placement group of a Tune trial's Train workers if it is still reserved (the
    trial was stopped or its actor died: `_recorder`); True when one was removed. Called by the
    search driver when the trial ends or is retried."""
    from ray._raylet import PlacementGroupID
    from ray.experimental.internal_kv import _internal_kv_del, _internal_kv_get
    from ray.util.placement_group import (
        PlacementGroup,
        placement_group_table,
        remove_placement_group,
    )

    key = _workers_key(trial_id)
    pg_id = _internal_kv_get(key, namespace=KV_NAMESPACE)
    if pg_id is None:
        return False
    _internal_kv_del(key, namespace=KV_NAMESPACE)
    pg = PlacementGroup(PlacementGroupID(pg_id))
    if placement_group_table(pg).get("state") in (None, "REMOVED"):
        return False
    remove_placement_group(pg)
    return True
