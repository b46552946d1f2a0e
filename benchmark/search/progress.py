"""What each running trial has done, for the live view (a 5-minute trial should not show
only "1 running"). Trials post their step, loss and tokens to one small Ray actor (fire and forget,
at most every `EVERY_S` seconds), which works the same on one machine and on a cluster; the Tune
callback polls it without blocking and hands the view what it read.

Not Tune results: a result without the objective's value breaks Tune's metric check, and a NaN one
would reach ASHA's rungs.

Runs trained as Ray tasks (search/dispatch.py) also post their stage here: asked (by their trial),
started (by the task, on its node), ended (by their trial). A trial holds no resources then, so it
is always RUNNING; the callback tells a run that cannot start from one that trains by these
stages. A run started on a node that has since died counts as asked: Ray is running its task
again, or Tune its trial (gone with the node), which asks for it anew, and a run that then cannot
start must stop the search as any other (search/callback.py). A run
whose evaluations are its trial's intermediate results (ASHA's rungs, Optuna's intermediate
values) posts each here too, and its trial, which alone can report to Tune, reads them back; the
callback says here which trials the driver has ended, so that their runs are cancelled."""

from __future__ import annotations

import time
from typing import Any, Callable

EVERY_S = 2.0
STAGES = ("asked", "started", "ended")  # a run task's, in order


class Board:
    """The actor's state: trial key -> its latest progress; run task -> its stage. `alive()`: the
    ids of the cluster's live nodes (default: Ray's)."""

    def __init__(self, alive: Callable[[], set[str]] | None = None):
        self.state: dict[str, dict[str, Any]] = {}
        self.runs: dict[str, str] = {}
        self.nodes: dict[str, str] = {}  # run task -> the node it started on
        self.trials: dict[str, int] = {}  # run task -> the Optuna trial that asked for it
        self.alive = alive or _alive_nodes
        self.evals: dict[str, list[dict[str, Any]]] = {}  # run task -> its evaluations so far
        self.stopped: set[int] = set()  # Optuna trials the driver has ended

    def update(self, key: str, info: dict[str, Any]) -> None:
        self.state[key] = info

    def ask(self, trial: int, runs: list[str]) -> None:
        """Optuna trial `trial` hands `runs` to Ray: asked, whatever they were (a trial run again
        after its node was lost asks anew for runs that had started). Posted before their tasks
        exist (dispatch.run_all waits for it), so no task's `started` comes before it."""
        for run in runs:
            self.runs[run], self.trials[run] = "asked", trial
            self.nodes.pop(run, None)

    def stage(self, run: str, stage: str, node: str | None = None) -> None:
        """A run task's stage after its ask, never set back: a task run again after a lost
        worker says `started` again, on its new `node`."""
        if STAGES.index(stage) >= STAGES.index(self.runs.get(run, stage)):
            self.runs[run] = stage
            if node is not None:
                self.nodes[run] = node

    def evaluated(self, run: str, record: dict[str, Any]) -> None:
        self.evals.setdefault(run, []).append(record)

    def stop(self, trial: int) -> None:
        """The driver has ended Optuna trial `trial` (it finished, ASHA stopped it, or it failed
        for good, its runs never told ended by a trial that died with its node)."""
        self.stopped.add(trial)
        for run, asker in self.trials.items():
            if asker == trial:
                self.runs[run] = "ended"

    def news(self, trial: int, run: str | None, since: int) -> dict[str, Any]:
        """For a trial waiting on its run tasks: whether it has been ended, and the evaluations of
        `run` after its first `since` (those read are not asked for again)."""
        return {
            "stopped": trial in self.stopped,
            "evaluations": self.evals.get(run, [])[since:] if run else [],
        }

    def read(self) -> dict[str, Any]:
        """Each trial's progress, and how many run tasks wait to start and how many train (a run
        started on a node that has died waits again)."""
        alive = self.alive() if "started" in self.runs.values() else set()
        lost = {r for r, node in self.nodes.items() if node not in alive}
        stages = ["asked" if s == "started" and r in lost else s for r, s in self.runs.items()]
        return {
            "progress": dict(self.state),
            "runs": {s: stages.count(s) for s in STAGES[:2]},
        }


def _alive_nodes() -> set[str]:
    import ray

    return {n["NodeID"] for n in ray.nodes() if n["Alive"]}


def start_board():
    """The board as a Ray actor (no CPU of its own, so it never takes a trial's place), on the
    driver's node: placed on a worker node, it died with that node and took the search with it
    (seen once in tests/test_cluster.py's lost-node test)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = NodeAffinitySchedulingStrategy(
        node_id=ray.get_runtime_context().get_node_id(), soft=False
    )
    return ray.remote(num_cpus=0)(Board).options(scheduling_strategy=here).remote()


def reporter(board, key: str, tokens_per_step: int) -> Callable[[int, int, float], None] | None:
    """run_trial's on_step for one trial: posts (step, total, loss, tokens, time) every EVERY_S."""
    if board is None:
        return None
    last = [0.0]

    def on_step(step: int, total: int, loss: float) -> None:
        now = time.time()
        if now - last[0] >= EVERY_S or step == total:
            last[0] = now
            board.update.remote(
                key,
                {
                    "step": step,
                    "total": total,
                    "loss": loss,
                    "time": now,
                    "tokens": step * tokens_per_step,
                    "tokens_total": total * tokens_per_step,
                },
            )

    return on_step


class Poll:
    """Reads the board from the driver without ever waiting for it."""

    def __init__(self, board, every_s: float = 1.0):
        self.board, self.every_s, self.pending, self.asked = board, every_s, None, 0.0

    def __call__(self) -> dict[str, Any] | None:
        """The board's latest read (Board.read), once it has come; None meanwhile."""
        import ray

        if self.board is None:
            return None
        if self.pending is None:
            if (
                time.monotonic() - self.asked >= self.every_s
            ):  # Tune's loop turns many times a second
                self.pending, self.asked = self.board.read.remote(), time.monotonic()
            return None
        ready, _ = ray.wait([self.pending], timeout=0)
        if not ready:
            return None
        state, self.pending = ray.get(ready[0]), None
        return state
