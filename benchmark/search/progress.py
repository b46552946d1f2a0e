"""What each running trial has done, for the live view (a 5-minute trial should not show
only "1 running"). Trials post their step, loss and tokens to one small Ray actor (fire and forget,
at most every `EVERY_S` seconds), which works the same on one machine and on a cluster; the Tune
callback polls it without blocking and hands the view what it read.

Not Tune results: a result without the objective's value breaks Tune's metric check, and a NaN one
would reach ASHA's rungs."""

from __future__ import annotations

import time
from typing import Any, Callable

EVERY_S = 2.0


class Board:
    """The actor's state: trial key -> its latest progress."""

    def __init__(self):
        self.state: dict[str, dict[str, Any]] = {}

    def update(self, key: str, info: dict[str, Any]) -> None:
        self.state[key] = info

    def read(self) -> dict[str, dict[str, Any]]:
        return dict(self.state)


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

    def __call__(self) -> dict[str, dict[str, Any]] | None:
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
