"""A run's whole state part-way, so that a run stopped at any moment (a lost worker, a preempted
node, Ctrl-C, `--time-budget`) continues from its last save instead of step 0, and ends with the
losses the run never stopped would have had (on a CPU at one thread count, to the bit).

What a save holds: the model and the optimiser's moments (tensors, in one safetensors file), the
step (which is the schedule's position, lr_at(step), and the data's, batches(skip=...)), every RNG
(torch's, CUDA's, numpy's, Python's) and what the run has recorded so far (every step's loss, the
training curve's points and its open window, the evaluations, the tokens trained), as JSON in the
file's metadata: one file, written whole or not at all by the store (local folder, s3://, ...), and
never a pickle. The file is named by the run (its spec and training settings, seed included), so a
retried run finds it whatever trial number the search gave it again.

A run of several ranks (a Ray Train job: trial/distributed.py) saves the same file: the whole
model and optimiser state gathered to rank 0 (torch.distributed.checkpoint's full state dicts,
which unshard FSDP2's DTensors and name the optimiser's state by parameter), and every rank's
RNGs. Every rank reads it back and takes its own share. The ranks must agree on the steps they
save at (a save is a collective), so a duration is turned into a step count every rank holds:
the slowest rank's step time, measured over the first CALIBRATE_STEPS steps, and each save's
time, agreed as it ends (`bind`)."""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import struct
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from benchmark.arch import ArchSpec
from benchmark.recipe import settings_json
from benchmark.store import location
from benchmark.trial.watchdog import Watchdog, end_process

# torch and safetensors load in the functions that move tensors: the search's command line reads
# parse_every (its --checkpoint-every) without loading torch.

SUFFIX = ".state.safetensors"
STALLS = ".stalls"  # beside it: how many times the watchdog ended the run
NAMED = ".name"  # and what the search calls the run now (its live curve's file)
# A save every ten minutes of training, or every fifty saves' worth of time when a save is slower
# than twelve seconds: so a save costs at most 2% of the run's time (1/50), and a lost node costs
# at most ten minutes of its work. A step count ("500") or another duration ("30m") overrides it.
DEFAULT_EVERY = "10m"
MAX_SHARE = 0.02
# Steps after the first (which pays for compilation) whose time sets a run of several ranks'
# interval in steps: a lost worker before then loses at most these.
CALIBRATE_STEPS = 8


@dataclass(frozen=True)
class Every:
    """When a run saves its state: every `steps` steps, or every `seconds` of wall time (never
    more often than 1/MAX_SHARE times the last save's own time)."""

    steps: int | None = None
    seconds: float | None = None

    def due(self, step: int, since_s: float, last_save_s: float) -> bool:
        if self.steps is not None:
            return step % self.steps == 0
        return since_s >= self.wait_s(last_save_s)

    def wait_s(self, last_save_s: float) -> float:
        """A duration's time between saves, after a save that took `last_save_s`."""
        return max(self.seconds or 0.0, last_save_s / MAX_SHARE)


_UNITS = {"s": 1, "m": 60, "h": 3600}


def parse_every(text: str | int) -> Every | None:
    """`--checkpoint-every`: '500' (steps), '90s', '10m', '2h' (a duration), 'off' (never)."""
    t = str(text).strip().lower()
    if t in ("off", "none", "0"):
        return None
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([smh]?)", t)
    if not m or float(m[1]) <= 0 or (not m[2] and "." in m[1]):
        raise ValueError(f"expected steps (500), a duration (90s, 10m, 2h) or off, got {text!r}")
    return Every(seconds=float(m[1]) * _UNITS[m[2]]) if m[2] else Every(steps=int(m[1]))


def parse_limit(text: str | None) -> tuple[bool, float | None]:
    """`--step-timeout`: a duration (90s, 10m), 'off' (no watchdog), or None: from the run's own
    step time (trial/watchdog.py). Returns (watch, limit_s)."""
    if text is None:
        return True, None
    t = str(text).strip().lower()
    if t in ("off", "none"):
        return False, None
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([smh]?)", t)
    if not m or float(m[1]) <= 0:
        raise ValueError(f"expected a duration (90s, 10m, 1h) or off, got {text!r}")
    return True, float(m[1]) * _UNITS[m[2] or "s"]


def run_key(spec, cfg) -> str:
    """The run's name among saved states: the same spec and training settings (seed included) are
    the same run, whichever trial of the study trains it."""
    spec = spec if isinstance(spec, ArchSpec) else ArchSpec.from_dict(spec)
    text = f"{spec.to_json()}\n{settings_json(cfg)}"
    return hashlib.sha256(text.encode()).hexdigest()[:20]


class RunState:
    """The saved state of the run of `spec` and `cfg` (trial.run's) in `folder` (a path or a URI),
    saved `every` (None: never; a retried run still resumes from a state saved earlier)."""

    def __init__(
        self,
        folder: str,
        spec,
        cfg,
        every: Every | None,
        watch: bool = False,
        stall_after_s: float | None = None,
        name: str = "",
    ):
        key = run_key(spec, cfg)
        self.path = location.join(folder, key + SUFFIX)
        self.stall_path = location.join(folder, key + STALLS)
        self.name_path = location.join(folder, key + NAMED)
        self.every = every
        # the watchdog (trial/watchdog.py): its limit (None: from the run's step time) and the
        # run's name in its line
        self.watch, self.stall_after_s, self.name = watch, stall_after_s, name
        # (step, record) after each save: the search writes the curve so far (live curves)
        self.on_save: Callable[[int, dict[str, Any]], None] | None = None
        self.saves = 0
        self.last_save_s = 0.0
        self._since = time.monotonic()
        self.ranks = None  # a data-parallel run's place (bind)

    def bind(self, ranks) -> None:
        """This process is one rank (trial/distributed.py Ranks) of a run of several: saves and
        restores gather and share the state, and a duration becomes a step count they agree on."""
        self.ranks = ranks
        self._paced: tuple[int, float] | None = None  # (step, time) calibration began at
        self._step_s: float | None = None  # the slowest rank's step time
        self._interval: int | None = None  # steps between saves, once agreed
        self._last = 0  # the step of the last save (or the run's start)

    def due(self, step: int) -> bool:
        if self.every is None:
            return False
        if self.ranks is None or self.every.steps is not None:
            return self.every.due(step, time.monotonic() - self._since, self.last_save_s)
        if self._paced is None:
            self._paced, self._last = (step, time.monotonic()), step - 1
        elif self._step_s is None and step - self._paced[0] == CALIBRATE_STEPS:
            self._step_s = self._slowest((time.monotonic() - self._paced[1]) / CALIBRATE_STEPS)
            self._pace()
        return self._interval is not None and step - self._last >= self._interval

    def _pace(self) -> None:
        self._interval = max(1, round(self.every.wait_s(self.last_save_s) / self._step_s))

    def _slowest(self, seconds: float) -> float:
        """The ranks' largest `seconds` (a collective: every rank calls it at the same step)."""
        import torch
        import torch.distributed as dist

        t = torch.tensor([seconds], dtype=torch.float64, device=self.ranks.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t.item())

    def load(self) -> dict[str, Any] | None:
        """The saved state ('tensors' and the JSON record), or None when there is none."""
        from safetensors.torch import load as load_tensors

        if not location.exists(self.path):
            return None
        data = location.read_bytes(self.path)
        record = json.loads(_metadata(data)["state"])
        return {**record, "tensors": load_tensors(data)}

    def save(self, step: int, model, optimizer, record: dict[str, Any]) -> None:
        from safetensors.torch import save as save_tensors

        t = time.perf_counter()
        if self.ranks is None:
            tensors, scalars = _tensors(model.state_dict(), optimizer.state_dict())
            groups = optimizer.state_dict()["param_groups"]
            rngs = {**_rng_tensors(), **_host_rngs()}
        else:
            tensors, scalars, groups, rngs = self._gathered(model, optimizer)
        if tensors is not None:  # this process writes (rank 0 of several)
            state = {
                **record,
                "step": step,
                "param_groups": groups,
                "opt_scalars": scalars,
                **{k: v for k, v in rngs.items() if not k.startswith("rng.")},
                "pid": os.getpid(),  # the process that saved it: which one to look at, or to stop
            }
            tensors.update({k: v for k, v in rngs.items() if k.startswith("rng.")})
            blob = save_tensors(tensors, metadata={"state": json.dumps(state)})
            location.write_bytes(self.path, blob)
            if self.on_save is not None:
                self.on_save(step, record)
        self.saves += 1
        self.last_save_s = time.perf_counter() - t
        self._since = time.monotonic()
        if self.ranks is not None:
            self.last_save_s, self._last = self._slowest(self.last_save_s), step
            if self._step_s is not None:
                self._pace()

    def _gathered(self, model, optimizer):
        """A run of several ranks: the whole state on rank 0 (tensors, scalars, groups, RNGs
        by rank); None for the first three elsewhere. Collectives: every rank calls it."""
        import torch.distributed as dist
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
            get_optimizer_state_dict,
        )

        whole = StateDictOptions(full_state_dict=True, cpu_offload=True)
        model_sd = get_model_state_dict(model, options=whole)
        opt_sd = get_optimizer_state_dict(model, optimizer, options=whole)
        every = [None] * self.ranks.world
        dist.all_gather_object(every, {**_rng_tensors(self.ranks.device), **_host_rngs()})
        if not self.ranks.main:
            return None, None, None, {}
        tensors, scalars = _tensors(model_sd, opt_sd)
        rngs: dict[str, Any] = {}  # tensors by name and rank; the JSON's lists by rank
        for r, mine in enumerate(every):
            for key, value in mine.items():
                if key.startswith("rng."):
                    rngs[f"{key}.r{r}"] = value
                else:
                    rngs.setdefault(key + "_by_rank", []).append(value)
        return tensors, scalars, opt_sd["param_groups"], rngs

    def rename(self, name: str) -> str | None:
        """Record `name` as what the search calls this run now; the name an earlier, stopped
        attempt had, when it was another (a trial numbered anew on resume), else None."""
        before = None
        if location.exists(self.name_path):
            before = location.read_bytes(self.name_path).decode()
        if before != name:
            location.write_bytes(self.name_path, name.encode())
        return before if before not in (None, name) else None

    def remove(self) -> None:
        for path in (self.path, self.stall_path, self.name_path):
            if location.exists(path):
                location.remove(path)

    def stalls(self) -> int:
        """How many times the watchdog ended this run."""
        if not location.exists(self.stall_path):
            return 0
        return int(location.read_bytes(self.stall_path))

    def watchdog(self, step: Callable[[], int]) -> Watchdog | None:
        """The run's watchdog, or None when not watched; `step()`: the run's step now. Each rank
        of a run of several watches itself (a rank stuck alone leaves the others waiting in the
        next collective, whose watchdogs end them too, unless the lost peer ends them first).
        Whichever rank's watchdog fires counts the stall, writing the count this attempt began
        with plus one: a stall that several ranks see counts once, and one that only the stuck
        rank sees is counted all the same."""
        if not self.watch:
            return None
        begun = self.stalls()

        def stalled(idle_s: float, limit_s: float) -> None:
            location.write_bytes(self.stall_path, str(begun + 1).encode())
            end_process(
                f"shapebench: run {self.name or self.path}: no step for {idle_s:.0f} s after step "
                f"{step()} (limit {limit_s:.0f} s): ended, to run again from its last save"
            )

        return Watchdog(self.stall_after_s, stalled)


def saved_record(where: str) -> dict[str, Any] | None:
    """The JSON part of the state saved at `where` (its step, the process that saved it, what the
    run recorded), without its tensors; None when there is none."""
    if not location.exists(where):
        return None
    return json.loads(_metadata(location.read_bytes(where))["state"])


def restore(saved: dict[str, Any], model, optimizer, ranks=None) -> None:
    """Put a saved state back into a freshly built model and optimiser and the process's RNGs;
    `ranks`: this process is one rank of a run of several (RunState.bind), which takes its share
    of the whole state and its own RNGs."""
    import torch

    # by name: safetensors hands the tensors back in no fixed order, and the ranks of a run of
    # several must share them out (each a collective under FSDP2) in one order
    tensors = dict(sorted(saved["tensors"].items()))
    model_sd = {k[6:]: v for k, v in tensors.items() if k.startswith("model.")}
    state: dict[Any, dict[str, Any]] = {}
    for key, value in tensors.items():
        if key.startswith("opt."):
            i, name = key[4:].rsplit(".", 1)  # a parameter's index, or its name (several ranks)
            state.setdefault(_param_key(i), {})[name] = value
    for i, entry in saved["opt_scalars"].items():
        state.setdefault(_param_key(i), {}).update(entry)
    # JSON made the groups' tuples (betas) lists
    groups = [
        {k: tuple(v) if k == "betas" else v for k, v in g.items()} for g in saved["param_groups"]
    ]
    if ranks is None:
        model.load_state_dict(model_sd)
        optimizer.load_state_dict({"state": state, "param_groups": groups})
        rng = {**saved, "tensors": tensors}
    else:
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        whole = StateDictOptions(full_state_dict=True)
        set_model_state_dict(model, model_sd, options=whole)
        set_optimizer_state_dict(
            model, optimizer, {"state": state, "param_groups": groups}, options=whole
        )
        mine = f".r{ranks.rank}"
        rng = {
            "tensors": {k[: -len(mine)]: v for k, v in tensors.items() if k.endswith(mine)},
            "rng_numpy": saved["rng_numpy_by_rank"][ranks.rank],
            "rng_python": saved["rng_python_by_rank"][ranks.rank],
        }
    torch.set_rng_state(rng["tensors"]["rng.torch"])
    cuda = [rng["tensors"][k] for k in sorted(rng["tensors"]) if k.startswith("rng.cuda")]
    if cuda and torch.cuda.is_available():
        if ranks is None:
            torch.cuda.set_rng_state_all(cuda)
        else:
            torch.cuda.set_rng_state(cuda[0], ranks.device)
    kind, keys, pos, has_gauss, gauss = rng["rng_numpy"]
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, gauss))
    version, internal, gauss_next = rng["rng_python"]
    random.setstate((version, tuple(internal), gauss_next))


def _param_key(text: str) -> int | str:
    """The optimiser state's key: a parameter's index (one process's state_dict) or its name
    (a full state dict of several ranks)."""
    return int(text) if text.isdigit() else text


def _tensors(model_sd, opt_sd) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """The model's and the optimiser's tensors under one file's names, and the optimiser's other
    values (by parameter) for the JSON."""
    import torch

    tensors = {f"model.{k}": _cpu(v) for k, v in model_sd.items()}
    scalars: dict[str, dict[str, Any]] = {}
    for i, entry in opt_sd["state"].items():
        for name, value in entry.items():
            if torch.is_tensor(value):
                tensors[f"opt.{i}.{name}"] = _cpu(value)
            else:
                scalars.setdefault(str(i), {})[name] = value
    return tensors, scalars


def _rng_tensors(device=None) -> dict[str, Any]:
    """torch's RNG states: the CPU's and the CUDA devices' (all of them, or `device`'s)."""
    import torch

    out = {"rng.torch": torch.get_rng_state()}
    if device is not None and device.type == "cuda":
        out["rng.cuda"] = torch.cuda.get_rng_state(device)
    elif device is None and torch.cuda.is_available():
        for d, s in enumerate(torch.cuda.get_rng_state_all()):
            out[f"rng.cuda.{d}"] = s
    return out


def _host_rngs() -> dict[str, list]:
    return {"rng_numpy": _numpy_state(), "rng_python": _python_state()}


def _cpu(t):
    # a copy: safetensors refuses tensors that share memory (tied weights), and the training
    # step must not change what is being written
    return t.detach().to("cpu", copy=True).contiguous()


def _numpy_state() -> list:
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    return [kind, keys.tolist(), int(pos), int(has_gauss), float(gauss)]


def _python_state() -> list:
    version, internal, gauss_next = random.getstate()
    return [version, list(internal), gauss_next]


def _metadata(data: bytes) -> dict[str, str]:
    """The safetensors header's metadata: an 8-byte little-endian length, then the JSON header."""
    (n,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8 : 8 + n]).get("__metadata__", {})
