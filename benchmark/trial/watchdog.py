"""A run that stops making steps (a hung collective, a wedged device, a stuck read) is ended, so
that it runs again from its saved state (trial/runstate.py) instead of holding its GPU for ever.

A thread beside the training loop watches the time since the last step (an evaluation or a save
counts as one: each is a beat). Once the run has made its first step (which pays for compilation),
a run with no beat for the limit is ended: one line on stderr (Ray forwards a worker's to the
driver's console), the stall counted beside the run's state (the row's `stalls`), and the process
exits, which Ray sees as a lost worker: the task (search/dispatch.py) or the trial runs again and
continues from the run's last save. The limit is `--step-timeout`, or by default STALL_STEPS times
the run's mean step so far, never under STALL_MIN_S (a step of a long run is seconds; a save or an
evaluation is a beat of its own)."""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Callable

STALL_STEPS = 100
STALL_MIN_S = 600.0
# The exit status of a run the watchdog ended: not 0, so that Ray counts its worker as lost.
STALLED_EXIT = 75


class Watchdog:
    """`limit_s`: the stall limit (None: from the run's own step time); `on_stall(idle_s,
    limit_s)` is called from the watching thread once the run has made no step for the limit."""

    def __init__(self, limit_s: float | None, on_stall: Callable[[float, float], None]):
        self.fixed, self.on_stall = limit_s, on_stall
        self.started = self.last = None  # monotonic times: the first step's end, the last beat
        self.steps = 0
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    def limit(self) -> float:
        if self.fixed is not None:
            return self.fixed
        mean = (self.last - self.started) / self.steps if self.steps else 0.0
        return max(STALL_MIN_S, STALL_STEPS * mean)

    def beat(self, step: bool = True) -> None:
        """A step (or an evaluation, a save: step=False) ended now."""
        now = time.monotonic()
        if self.started is None:
            self.started = now
            self._thread = threading.Thread(target=self._watch, daemon=True, name="watchdog")
            self._thread.start()
        elif step:
            self.steps += 1
        self.last = now

    def close(self) -> None:
        self._done.set()

    def _watch(self) -> None:
        while not self._done.wait(min(1.0, self.limit() / 10)):
            idle = time.monotonic() - self.last
            if idle > self.limit():
                self.on_stall(idle, self.limit())
                return


def end_process(line: str) -> None:
    """The stalled run's end: its line, then the process exits at once (the hung step never
    returns, so nothing else could end it)."""
    print(line, file=sys.stderr, flush=True)
    os._exit(STALLED_EXIT)


# Tests only: "<marker file>:<step>" makes a watched run sleep inside that step, once (the marker
# says it has), so that the watchdog ends it and its retry goes through (tests/test_runstate.py).
FAULT = "SHAPEBENCH_TEST_STALL"


def stall_fault() -> Callable[[int], None] | None:
    given = os.environ.get(FAULT)
    if not given:
        return None
    marker, _, at = given.rpartition(":")

    def fault(step: int) -> None:
        if step == int(at) and not os.path.exists(marker):
            open(marker, "w").close()
            time.sleep(3600)

    return fault
