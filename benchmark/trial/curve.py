"""A trial's training curve: every step's loss and gradient norm, kept as a bounded number of
points (each the mean over a window of steps, with the window's largest loss so a one-step spike
survives the averaging), and the largest rise of the loss over its running best.

Torch-free: the loop (training.py) hands it the values it has read off the device. The points go
to the results store beside the trial's row (store/curves.py); the validation evaluations along
the way stay in the row's `evals` column."""

from __future__ import annotations

import math
from typing import Any, Callable

# At most this many points per run: about 6 kB of Parquet a trial, and enough to see a spike's
# step to within 0.5% of the run.
CURVE_POINTS = 200


class Curve:
    def __init__(
        self,
        total: int,
        tokens_per_step: int,
        lr_at: Callable[[int], float],
        on_point: Callable[[dict[str, Any]], None] | None = None,
        points: int = CURVE_POINTS,
    ):
        self.total, self.tokens_per_step, self.lr_at, self.on_point = (
            total,
            tokens_per_step,
            lr_at,
            on_point,
        )
        self.every = max(1, math.ceil(total / points))
        self.points: list[dict[str, Any]] = []
        self._losses: list[float] = []
        self._norms: list[float] = []

    def add(self, step: int, loss: float, grad_norm: float) -> None:
        """Step `step` (0-based) trained at `loss` with gradient norm `grad_norm` (before clipping)."""
        self._losses.append(loss)
        self._norms.append(grad_norm)
        if (step + 1) % self.every == 0 or step + 1 == self.total:
            self.flush(step)

    def state(self) -> dict[str, Any]:
        """What a saved run state keeps of the curve: its points and its open window."""
        return {"points": self.points, "window": [self._losses, self._norms]}

    def restore(self, state: dict[str, Any]) -> None:
        self.points = list(state["points"])
        self._losses, self._norms = (list(v) for v in state["window"])

    def flush(self, step: int) -> None:
        """Close the window ending at `step` (a diverged run closes its last, partial one)."""
        if not self._losses:
            return
        finite = [x for x in self._norms if math.isfinite(x)]
        point = {
            "step": step + 1,
            "tokens": (step + 1) * self.tokens_per_step,
            "train_loss": sum(self._losses) / len(self._losses),
            "train_loss_max": max(self._losses),
            "lr": self.lr_at(step),
            "grad_norm": sum(finite) / len(finite) if finite else math.nan,
        }
        self._losses, self._norms = [], []
        self.points.append(point)
        if self.on_point is not None:
            self.on_point(point)


def largest_rise(losses: list[float]) -> float:
    """max over steps t of loss[t] - min(loss[:t]): how far the training loss ever rose above
    the best it had reached (nats; 0 for a loss that never rose). A run that blew up and came
    back shows here though its final loss may not (Wortsman et al. 2023, arXiv 2309.14322, §3:
    loss spikes as the small-scale sign of an instability)."""
    best, rise = math.inf, 0.0
    for loss in losses:
        if loss - best > rise:
            rise = loss - best
        best = min(best, loss)
    return rise
