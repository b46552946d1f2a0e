"""Where a search's curves go besides the results store, for the tools people watch runs in:
TensorBoard (`--tensorboard`), MLflow (`--mlflow DIR`) and Weights & Biases (`--wandb PROJECT`),
through Ray Tune's own logger callbacks (TBXLoggerCallback, MLflowLoggerCallback,
WandbLoggerCallback), fed by the curve points each trial reports
(trainable.curve_reports). All are off by default: each point is a Tune result, which a search
that nobody watches need not pay for.

TensorBoard's event files go beside each Tune trial's state, `<study>/_ray/<trial>/` (`tensorboard
--logdir results/<study>/_ray`). MLflow's file store is in maintenance mode since MLflow 3 (it
refuses to start without MLFLOW_ALLOW_FILE_STORE), so `--mlflow DIR` keeps its local store in the
SQLite file `DIR/mlflow.db` (`mlflow ui --backend-store-uri sqlite:///DIR/mlflow.db`); a URI
(sqlite:///..., http://...) is used as given. Only metrics and parameters are logged, no artifacts."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any, Callable

TAGS = "curve"  # the reported results' key: a run's series are curve/<trial_id>/<column>
FLAGS = ("tensorboard", "wandb", "mlflow")  # a search's only: a plan has no curves to log


def add_flags(add: Callable[..., None]) -> None:
    """The flags, through the search parser's `add` (command._search_flags)."""
    add(
        "--tensorboard",
        action="store_true",
        help="also log every trial's curve as TensorBoard "
        "event files under <study>/_ray/ (Ray Tune's TBXLoggerCallback)",
    )
    add(
        "--wandb",
        metavar="PROJECT",
        help="also log every trial's curve to Weights & Biases, as runs of PROJECT grouped by the "
        "study (Ray Tune's WandbLoggerCallback; WANDB_MODE=offline keeps them on disk; "
        "pip install -e '.[loggers]')",
    )
    add(
        "--mlflow",
        metavar="DIR",
        help="also log every trial's curve to MLflow: a local store in DIR "
        "(SQLite, DIR/mlflow.db), or a tracking URI (pip install -e '.[loggers]')",
    )


def options(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "tensorboard": bool(getattr(args, "tensorboard", False)),
        "mlflow": getattr(args, "mlflow", None),
        "wandb": getattr(args, "wandb", None),
    }


def tracking_uri(where: str) -> str:
    """A folder -> its SQLite store; a URI as given."""
    if "://" in where:
        return where
    folder = Path(where).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{folder / 'mlflow.db'}"


def callbacks(tensorboard: bool, mlflow: str | None, study: str, wandb: str | None = None) -> list:
    """The logger callbacks asked for (an MLflow experiment per study, named as the study; a W&B
    project's runs grouped by the study)."""
    out = []
    if tensorboard or mlflow or wandb:
        # The curve points are results without the objective, which Tune's controller refuses
        # unless told; ASHA and the searcher skip them (searcher.AttributedSearch.on_trial_result).
        os.environ["TUNE_DISABLE_STRICT_METRIC_CHECKING"] = "1"
    if tensorboard:
        from ray.tune.logger import TBXLoggerCallback

        out.append(TBXLoggerCallback())
    if mlflow:
        from ray.air.integrations.mlflow import MLflowLoggerCallback

        out.append(
            MLflowLoggerCallback(
                tracking_uri=tracking_uri(mlflow), experiment_name=study, tags={"study": study}
            )
        )
    if wandb:
        from ray.air.integrations.wandb import WandbLoggerCallback

        # each Tune trial a W&B run of `wandb` (the project), grouped by study; WANDB_MODE=offline
        # keeps them on disk (`wandb sync` later), WANDB_DIR says where
        out.append(WandbLoggerCallback(project=wandb, group=study, tags=[study]))
    return out
