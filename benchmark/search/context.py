"""What every trial of one search shares, fixed when the search starts: one frozen value that Ray
Tune ships to each worker with the trainable, and that the rows, the live view and the Optuna
attributes read (in place of a loose dict)."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from benchmark.recipe import QuantizeConfig, TrainConfig, parse_tokens
from benchmark.store import is_uri
from benchmark.store.location import join

# the runs' saved states; "_": no reader of the study's rows looks inside
STATE_DIR = "_runstate"

if TYPE_CHECKING:  # the command line reads this package without loading the data stack
    from benchmark.data import DataConfig


@dataclass(frozen=True, kw_only=True)
class TrialContext:
    study: str
    study_dir: str  # absolute path or URI: workers may run in another directory
    fallback_dir: str | None = None  # rows go here when the results disk is full (rows.write)
    data: DataConfig
    training: Mapping[str, Any]  # the space's `training:` section (plus eval_every for ASHA)
    quantize: Mapping[str, Any] = field(default_factory=dict)  # the space's `quantize:` section
    count: str  # the budget's count rule: which column `params` is
    objectives: tuple[str, ...]  # metric names, as declared (store/metrics.py)
    seed: int = 0
    seeds: int = 1  # every candidate is trained with seeds seed .. seed+seeds-1
    retries: int = 1
    threads: int = 1  # torch threads per trial
    workers: Any = None  # a Train job's workers (trial/distributed.py Workers); None: one process
    checkpoints: bool = False  # keep each run's final weights (--save-weights)
    checkpoint_every: str | None = (
        None  # runs save their state (trial/runstate.py); None: its default
    )
    keep_checkpoints: bool = False  # keep a finished run's saved state (--keep-checkpoints)
    step_timeout: str | None = None  # the watchdog's limit (trial/watchdog.py); None: its default
    # each run a Ray task asking for these ({"cpu", "gpu"}: search/dispatch.py); None: the runs
    # train inside their candidate's trial, one after another
    run_resources: Mapping[str, float] | None = None
    policy: Mapping[str, Any] = field(
        default_factory=dict
    )  # precision / compile / device overrides
    progress: Any = None  # the progress board's actor handle (search/progress.py)
    tune: Any = None  # the space's `tune:` (space/tuning.Tune): each candidate tuned first
    report_curves: bool = False  # report each curve point to Tune (--tensorboard, --mlflow)
    diverged: str = "worst"  # the space's `diverged:`: what a diverged final seed counts as
    # run key -> the row file of a measured run the search takes instead of training it (--reuse-runs)
    reuse: Mapping[str, str] = field(default_factory=dict)

    def trial_id(self, number: int, seed: int | None = None) -> str:
        """A trial's name in the results: its Optuna number, plus the seed when there are several."""
        seed = self.seed if seed is None else seed
        return f"t{number:04d}" + (f"-s{seed}" if self.seeds > 1 else "")

    def seed_list(self) -> list[int]:
        return [self.seed + k for k in range(self.seeds)]

    def train_config(
        self, seed: int, setting: Mapping[str, Any] | None = None, budget: int | None = None
    ):
        """`setting`: training settings a `tune:` grid sets over the space's (a point of the grid);
        `budget`: the candidate's, which `tokens_per: budget` multiplies (resolved here to the
        tokens every candidate of that budget trains, so the row records the amount)."""
        # as SearchSpace.trial_training: `tokens_per` defaults to the budget's count, the space may set it
        raw = {"tokens_per": self.count, **self.training, **(setting or {})}
        if raw["tokens_per"] == "budget":
            if budget is None:
                raise ValueError("tokens_per: budget needs the candidate's budget")
            raw.update(tokens=parse_tokens(raw["tokens"]).resolve(budget), tokens_per=self.count)
        return TrainConfig.from_dict({**raw, "seed": seed, **self.policy})

    def quantize_config(self):
        return QuantizeConfig.from_dict(self.quantize)

    def state_dir(self) -> str:
        """Where runs save their state part-way (trial/runstate.py): in the study, wherever it lives."""
        return join(self.study_dir, STATE_DIR)

    def checkpoint_dir(self, trial_id: str) -> Path | None:
        """Local folder the trial saves its weights to: in the study, or, for results on a URI, a
        local staging folder that the trainable copies to <study>/_checkpoints/ (upload_checkpoint)."""
        if not self.checkpoints:
            return None

        if is_uri(self.study_dir):
            return Path(tempfile.gettempdir()) / "shapebench-checkpoints" / self.study / trial_id
        return Path(self.study_dir) / "_checkpoints" / trial_id
