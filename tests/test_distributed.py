"""Data-parallel trials: the batch split, the loss as one module under DDP, the same
trial in one process and on two gloo ranks, and a search whose trials are Ray Train jobs.

Tolerance of the two-rank losses: LOSS_RTOL = 1e-5, relative. The two ranks see the same
sequences and the same initial weights; what may differ is the order of the fp32 sums: the step's
loss is the mean of two half-batch means, and each gradient the all-reduced sum of two half-batch
gradients, where one process sums the whole batch in one matmul. Each reordering moves a result
by about fp32's epsilon (1.2e-7) relative, and AdamW's sqrt(v) division passes a gradient's
relative change on to the update, so a few steps can grow it to ~1e-6. Measured on this CPU
(6 steps, fp32): no difference at all for the three families (the rounding happened to agree);
with the gradient sync broken (every micro-batch under no_sync) the losses differ by 4e-4 to
4e-3, which LOSS_RTOL catches with a 40x margin."""

from __future__ import annotations

import math
import socket

import pytest
import torch

from benchmark.arch.spec import ArchSpec
from benchmark.models import build_model
from benchmark.trial.distributed import Ranks, split
from benchmark.trial.policy import ExecPolicy
from benchmark.trial.step import LossModule, TrainStep, lm_loss

LOSS_RTOL = 1e-5


def test_the_global_batch_is_split_into_equal_micro_batches_per_rank():
    assert split(16, 1, 2) == split(16, 1, 2)
    s = split(16, 1, 2)  # 16 sequences a step, two ranks: one micro-batch of 8 each
    assert (s.micro, s.size, s.per_rank) == (1, 8, 8)
    s = split(4, 3, 2)  # 12 sequences: 6 per rank, micro-batches of at most 4: 2 of 3
    assert (s.micro, s.size) == (2, 3)
    s = split(8, 4, 4)  # 32 sequences, 8 per rank: one micro-batch of 8
    assert (s.micro, s.size) == (1, 8)
    s = split(2, 8, 2)  # 16 sequences, 8 per rank, at most 2 a micro-batch: 4 of 2
    assert (s.micro, s.size) == (4, 2)
    with pytest.raises(ValueError, match="15 sequences a step do not split over 2 workers"):
        split(5, 3, 2)


def test_a_worker_that_died_is_lost_and_an_error_in_the_training_code_is_not():
    """What Ray Train 2.60 raises for a killed worker (a failed health check whose cause is the
    actor's death) sends the trial into Tune's retry; a worker's own exception is a failed attempt."""
    from ray.exceptions import ActorDiedError
    from ray.train import WorkerGroupError
    from ray.train.v2._internal.exceptions import WorkerHealthCheckFailedError

    from benchmark.trial.distributed import lost_worker

    died = WorkerHealthCheckFailedError("A worker health check failed.", ActorDiedError())
    assert lost_worker(WorkerGroupError("rank 1 died", {1: died}))
    assert not lost_worker(WorkerGroupError("rank 0 raised", {0: ValueError("nan loss")}))
    assert not lost_worker(
        WorkerGroupError("", {1: WorkerHealthCheckFailedError("", TypeError("bad pickle"))})
    )


SPEC = {
    "d_model": 32,
    "n_heads": 2,
    "vocab_size": 64,
    "layers": {"begin": 1, "middle": 1, "end": 1},
}


def test_the_collective_timeout_outlasts_the_watchdog():
    """A hang is ended by the watchdog (its line, the stall counted), never by a collective's
    error first; Ray's 30 minutes stay the least (the first step compiles unwatched)."""
    from benchmark.recipe import TrainConfig
    from benchmark.trial.distributed import collective_timeout_s
    from benchmark.trial.runstate import RunState, parse_limit

    def timeout(text):
        watch, limit = parse_limit(text)
        spec, cfg = {**TINY, "family": "transformer"}, TrainConfig(**TRAIN)
        return collective_timeout_s(RunState("/x", spec, cfg, None, watch, limit))

    assert timeout(None) == 1800  # the default limit: 100 mean steps, at least 10 minutes
    assert timeout("off") == 1800
    assert timeout("5m") == 1800
    assert timeout("1h") == 3660
    assert collective_timeout_s(None) == 1800


@pytest.fixture
def one_rank_group():
    import torch.distributed as dist

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.mark.parametrize("family", ["transformer", "hyperloop"])
def test_the_loss_module_under_ddp_computes_the_loss_and_gradients_of_lm_loss(
    family, one_rank_group
):
    """The wrapper sees the whole loss: DDP(LossModule) gives lm_loss's value and gradients, and
    its reducer ran (a model wrapped alone would leave the loss outside DDP's forward)."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    spec = ArchSpec.from_dict({"family": family, **SPEC})
    torch.manual_seed(0)
    model = build_model(spec)
    x = torch.randint(0, 64, (4, 16))
    ref = lm_loss(model, x, x.roll(-1, 1), None)
    ref.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    synced = []

    def counted(state, bucket):  # DDP's default all-reduce, counted
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        synced.append(bucket.index())
        return allreduce_hook(None, bucket)

    wrapped = DDP(LossModule(model, None))
    wrapped.register_comm_hook(None, counted)
    loss = wrapped(x, x.roll(-1, 1))
    loss.backward()
    assert loss.item() == ref.item()
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, grads[n], rtol=0, atol=0)
    assert synced  # the gradients went through DDP's all-reduce
    # The model wrapped alone, with the loss calling its parts: DDP never arms its reducer.
    model.zero_grad(set_to_none=True)
    synced.clear()
    alone = DDP(model)
    alone.register_comm_hook(None, counted)
    lm_loss(alone.module, x, x.roll(-1, 1), None).backward()
    assert not synced


def test_a_one_rank_group_trains_as_one_process(one_rank_group):
    """Ranks over a one-process gloo group: the step (DDP, accumulation with no_sync, the loss
    mean) gives bit-identical losses to the plain step."""
    spec = ArchSpec.from_dict({"family": "looped", **SPEC, "loops": 2})
    x = torch.randint(0, 64, (6, 4, 16))
    losses = []
    for parallel in (None, "ddp"):
        torch.manual_seed(0)
        model = build_model(spec)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        ranks = None
        if parallel:
            ranks = Ranks(torch.device("cpu"), "gloo", parallel, split(2, 2, 1))
            ranks.ready(model, type("C", (), {"seq_len": 16})())
        step = TrainStep(
            model,
            opt,
            ExecPolicy(precision="fp32", compile=False),
            torch.device("cpu"),
            parallel=ranks,
        )
        out = []
        for b in x:
            micro = [(b[:2], b[:2].roll(-1, 1)), (b[2:], b[2:].roll(-1, 1))]
            out.append(step.accumulate(micro if ranks is None else ranks.share(micro)).item())
        losses.append(out)
    assert losses[0] == losses[1]


# ---- two gloo ranks against one process ------------------------------------------------------

WORDS = "the cat dog sat ran on under a mat log hill big small red blue and then".split()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    import random

    from benchmark.data import DataConfig, prepare

    root = tmp_path_factory.mktemp("corpus")
    rng = random.Random(0)
    paras = [
        " ".join(
            f"{rng.choice(WORDS[:3])} {rng.choice(WORDS[3:5])} {rng.choice(WORDS[5:7])} the "
            f"{rng.choice(WORDS[7:10])}."
            for _ in range(rng.randint(2, 5))
        ).capitalize()
        for _ in range(300)
    ]
    (root / "text.txt").write_text("\n\n".join(paras))
    cfg = DataConfig(
        source=str(root / "text.txt"), tokenizer="bpe:300", cache_dir=str(root / "cache")
    )
    prepare(cfg)
    return cfg


FAMILIES = {
    "transformer": {"family": "transformer"},
    "looped": {"family": "looped", "loops": 2},
    "hyperloop": {"family": "hyperloop", "loops": 2},
}
TINY = {
    "d_model": 32,
    "n_heads": 2,
    "vocab_size": 300,
    "layers": {"begin": 1, "middle": 1, "end": 1},
}
TRAIN = dict(
    tokens="1536",
    seq_len=32,
    batch_size=8,
    lr=3e-3,
    compile=False,
    precision="fp32",
    eval_tokens=512,
)


def _two_ranks(rank: int, port: int, data_cfg, out: dict) -> None:
    import torch.distributed as dist

    from benchmark.data import prepare
    from benchmark.recipe import TrainConfig
    from benchmark.trial.run import run_trial

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    data = prepare(data_cfg)
    cfg = TrainConfig(**TRAIN)
    for name, fam in FAMILIES.items():
        for parallel in ("ddp", "fsdp") if name == "transformer" else ("ddp",):
            ranks = Ranks(
                torch.device("cpu"), "gloo", parallel, split(cfg.batch_size, cfg.grad_accum, 2)
            )
            row = run_trial({**TINY, **fam}, cfg, data=data, ranks=ranks, quantize=None)
            if rank == 0:
                out[(name, parallel)] = row
    dist.destroy_process_group()


@pytest.mark.slow
def test_two_gloo_ranks_train_as_one_process(corpus):
    """The same trial (6 steps of 8 x 32 tokens) in one process and on two gloo ranks: the same
    losses to LOSS_RTOL for a Transformer (under DDP and FSDP2), a looped and a hyper-connected
    family; rank 0's row records the parallelism."""
    import torch.multiprocessing as mp

    from benchmark.data import prepare
    from benchmark.recipe import TrainConfig
    from benchmark.trial.run import run_trial

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    manager = mp.get_context("spawn").Manager()
    out = manager.dict()
    mp.start_processes(_two_ranks, args=(port, corpus, out), nprocs=2, start_method="spawn")
    assert len(out) == 4
    data = prepare(corpus)
    for (name, parallel), two in out.items():
        fam = FAMILIES[name]
        one = run_trial({**TINY, **fam}, TrainConfig(**TRAIN), data=data, quantize=None)
        import json

        a, b = json.loads(one["evals"] or "[]"), json.loads(two["evals"] or "[]")
        # the same evaluations along the run (training.val_points), at the same steps
        assert [(e["step"], e["tokens"]) for e in a] == [(e["step"], e["tokens"]) for e in b] and a
        for ea, eb in zip(a, b):
            assert math.isclose(ea["val_loss"], eb["val_loss"], rel_tol=LOSS_RTOL), (name, parallel)
        assert two["tokens_trained"] == one["tokens_trained"] == 6 * 256
        assert math.isclose(two["train_loss"], one["train_loss"], rel_tol=LOSS_RTOL), (
            name,
            parallel,
        )
        assert math.isclose(two["val_loss"], one["val_loss"], rel_tol=LOSS_RTOL), (name, parallel)
        assert (two["world_size"], two["parallel"], two["backend"], two["rank_batch_size"]) == (
            2,
            parallel,
            "gloo",
            4,
        )
        assert (one["world_size"], one["parallel"], one["rank_batch_size"]) == (1, "none", 8)
        assert len(json.loads(two["peak_mem_bytes_by_rank"])) == 2


class Killed(BaseException):
    """Stands for a rank's process dying: no handler in the trial catches it."""


RESUMED = dict(TRAIN, tokens="4096")  # 16 steps: saves every 4, stopped at 10, continued from 8


def _two_ranks_stopped(rank: int, port: int, data_cfg, folder: str, out: dict) -> None:
    """On two gloo ranks, per parallelism: the run uninterrupted; the run saving every 4 steps,
    stopped after step 10 and continued from its state; a run saving every few milliseconds (a
    duration: the ranks must agree on the steps, or the save's collectives hang)."""
    import torch.distributed as dist

    from benchmark.data import prepare
    from benchmark.recipe import TrainConfig
    from benchmark.trial.run import run_trial
    from benchmark.trial.runstate import Every, RunState

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    data = prepare(data_cfg)
    cfg = TrainConfig(**RESUMED)
    spec = {**TINY, "family": "hyperloop", "loops": 2}

    def stop(step, total, loss):
        if step == 10:
            raise Killed

    for parallel in ("ddp", "fsdp"):
        ranks = Ranks(torch.device("cpu"), "gloo", parallel, split(cfg.batch_size, 1, 2))
        run = dict(data=data, ranks=ranks, quantize=None)
        whole = run_trial(spec, cfg, **run)
        state = RunState(f"{folder}/{parallel}", spec, cfg, Every(steps=4))
        try:
            run_trial(spec, cfg, **run, state=state, on_step=stop)
        except Killed:
            pass
        again = run_trial(spec, cfg, **run, state=RunState(f"{folder}/{parallel}", spec, cfg, None))
        paced = RunState(f"{folder}/{parallel}-paced", spec, cfg, Every(seconds=0.001))
        run_trial(spec, cfg, **run, state=paced)
        out[(rank, parallel)] = (whole, state.saves, again, paced.saves, paced._interval)
    dist.destroy_process_group()


@pytest.mark.slow
def test_two_gloo_ranks_stopped_after_their_second_save_continue_as_if_never_stopped(
    corpus, tmp_path
):
    """A run of two ranks (DDP and FSDP2, a Hyperloop) stopped after its second save continues
    from it on both ranks (the whole model and optimiser state gathered to rank 0 and shared out
    again, each rank's RNGs) and ends with the uninterrupted run's curve, evaluations and losses
    to the bit. A run saving by duration saves at the same steps on both ranks."""
    import json

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = mp.get_context("spawn").Manager().dict()
    folder = str(tmp_path / "_resume")
    mp.start_processes(
        _two_ranks_stopped, args=(port, corpus, folder, out), nprocs=2, start_method="spawn"
    )
    for parallel in ("ddp", "fsdp"):
        whole, saves, again, paced_saves, interval = out[(0, parallel)]
        assert saves == 2, parallel  # at steps 4 and 8, stopped at 10
        assert (again["resumed_from_step"], again["resumes"]) == (8, 1), parallel
        assert (whole["resumed_from_step"], whole["resumes"]) == (0, 0)
        assert again["curve"] == whole["curve"], parallel  # losses, gradient norms, lr
        assert json.loads(again["evals"]) == json.loads(whole["evals"]), parallel
        for key in ("val_loss", "train_loss", "tokens_trained"):
            assert again[key] == whole[key], (parallel, key)
        assert again["parallel"] == parallel and again["world_size"] == 2
        other = out[(1, parallel)]
        assert other[1] == 2 and other[2] == {}  # rank 1 saved with it, rank 0 wrote the row
        # a duration: the interval (in steps) and the saves agreed by both ranks
        assert interval is not None and interval >= 1 and paced_saves > 0
        assert (other[3], other[4]) == (paced_saves, interval)


def _two_ranks_stalled(rank: int, port: int, data_cfg, folder: str, marker: str) -> None:
    """Two gloo ranks (DDP) saving every 4 steps, watched with a 2 s limit; rank 1 sleeps inside
    step 10 (the test-only fault). Rank 1's watchdog ends its process; rank 0 waits in the step's
    collective until its own watchdog (or the lost peer) ends it."""
    import os

    import torch.distributed as dist

    from benchmark.data import prepare
    from benchmark.recipe import TrainConfig
    from benchmark.trial.run import run_trial
    from benchmark.trial.runstate import Every, RunState
    from benchmark.trial.watchdog import FAULT

    if rank == 1:
        os.environ[FAULT] = f"{marker}:10"
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    cfg = TrainConfig(**RESUMED)
    ranks = Ranks(torch.device("cpu"), "gloo", "ddp", split(cfg.batch_size, 1, 2))
    spec = {**TINY, "family": "transformer"}
    state = RunState(folder, spec, cfg, Every(steps=4), True, 2.0)
    run_trial(spec, cfg, data=prepare(data_cfg), ranks=ranks, quantize=None, state=state)


def _two_ranks_continued(rank: int, port: int, data_cfg, folder: str, out: dict) -> None:
    """The stalled run continued from its state on two ranks, and the run never stalled."""
    import torch.distributed as dist

    from benchmark.data import prepare
    from benchmark.recipe import TrainConfig
    from benchmark.trial.run import run_trial
    from benchmark.trial.runstate import RunState

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    cfg, spec, data = TrainConfig(**RESUMED), {**TINY, "family": "transformer"}, prepare(data_cfg)
    ranks = Ranks(torch.device("cpu"), "gloo", "ddp", split(cfg.batch_size, 1, 2))
    state = RunState(folder, spec, cfg, None, True, 2.0)
    again = run_trial(spec, cfg, data=data, ranks=ranks, quantize=None, state=state)
    whole = run_trial(spec, cfg, data=data, ranks=ranks, quantize=None)
    if rank == 0:
        out["rows"] = (again, whole)
    dist.destroy_process_group()


def _spawn_two(fn, *args) -> list[int]:
    """Run fn(rank, port, *args) on two spawned processes; their exit codes."""
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    context = mp.start_processes(fn, args=(port, *args), nprocs=2, start_method="spawn", join=False)
    for p in context.processes:
        p.join()
    return [p.exitcode for p in context.processes]


@pytest.mark.slow
def test_a_rank_that_makes_no_step_ends_and_the_run_continues_from_its_last_save(corpus, tmp_path):
    """Rank 1 of two sleeps inside step 10: its watchdog ends it (the stall's exit status), rank
    0 does not wait for ever, and the run continued from its save at step 8 counts the stall and
    ends as the run that never stalled."""
    import torch.multiprocessing as mp

    from benchmark.trial.watchdog import STALLED_EXIT

    folder, marker = str(tmp_path / "_runstate"), str(tmp_path / "stalled-once")
    codes = _spawn_two(_two_ranks_stalled, corpus, folder, marker)
    assert codes[1] == STALLED_EXIT and codes[0] != 0, codes
    out = mp.get_context("spawn").Manager().dict()
    assert _spawn_two(_two_ranks_continued, corpus, folder, out) == [0, 0]
    again, whole = out["rows"]
    assert (again["resumed_from_step"], again["resumes"], again["stalls"]) == (8, 1, 1)
    assert again["curve"] == whole["curve"] and again["val_loss"] == whole["val_loss"]


# ---- a search whose trials are Ray Train jobs of two gloo workers -----------------------------

SEARCH_SPACE = """
name: dp
budget: 60K
count: total
tolerance: 5%
base: {{vocab_size: 300, n_heads: 2, layers: {{begin: 1, middle: 1, end: 1}}}}
axes:
  family: [transformer, looped]
training: {{tokens: {tokens}, seq_len: 32, batch_size: 8, lr: 3e-3, eval_tokens: 512}}
quantize: {{group_size: 16, calib_sequences: 8}}
objectives: [val_loss:min]
trials: {trials}
"""


# Ray Train's settings for these tests (Ray's defaults stay for users). Its controller polls the
# workers every RAY_TRAIN_HEALTH_CHECK_INTERVAL_S (Ray's default: 2 s), and a worker's
# `ray.train.report` waits for that poll to take the previous report (a queue of one): the tiny
# trials here report at every step (ASHA's rungs), so at the default they mostly waited for the
# poll. Polled this often, a report waits a moment and a lost worker is seen as soon, by the same
# failed health check. The preemption watcher (an actor per Train run that polls for draining
# nodes) has no node to see drain here: one process fewer to start a trial.
TRAIN_ENV = {
    "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.1",
    "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0",
}


@pytest.fixture(scope="module")
def ray_here(tmp_path_factory):
    import ray

    from benchmark.search import ray_session

    slot = ray_session.claim(tmp_path_factory.mktemp("dp-ray"))
    with pytest.MonkeyPatch.context() as mp:
        # Ray's processes inherit the environment of the one that starts it; the Tune trial
        # passes these on to its Train controller and workers.
        for key, value in TRAIN_ENV.items():
            mp.setenv(key, value)
        ray_session.start(None, slot)
        yield
        ray.shutdown()
    slot.release(tidy=True)


def _search(tmp_path, corpus, name, trials, tokens, asha, node_retries=0, every=None):
    from benchmark.search import SearchOptions, run_search
    from benchmark.space.language import load_space

    path = tmp_path / f"{name}.yaml"
    path.write_text(SEARCH_SPACE.format(trials=trials, tokens=tokens))
    opts = SearchOptions(
        name=name,
        results_dir=tmp_path / "results",
        asha=asha,
        retries=0,
        workers_per_trial=2,
        cpus_per_trial=2,
        data=corpus,
        pending_timeout_s=120,
        node_retries=node_retries,
        checkpoint_every=every,
    )
    return run_search(
        load_space(path), opts, console=None, policy={"compile": False, "precision": "fp32"}
    )


def _reserved_groups() -> list:
    import ray

    return [g for g in ray.util.placement_group_table().values() if g["state"] != "REMOVED"]


@pytest.mark.slow
def test_asha_stops_a_two_worker_trial_and_the_next_one_runs(tmp_path, corpus, ray_here):
    """Three trials of two gloo workers under ASHA: one is stopped, its workers' placement group
    is removed and the next trial runs; every trial leaves one row, rank 0's."""
    import time

    import pandas as pd

    _search(tmp_path, corpus, "asha", trials=3, tokens="4K", asha=True)
    df = pd.read_parquet(tmp_path / "results" / "asha")
    assert len(df) == 3 and df["trial_id"].is_unique
    assert "pruned" in set(df["status"]) and "ok" in set(df["status"])
    ok = df[df["status"] == "ok"]
    assert (
        (ok["world_size"] == 2).all()
        and (ok["parallel"] == "ddp").all()
        and (ok["backend"] == "gloo").all()
    )
    assert (ok["rank_batch_size"] == 4).all()
    deadline = time.monotonic() + 10  # Tune removes its own groups as its actors end
    while _reserved_groups() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _reserved_groups()


def _train_workers() -> list[int]:
    """The Ray Train worker processes of this test's Ray: children of its raylet."""
    from pathlib import Path

    import ray

    from benchmark.search.ray_session import ray_processes

    session = ray._private.worker._global_node.get_session_dir_path()
    raylets = {
        p
        for p in ray_processes(session)
        if b"raylet" in Path(f"/proc/{p}/cmdline").read_bytes()[:200]
    }
    out = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            if ppid in raylets and (proc / "cmdline").read_bytes().startswith(
                b"ray::RayTrainWorker"
            ):
                out.append(int(proc.name))
        except (OSError, IndexError, ValueError):
            continue
    return out


@pytest.mark.slow
def test_a_worker_lost_mid_trial_runs_the_trial_again_and_leaves_one_row(
    tmp_path, corpus, ray_here, monkeypatch
):
    """One worker of a two-worker trial is killed once the run has saved its state twice (every
    2 steps; it is training): the Train run fails as a lost worker, the trial raises into Tune's
    retry, and the retry continues the run from its last save on a new pair of workers and leaves
    the study's one row, ok, with the losses of the run trained in one process."""
    import json
    import os
    import signal

    import optuna
    import pandas as pd

    from benchmark.data import prepare
    from benchmark.recipe import TrainConfig
    from benchmark.search.callback import SearchCallback
    from benchmark.search.optuna_study import OPTUNA_DB
    from benchmark.trial.run import run_trial
    from benchmark.trial.runstate import saved_record

    killed = []
    seen = SearchCallback.on_trial_result
    states = tmp_path / "results" / "lost" / "_runstate"

    def kill_once(self, iteration, trials, trial, result, **info):
        saved = [saved_record(str(p)) for p in states.glob("*.state.safetensors")]
        if not killed and not result.get("row_written") and any(r["step"] >= 4 for r in saved):
            killed.append(_train_workers()[-1])
            os.kill(killed[0], signal.SIGKILL)
        return seen(self, iteration, trials, trial, result, **info)

    monkeypatch.setattr(SearchCallback, "on_trial_result", kill_once)
    _search(tmp_path, corpus, "lost", trials=1, tokens="4K", asha=True, node_retries=1, every="2")
    df = pd.read_parquet(tmp_path / "results" / "lost")
    assert killed
    assert len(df) == 1 and df["status"].tolist() == ["ok"]
    assert df["world_size"].tolist() == [2] and df["tokens_trained"].tolist() == [4096]
    row = df.iloc[0]
    assert row["resumes"] == 1 and row["resumed_from_step"] >= 4
    torch.set_num_threads(1)
    one = run_trial(
        json.loads(row["spec"]),
        TrainConfig.from_dict(json.loads(row["training"])),
        data=prepare(corpus),
        quantize=None,
    )
    assert math.isclose(row["val_loss"], one["val_loss"], rel_tol=LOSS_RTOL)
    assert not list(states.glob("*"))  # removed once the row was written
    # Optuna has every evaluation once, at its tokens: those before the kill from the first
    # attempt, those after from the retry (which starts Tune's iteration count again)
    (trial,) = optuna.load_study(
        study_name="lost", storage=f"sqlite:///{tmp_path / 'results' / 'lost' / OPTUNA_DB}"
    ).trials
    evals = json.loads(row["evals"])
    assert trial.intermediate_values == {e["tokens"]: e["val_loss"] for e in evals}
    assert len(evals) >= 4
