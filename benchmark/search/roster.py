"""The drivers running a study now, each known by a small file `<study>/_drivers/<id>.json` that
it writes when it starts, refreshes while it runs (`beat`) and removes when it ends. The files live
beside the rows, so every driver that can write the study sees them, on any machine.

Whether a driver is alive: on this machine, its process (pid and start time, so a reused pid is
not taken for it) still runs; on another, or where no start time can be read, its file was
refreshed within `GRACE_S`. What only a study's sole driver may do (close the trials a dead
driver left RUNNING, sweep half-written rows) asks `others()` first, so a second driver never
takes a live one's trials or files."""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass

from benchmark.search.optuna_study import StudyError
from benchmark.store import location

FOLDER = "_drivers"
BEAT_S = 30.0  # how often a running driver refreshes its file
GRACE_S = 180.0  # a driver on another machine is dead once its file is this old


def _started(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (/proc/PID/stat field 22), or None."""
    try:
        stat = open(f"/proc/{pid}/stat", "rb").read()
    except OSError:
        return None
    return stat[stat.rindex(b")") + 2 :].split()[19].decode()


@dataclass(frozen=True)
class Driver:
    host: str
    pid: int
    started: str | None
    storage: str  # "rdb", "sqlite" (beside the rows) or "sqlite-copy" (a URI's study, copied)

    @property
    def id(self) -> str:
        return f"{self.host}-{self.pid}-{self.started}"

    def alive(self, beat: float) -> bool:
        """Its process still runs (this machine, where /proc gives start times), else its file is fresh:
        without /proc (macOS) every start time reads None, and None == None would keep a dead driver."""
        if self.host == socket.gethostname() and self.started is not None:
            return _started(self.pid) == self.started
        return time.time() - beat < GRACE_S

    def describe(self) -> str:
        return f"pid {self.pid} on {self.host}"


class Registry:
    """This driver's entry in a study's registry."""

    def __init__(self, study_dir: str, storage: str):
        self.study_dir = study_dir
        self.me = Driver(socket.gethostname(), os.getpid(), _started(os.getpid()), storage)
        self._path = location.join(study_dir, FOLDER, f"{self.me.id}.json")
        self._last = 0.0

    def others(self) -> list[Driver]:
        """The live drivers of this study other than this one; dead ones' files are removed."""
        folder = location.join(self.study_dir, FOLDER)
        if not location.is_dir(folder):
            return []
        live = []
        for name in location.files(folder):
            path = location.join(folder, name)
            try:
                record = json.loads(location.read_bytes(path))
                driver, beat = Driver(**record["driver"]), float(record["beat"])
            except (OSError, ValueError, KeyError, TypeError):
                continue  # being written, or not ours
            if driver.id == self.me.id:
                continue
            if driver.alive(beat):
                live.append(driver)
            else:
                _remove_quietly(path)
        return live

    def beat(self, force: bool = False) -> None:
        """Write (or refresh, at most every BEAT_S) this driver's file."""
        now = time.time()
        if force or now - self._last >= BEAT_S:
            location.write_bytes(
                self._path, json.dumps({"driver": self.me.__dict__, "beat": now}).encode()
            )
            self._last = now

    def end(self) -> None:
        _remove_quietly(self._path)


def _remove_quietly(path: str) -> None:
    try:
        location.remove(path)
    except OSError:
        pass


def check_shared(registry: Registry, others: list[Driver], on_uri: bool) -> None:
    """A study another driver is running is joined where its Optuna study can be shared: an RDB
    (--storage), or SQLite beside rows on this machine's disk (SQLite's file locks serialise its
    writers there, not across machines). StudyError, one line, otherwise."""
    me = registry.me
    unsafe = [
        d
        for d in others
        if "sqlite-copy" in (d.storage, me.storage) or (d.storage != "rdb" and d.host != me.host)
    ]
    if unsafe:
        why = (
            "each driver of a study on a URI keeps its own SQLite copy of the Optuna study, and the last to "
            "end would overwrite the other's"
            if on_uri
            else "SQLite is not safe to share between machines"
        )
        raise StudyError(
            f"another driver is running this study ({unsafe[0].describe()}): {why}; wait for it to "
            "end, or run every driver with --storage postgresql://... (pip install -e '.[postgres]')"
        )
