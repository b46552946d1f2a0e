"""The Ray instance a search runs on: a quiet local one with a per-study session directory (so the
processes of a killed run can be found and ended), an existing cluster (`--address`), or the Ray
this process had already started (a notebook's `ray.init()`), which the search leaves running."""

from __future__ import annotations

import hashlib
import logging
import os
import signal
import tempfile
from pathlib import Path

# Quiet Ray by default: no experiment banner, no TensorBoard/CSV loggers, no dashboard.
QUIET = {"RAY_AIR_NEW_OUTPUT": "0", "TUNE_DISABLE_AUTO_CALLBACK_LOGGERS": "1", "RAY_DEDUP_LOGS": "1",
         "TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S": "1000"}
for _k, _v in QUIET.items():
    os.environ.setdefault(_k, _v)


def temp_dir(study_dir: Path) -> str:
    """A per-study session directory (short: Ray's unix socket paths are limited to ~107 chars)."""
    from benchmark.store.location import absolute

    digest = hashlib.sha1(absolute(study_dir).encode()).hexdigest()[:10]
    return os.path.join(tempfile.gettempdir(), f"sbray-{digest}")


def ray_processes(session_dir: str) -> list[int]:
    """Processes whose command line names this session directory."""
    pids = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if session_dir in (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                pids.append(int(proc.name))
        except OSError:
            continue
    return pids


def end_stale_ray(session_dir: str) -> list[int]:
    """End the processes of a killed run of this study."""
    killed = []
    for pid in ray_processes(session_dir):
        if pid == os.getpid():
            continue
        try:
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        except OSError:
            pass
    return killed


def start(address: str | None, study_dir: Path) -> bool:
    """Start (or connect to) the Ray the search runs on; False, starting nothing, when this process
    is connected to one already (a notebook's `ray.init()`): the search runs there and `stop`
    leaves it running. True once this call has started or connected one, for `stop` to end."""
    import ray

    if ray.is_initialized():
        if address and address != ray.get_runtime_context().gcs_address:
            import warnings

            warnings.warn(f"--address {address}: this process is connected to a Ray already; the search runs "
                          "on that one", stacklevel=2)
        return False
    common = dict(log_to_driver=False, logging_level=logging.ERROR, configure_logging=True)
    if address:
        ray.init(address=address, **common)
        return True
    session = temp_dir(study_dir)
    end_stale_ray(session)
    ray.init(include_dashboard=False, num_cpus=os.cpu_count(), object_store_memory=256 * 1024 ** 2,
             _temp_dir=session, **common)
    return True


def trial_resources(cpus: float | None, gpus: float | None, concurrency: int | None):
    """What each trial asks for, decided from the alive nodes (search/resources.py); raises
    ResourcesError within seconds when no node can hold one."""
    import ray

    from benchmark.search.resources import nodes_of, per_trial

    return per_trial(nodes_of(ray.nodes()), cpus, gpus, concurrency)


def free_resources() -> str:
    """What the alive nodes have free now, for a message about trials that do not start."""
    import ray

    free = ray.available_resources()
    alive = sum(1 for n in ray.nodes() if n.get("Alive"))
    return f"{free.get('CPU', 0):g} CPUs and {free.get('GPU', 0):g} GPUs free on {alive} alive nodes"


def stop(owned: bool) -> None:
    """Disconnect from (or end) the Ray instance if `start` started or connected it (`owned`)."""
    import sys

    if owned and "ray" in sys.modules and sys.modules["ray"].is_initialized():
        sys.modules["ray"].shutdown()
