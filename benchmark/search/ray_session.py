"""The Ray instance a search runs on: a quiet local one in a session directory this driver owns
(so the processes of a killed run can be found and ended), an existing cluster (`--address`), or
the Ray this process had already started (a notebook's `ray.init()`), which the search leaves
running.

Each driver on a machine starts its own local Ray, in a slot of its study: the session folder
`<tmp>/sbray-<study digest>.<n>`, owned through an fcntl lock on `<folder>.lock` that the driver
holds while it lives (the kernel lets go of it when the driver dies, however it dies). Two drivers
of one study on one machine so get two Rays (`ray.init` starts a head with its own free ports in
the folder it is given, and finds no other through it), rather than one shared: a shared Ray ends
when the driver that started it ends, under the other's running trials, and one driver's
`ray.shutdown` is not another's to make. A slot's processes are ended only while its lock is
free, i.e. after its owner has died. A search that ends as it should removes its slot's folder and
lock file; one that fails leaves them, with Ray's logs."""

from __future__ import annotations

import contextlib
import fcntl
import glob
import hashlib
import itertools
import logging
import os
import re
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

from benchmark.search.resources import nodes_of, per_trial
from benchmark.store.location import absolute, disk_full

# Quiet Ray by default: no experiment banner, no TensorBoard/CSV loggers, no dashboard.
QUIET = {
    "RAY_AIR_NEW_OUTPUT": "0",
    "TUNE_DISABLE_AUTO_CALLBACK_LOGGERS": "1",
    "RAY_DEDUP_LOGS": "1",
    "TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S": "1000",
}
for _k, _v in QUIET.items():
    os.environ.setdefault(_k, _v)


class RayStartError(RuntimeError):
    """Ray could not start or be reached; the message names its log folder and what to try."""


def temp_dir(study_dir: Path) -> str:
    """The study's prefix for session directories (short: Ray's unix socket paths are limited to
    ~107 chars); each driver's folder is this plus `.<slot>`. In RAY_TMPDIR where it is set (Ray's
    own variable for the folder of its sessions), else the system's temp folder."""
    digest = hashlib.sha1(absolute(study_dir).encode()).hexdigest()[:10]
    return os.path.join(os.environ.get("RAY_TMPDIR") or tempfile.gettempdir(), f"sbray-{digest}")


@dataclass
class Slot:
    """A session folder this driver owns while `lock` (an open file holding the flock) is open."""

    folder: str
    lock: object

    def release(self, tidy: bool = False) -> None:
        """Let go of the slot; `tidy` (a search that ended as it should, its Ray shut down) also
        removes the session folder and the lock file, which would otherwise stay in the temp
        folder, one pair per study and driver. After a failure both stay: the folder holds Ray's
        logs, which the error names."""
        if tidy:
            shutil.rmtree(self.folder, ignore_errors=True)
            with contextlib.suppress(OSError):
                os.unlink(self.folder + ".lock")  # still locked: a claimant's check sees it go
        self.lock.close()


def _try_lock(folder: str):
    """The slot's lock file, open and locked, or None while another driver holds it. A lock taken
    on a file that its owner removed meanwhile (opened here before the unlink) is no lock: the
    path must still name the very file locked, else its new file is tried."""
    path = folder + ".lock"
    while True:
        f = open(path, "a+")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            f.close()
            return None
        with contextlib.suppress(FileNotFoundError):
            if os.stat(path).st_ino == os.fstat(f.fileno()).st_ino:
                return f
        f.close()


def claim(study_dir: Path) -> Slot:
    """The first free slot of this study on this machine, with the processes of any dead owner's
    slot ended (a killed run's raylet and workers); a slot a live driver holds is left alone."""
    prefix = temp_dir(study_dir)
    ours = None
    taken = {
        int(m.group(1))
        for p in glob.glob(glob.escape(prefix) + ".*.lock")
        if (m := re.search(r"\.(\d+)\.lock$", p))
    }
    for n in sorted(taken):
        folder = f"{prefix}.{n}"
        lock = _try_lock(folder)
        if lock is None:
            continue  # a live driver's
        end_stale_ray(folder)
        if ours is None:
            ours = Slot(folder, lock)
        else:
            lock.close()
    n = max(taken, default=-1)
    while ours is None:  # every slot is a live driver's: a new one
        n += 1
        lock = _try_lock(f"{prefix}.{n}")
        ours = lock and Slot(f"{prefix}.{n}", lock)
    return ours


def ray_processes(session_dir: str) -> list[int]:
    """Processes whose command line names this session directory (or, given a study's prefix,
    any of its slots)."""
    name = re.compile(re.escape(session_dir.encode()) + rb"(?=[./\s=]|$)")
    pids = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if name.search((proc / "cmdline").read_bytes().replace(b"\0", b" ")):
                pids.append(int(proc.name))
        except OSError:
            continue
    return pids


GONE_WAIT_S = 10.0  # the longest end_stale_ray waits for the processes it ended to go


def end_stale_ray(session_dir: str) -> list[int]:
    """End the processes of a slot: a dead driver's, or this driver's own after a start that
    failed. Called only with the slot's lock held. (Ray's reaper process does not name the slot;
    it ends with the driver.)"""
    killed = []
    for pid in ray_processes(session_dir):
        if pid == os.getpid():
            continue
        try:
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        except OSError:
            pass
    # SIGKILL ends them a moment later; until then they hold the ports and memory a new Ray needs
    deadline = time.monotonic() + GONE_WAIT_S
    while killed and set(ray_processes(session_dir)) & set(killed) and time.monotonic() < deadline:
        time.sleep(0.05)
    return killed


# Ray waits a fixed time for a new local node's raylet to register with its GCS and then gives up
# (ray/_private/node.py, `raylet_start_wait_time_s`, not configurable); on a machine busy with
# other work that wait can run out though nothing is wrong. A local start that timed out so is
# tried again, its leftovers ended first; any other failure, or a cluster's, is said at once.
SLOW_START = "timed out during startup"
LOCAL_STARTS = 3


def start(address: str | None, slot: Slot | None) -> bool:
    """Start (or connect to) the Ray the search runs on; False, starting nothing, when this process
    is connected to one already (a notebook's `ray.init()`): the search runs there and `stop`
    leaves it running. True once this call has started or connected one, for `stop` to end.
    RayStartError when Ray does not start or answer (a local start that ran out of Ray's startup
    wait: after LOCAL_STARTS tries)."""
    import ray

    if ray.is_initialized():
        if address and address != ray.get_runtime_context().gcs_address:
            warnings.warn(
                f"--address {address}: this process is connected to a Ray already; the search runs "
                "on that one",
                stacklevel=2,
            )
        return False
    common = dict(log_to_driver=False, logging_level=logging.ERROR, configure_logging=True)
    for attempt in itertools.count(1):
        try:
            if address:
                ray.init(address=address, **common)
            else:
                ray.init(
                    include_dashboard=False,
                    num_cpus=os.cpu_count(),
                    object_store_memory=256 * 1024**2,
                    _temp_dir=slot.folder,
                    **common,
                )
            return True
        except Exception as e:  # noqa: BLE001  (Ray raises many kinds here; each becomes one line)
            ray.shutdown()
            if not address and attempt < LOCAL_STARTS and SLOW_START in str(e):
                # What the late start left (its GCS, raylet, workers) would hold ports and memory
                # beside the next one; they all name the slot's folder, which this driver owns.
                end_stale_ray(slot.folder)
                continue
            raise RayStartError(
                failure(
                    e,
                    address,
                    slot,
                    "could not start" if not address else f"could not connect to {address}",
                )
            ) from None


def failure(error: BaseException, address: str | None, slot: Slot | None, what: str) -> str:
    """One line for a Ray that failed: what, Ray's own first line, its logs, what to try."""
    first = next(
        (line.strip() for line in str(error).splitlines() if line.strip()), type(error).__name__
    )
    logs = (
        os.path.join(slot.folder, "session_latest", "logs")
        if slot and not address
        else "/tmp/ray/session_latest/logs on the head node"
    )
    fix = (
        "check that the head node is up (`ray status`) and reachable from here"
        if address
        else "check free memory and /dev/shm, and that no firewall blocks local ports"
    )
    return f"Ray {what}: {first[:300]} (Ray's logs: {logs}); {fix}"


def watch_head(
    address: str | None, slot: Slot | None, say, owned: bool, every_s: float = 2.0, misses: int = 3
):
    """A daemon thread that ends this driver with exit code 3 and one line (`say(line)`) once
    Ray's head refuses connections `misses` times in a row. Ray's own client would wait 60 s for
    the head, then end the process with a raw message; the study stays resumable either way (the
    next driver closes this one's RUNNING trials, as its owner is dead). Returns the event that
    stops it; a Ray this search does not own (`owned` False) is not watched."""
    import ray

    stopped = threading.Event()
    if not owned:
        return stopped
    host, _, port = ray.get_runtime_context().gcs_address.rpartition(":")

    def watch():
        missed = 0
        while not stopped.wait(every_s):
            try:
                socket.create_connection((host, int(port)), timeout=every_s).close()
                missed = 0
            except ConnectionRefusedError:
                missed += 1
            except OSError:
                continue  # slow or unreachable for a moment: not known to be gone
            if missed >= misses and not stopped.is_set():
                say(
                    failure(
                        ConnectionError(f"the head node at {host}:{port} refuses connections"),
                        address,
                        slot,
                        "lost its head node",
                    )
                )
                os._exit(3)

    threading.Thread(target=watch, daemon=True, name="ray-head-watch").start()
    return stopped


def lost(error: BaseException) -> bool:
    """Whether an error out of Tune is Ray's own: its head (GCS) or this driver's connection gone."""
    from ray.exceptions import RayError

    return isinstance(error, (RayError, ConnectionError)) or type(error).__module__.startswith(
        "ray._raylet"
    )


class _FullDiskFilter:
    """Drops Ray Tune's own report of an experiment-state save that found the disk full (a
    traceback each time it tries): the search says so once, in its own message."""

    def filter(self, record) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        return error is None or not disk_full(error)


@contextlib.contextmanager
def quiet_full_disk():
    """While Tune runs: its loggers that report a failed save say nothing of a full disk."""
    names = (
        "ray.tune.execution.experiment_state",
        "ray.tune.execution.tune_controller",
        "ray.train._internal.storage",
    )
    loggers, f = [logging.getLogger(n) for n in names], _FullDiskFilter()
    for lg in loggers:
        lg.addFilter(f)
    try:
        yield
    finally:
        for lg in loggers:
            lg.removeFilter(f)


def trial_resources(
    cpus: float | None, gpus: float | None, concurrency: int | None, workers: int | None = None
):
    """What each trial asks for, decided from the alive nodes (search/resources.py); raises
    ResourcesError within seconds when no node can hold one."""
    import ray

    return per_trial(nodes_of(ray.nodes()), cpus, gpus, concurrency, workers)


def free_resources() -> str:
    """What the alive nodes have free now, for a message about trials that do not start."""
    import ray

    free = ray.available_resources()
    alive = sum(1 for n in ray.nodes() if n.get("Alive"))
    return (
        f"{free.get('CPU', 0):g} CPUs and {free.get('GPU', 0):g} GPUs free on {alive} alive nodes"
    )


def stop(owned: bool) -> None:
    """Disconnect from (or end) the Ray instance if `start` started or connected it (`owned`)."""
    if owned and "ray" in sys.modules and sys.modules["ray"].is_initialized():
        sys.modules["ray"].shutdown()


def fit_interrupted(fit) -> bool:
    """Run `fit` (a Ray Tune Tuner's); True when the user stopped it (Ctrl-C: SIGINT, or SIGUSR1).

    Ray Tune catches the signal itself: it stops the trials, saves its state and returns normally
    (ray/tune/tune.py, _setup_signal_catching), so without this a stopped search would end like a
    finished one, with exit 0, and a shell loop over spaces would go on to the next. Its handler,
    when the signal comes, puts back the SIGINT handler it found (so that a second Ctrl-C skips its
    last save); after a run that was not stopped, its own handler stays. A handler installed here
    before the run is therefore back after it exactly when the run was stopped. The handler found
    before is restored either way."""
    if threading.current_thread() is not threading.main_thread():
        fit()  # Ray Tune catches no signal off the main thread: nothing to tell
        return False
    before = signal.getsignal(signal.SIGINT)

    def second_ctrl_c(sig, frame):  # what Ray leaves in place after the first: the usual handler
        if callable(before):
            before(sig, frame)
        elif before != signal.SIG_IGN:
            raise KeyboardInterrupt

    signal.signal(signal.SIGINT, second_ctrl_c)
    try:
        fit()
        caught = not int(os.environ.get("TUNE_DISABLE_SIGINT_HANDLER", "0"))
        return caught and signal.getsignal(signal.SIGINT) is second_ctrl_c
    finally:
        signal.signal(signal.SIGINT, before)
