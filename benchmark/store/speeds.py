"""Speeds measured on this machine, for time estimates (`shapebench plan`, the cluster-job
check): a probe's training FLOP/s and compilation (perf/probe.py), and, once trials
have finished here, each family's achieved training FLOP/s and its fixed time per trial outside
training (compile, evaluations, quantisation), and each finished search's time outside its
trials (record_search), so estimates learn from what ran;
and each `benchmark.perf models` run's paired time ratios (record_ratio), which it judges its
targets by across runs.

One JSON file (`<cache>/perf.json`, or $SHAPEBENCH_SPEEDS), keyed by the machine (CPU model,
cores, torch version, GPU model) and the execution policy. A probe is only the fallback; it never
overrides what trials measured. Best effort: a file that cannot be read or
written gives the fallback, never an error.
"""

from __future__ import annotations

import contextlib
import glob
import importlib.metadata
import json
import math
import os
import platform
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from benchmark.store.atomic import atomic_open

ENV = "SHAPEBENCH_SPEEDS"
KEEP = 8  # the latest trials per family and policy an estimate averages
KEEP_RUNS = 10  # the latest `benchmark.perf models` runs per comparison and model code kept


@dataclass(frozen=True)
class Speed:
    flops_per_s: float  # achieved training FLOP/s
    overhead_s: float  # a trial's time outside its training steps
    trials: int  # how many finished trials this comes from; 0: the machine's fallback


def path_in(cache_root: str | os.PathLike) -> Path:
    return Path(os.environ.get(ENV) or Path(cache_root) / "perf.json")


# The widest vector instructions an x86 CPU offers, widest first: torch, oneDNN and MKL pick their
# kernels by them, so they set both the speed and the order fp32 sums run in.
VECTOR_TIERS = (
    ("amx_bf16", "AMX"),
    ("avx512_bf16", "AVX512-BF16"),
    ("avx512f", "AVX-512"),
    ("avx2", "AVX2"),
)


def cpu_name() -> str:
    """The CPU ("AMD EPYC 7B13, family 25 model 1, AVX2"): its model, and on x86 its family and
    model numbers and widest vector instructions. platform.processor() is often just "x86_64" on
    Linux; machines of one architecture differ by 3x in matmul speed; and a virtual machine often
    names only the product line, "AMD EPYC" for a Zen 3 with AVX2 and a Zen 4 with AVX-512 alike,
    whose kernels differ in width and so in how fp32 sums round (a run is not another's bit for
    bit: search/reuse.py)."""
    name = _cpuinfo(("model name",)) or platform.processor() or platform.machine()
    family, model = _cpuinfo(("cpu family",)), _cpuinfo(("model\t", "model :"))
    flags = cpu_flags() or frozenset()
    tier = next((label for flag, label in VECTOR_TIERS if flag in flags), None)
    parts = [name, f"family {family} model {model}" if family and model else None, tier]
    return ", ".join(p for p in parts if p)


CPUINFO = "/proc/cpuinfo"


def _cpuinfo(keys: tuple[str, ...]) -> str | None:
    """The first /proc/cpuinfo line's value for one of `keys`; None without the file (macOS)."""
    try:
        with open(CPUINFO) as f:
            for line in f:
                if line.startswith(keys):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


# The instructions that do bf16 arithmetic natively: x86's AVX512-BF16 and AMX-BF16, Arm's BF16
# (BFDOT, BFMMLA) and SVE's. Without one, a bf16 matmul converts to fp32 and back around fp32 work.
NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16", "bf16", "svebf16"})


def cpu_flags() -> frozenset[str] | None:
    """The CPU's feature flags as /proc/cpuinfo lists them (x86 `flags`, Arm `Features`), None
    where there is no such file (macOS, Windows)."""
    flags = _cpuinfo(("flags", "Features"))
    return None if flags is None else frozenset(flags.split())


def gpu_name() -> str | None:
    """The first NVIDIA GPU's model, from the driver's /proc files (no CUDA initialisation)."""
    for info in sorted(glob.glob("/proc/driver/nvidia/gpus/*/information")):
        try:
            with open(info) as f:
                for line in f:
                    if line.startswith("Model:"):
                        return line.split(":", 1)[1].strip()
        except OSError:
            continue
    return None


def machine_key() -> str:
    """This machine, without importing torch (so `--plan` stays fast): a speed measured on one
    CPU or GPU is not another's."""
    gpu = gpu_name()
    return f"{cpu_name()}|{os.cpu_count()}|torch {importlib.metadata.version('torch')}" + (
        f"|{gpu}" if gpu else ""
    )


def policy_key(precision: str, compile: bool) -> str:
    return f"{precision}|{'compiled' if compile else 'eager'}"


def _load(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
        return data if isinstance(data.get("machines"), dict) else {"machines": {}}
    except (OSError, ValueError, AttributeError):
        return {"machines": {}}


def _save(path: Path, data: dict) -> None:
    try:
        with atomic_open(path) as f:
            json.dump(data, f, indent=1, sort_keys=True)
    except OSError:
        pass


@contextlib.contextmanager
def _editing(path: Path):
    """Read, change and write the file under a lock: Ray workers on one node record trials at the
    same time, and a read-modify-write without it could drop another worker's entry."""
    from filelock import FileLock, Timeout

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = FileLock(str(path) + ".lock", timeout=30)
        lock.acquire()
    except (OSError, Timeout):  # best effort, as every write here
        lock = None
    try:
        data = _load(path)
        yield data
        _save(path, data)
    finally:
        if lock is not None:
            lock.release()


def probe(path: Path, key: str) -> tuple[float, float] | None:
    """(training FLOP/s, first step beyond a steady one) of the probe recorded under `key`
    (perf/probe.py: a policy and a shape) on this machine, if any."""
    entry = _load(path)["machines"].get(machine_key(), {}).get("probes", {}).get(key)
    ok = (
        isinstance(entry, list)
        and len(entry) == 2
        and all(isinstance(v, (int, float)) for v in entry)
        and entry[0] > 0
        and entry[1] >= 0
    )
    return (float(entry[0]), float(entry[1])) if ok else None


def record_probe(path: Path, key: str, flops_per_s: float, compile_s: float) -> None:
    with _editing(path) as data:
        data["machines"].setdefault(machine_key(), {}).setdefault("probes", {})[key] = [
            flops_per_s,
            compile_s,
        ]


def record_trial(
    path: Path, policy: str, family: str, flops_per_s: float, overhead_s: float
) -> None:
    """One finished trial's training FLOP/s and time outside training (the latest KEEP kept)."""
    if not (flops_per_s > 0 and overhead_s >= 0):
        return
    with _editing(path) as data:
        families = (
            data["machines"]
            .setdefault(machine_key(), {})
            .setdefault("trials", {})
            .setdefault(policy, {})
        )
        families[family] = [*families.get(family, []), [flops_per_s, overhead_s]][-KEEP:]


def record_search(path: Path, start_s: float, per_trial_s: float) -> None:
    """One finished search's time outside its trials (the latest KEEP kept): `start_s` once per
    search (Ray's start, the first worker's imports, Ray's end), `per_trial_s` per trial (the
    driver's scheduling around each one)."""
    if not (start_s >= 0 and per_trial_s >= 0):
        return
    with _editing(path) as data:
        entry = data["machines"].setdefault(machine_key(), {})
        entry["searches"] = [*entry.get("searches", []), [start_s, per_trial_s]][-KEEP:]


def searches(path: Path) -> list[tuple[float, float]]:
    """The (start_s, per_trial_s) of the searches recorded on this machine, oldest first (entries
    that are not two finite non-negative numbers are skipped)."""

    def valid(r) -> bool:
        return (
            isinstance(r, list)
            and len(r) == 2
            and all(isinstance(v, (int, float)) and math.isfinite(v) and v >= 0 for v in r)
        )

    return [
        (float(r[0]), float(r[1]))
        for r in _load(path)["machines"].get(machine_key(), {}).get("searches", [])
        if valid(r)
    ]


def search_times(path: Path, fallback_start_s: float) -> tuple[float, float, int]:
    """(start_s, per_trial_s, searches): the mean of the searches recorded on this machine, else
    the fallback start and no time per trial, from 0 searches."""
    runs = searches(path)
    if not runs:
        return fallback_start_s, 0.0, 0
    return statistics.fmean(r[0] for r in runs), statistics.fmean(r[1] for r in runs), len(runs)


def estimator(path: Path, policy: str, fallback: Callable[[], Speed]) -> Callable[[str], Speed]:
    """family -> Speed: the mean of that family's trials here under this policy; a family not yet
    run gets the mean over the families that ran (their overhead too), else `fallback()` (called
    only then, once: a probe)."""
    measured = _load(path)["machines"].get(machine_key(), {}).get("trials", {}).get(policy, {})
    per = {
        fam: Speed(
            statistics.fmean(f for f, _ in runs), statistics.fmean(o for _, o in runs), len(runs)
        )
        for fam, runs in measured.items()
        if runs
    }
    pooled = (
        Speed(
            statistics.fmean(s.flops_per_s for s in per.values()),
            statistics.fmean(s.overhead_s for s in per.values()),
            0,
        )
        if per
        else None
    )

    def speed_of(family: str) -> Speed:
        nonlocal pooled
        if family not in per and pooled is None:
            pooled = fallback()
        return per.get(family) or pooled

    return speed_of


def precision_probe(path: Path) -> dict | None:
    """The CPU's measured matmul speeds {"fp32": FLOP/s, "bf16": FLOP/s} (trial/step.py's
    `bf16_faster_here`), if this machine (CPU model, cores, torch version) has been probed. Kept
    under "matmul_rounds": a "matmul" entry of the older single-pass probe, which contention could
    invert, is measured again."""
    probe = _load(path)["machines"].get(machine_key(), {}).get("matmul_rounds")
    ok = isinstance(probe, dict) and all(
        isinstance(probe.get(k), (int, float)) and probe[k] > 0 for k in ("fp32", "bf16")
    )
    return probe if ok else None


def record_precision_probe(path: Path, fp32: float, bf16: float) -> None:
    with _editing(path) as data:
        data["machines"].setdefault(machine_key(), {})["matmul_rounds"] = {
            "fp32": fp32,
            "bf16": bf16,
        }


def record_ratio(
    path: Path, pair: str, code: str, log_ratio: float, rounds: int, when: float
) -> None:
    """One `benchmark.perf models` run's paired estimate of a comparison (`pair`, "a/b": the log of
    a's time per token over b's), for the models' code `code` (the latest KEEP_RUNS kept)."""
    if not math.isfinite(log_ratio):  # a run with too few rounds has no estimate
        return
    with _editing(path) as data:
        pairs = (
            data["machines"]
            .setdefault(machine_key(), {})
            .setdefault("ratios", {})
            .setdefault(pair, {})
        )
        pairs[code] = [*pairs.get(code, []), [when, log_ratio, rounds]][-KEEP_RUNS:]


def ratio_runs(path: Path, pair: str, code: str) -> list[tuple[float, float, int]]:
    """(time, log ratio, rounds) of the runs `record_ratio` kept on this machine for this code."""
    try:
        runs = (
            _load(path)["machines"]
            .get(machine_key(), {})
            .get("ratios", {})
            .get(pair, {})
            .get(code, [])
        )
        return [(float(w), float(r), int(n)) for w, r, n in runs]
    except (AttributeError, TypeError, ValueError):  # a file edited by hand: best effort, as above
        return []
