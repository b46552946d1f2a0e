"""What a person sees while a search runs: a live rich panel (trials done / running / failed,
the current best, tokens/s, ETA), fed by a Ray Tune callback. The callback also records the
trials that never wrote their own row: stopped early by ASHA (`pruned`) or whose worker died."""

from __future__ import annotations

import json
import math
import time
from typing import Any

from benchmark.search.driver import trial_id
from benchmark.store.results import finished_trials, write_row


class LiveView:
    def __init__(self, console, study: str, total: int, metric: str):
        self.console, self.study, self.total, self.metric = console, study, total, metric
        self.running: dict[str, float] = {}      # trial -> start time
        self.statuses: dict[str, int] = {}
        self.finished = 0
        self.trial_walls: list[float] = []       # seconds inside run_trial, per finished trial
        self.spans: list[float] = []             # start -> complete, as the driver saw it
        self.best: tuple[float, str] | None = None
        self.tokens_per_s: float | None = None
        self.started = time.perf_counter()
        self._live = None

    def __getstate__(self):
        # Tune pickles its callbacks with the experiment state; the terminal stays with the driver.
        return {**self.__dict__, "console": None, "_live": None}

    # ---- rendering ----------------------------------------------------------------------
    def __enter__(self):
        if self.console is not None:
            from rich.live import Live

            self._live = Live(self.render(), console=self.console, refresh_per_second=2, transient=False)
            self._live.__enter__()
        return self

    def __exit__(self, *exc):
        if self._live is not None:
            self._live.update(self.render())
            self._live.__exit__(*exc)

    def render(self):
        from rich.table import Table

        t = Table.grid(padding=(0, 2))
        counts = " ".join(f"{k} {v}" for k, v in sorted(self.statuses.items())) or "-"
        t.add_row("[bold]study[/bold]", self.study)
        t.add_row("trials", f"{self.finished}/{self.total} done, {len(self.running)} running ({counts})")
        if self.best:
            t.add_row(f"best {self.metric}", f"{self.best[0]:.4f}  {self.best[1]}")
        if self.tokens_per_s:
            t.add_row("tokens/s", f"{self.tokens_per_s:,.0f}")
        eta = self.eta_s()
        t.add_row("elapsed / ETA", f"{_hms(time.perf_counter() - self.started)} / {_hms(eta) if eta else '?'}")
        return t

    def refresh(self):
        if self._live is not None:
            self._live.update(self.render())

    def eta_s(self) -> float | None:
        if not self.spans:
            return None
        left = self.total - self.finished
        return left * sum(self.spans) / len(self.spans) / max(1, len(self.running) or 1)

    def overhead_s(self) -> float | None:
        """Mean orchestration time per trial: what the driver saw minus time inside the trial."""
        if not self.trial_walls:
            return None
        return max(0.0, (sum(self.spans) - sum(self.trial_walls)) / len(self.trial_walls))

    # ---- the Tune callback --------------------------------------------------------------
    def callback(self, opts, ctx: dict[str, Any]):
        from ray.tune import Callback

        view = self

        class _Callback(Callback):
            def on_trial_start(self, iteration, trials, trial, **info):
                view.running[trial.trial_id] = time.perf_counter()
                view.refresh()

            def on_trial_result(self, iteration, trials, trial, result, **info):
                loss = result.get(view.metric)
                if loss is not None and math.isfinite(loss) and (view.best is None or loss < view.best[0]):
                    view.best = (loss, f"{trial.config.get('family')} {trial.config.get('spec', {}).get('d_model', '')}d")
                view.refresh()

            def on_trial_complete(self, iteration, trials, trial, **info):
                view._done(trial, ctx, error=False)

            def on_trial_error(self, iteration, trials, trial, **info):
                view._done(trial, ctx, error=True)

        return _Callback()

    def _done(self, trial, ctx, error: bool) -> None:
        start = self.running.pop(trial.trial_id, None)
        if start is not None:
            self.spans.append(time.perf_counter() - start)
        last = trial.last_result or {}
        if last.get("row_written"):
            status = last.get("status", "ok")
            self.trial_walls.append(float(last.get("trial_wall_s") or 0.0))
        else:
            status = "failed" if error else "pruned"
            _record_unwritten(trial, last, ctx, status)
        self.statuses[status] = self.statuses.get(status, 0) + 1
        self.finished += 1
        self.refresh()


def _record_unwritten(trial, last: dict, ctx: dict, status: str) -> None:
    """A row for a trial that ended without writing one (ASHA stopped it, or its worker died)."""
    config = trial.config
    number = int(config["optuna_trial"])
    name = trial_id(number, ctx, ctx["seed"])
    if status == "failed" and name in finished_trials(ctx["study_dir"]):
        return  # the trainable recorded its failed attempts itself
    loss = last.get("val_loss")
    write_row(ctx["study_dir"], {
        "study": ctx["study"], "trial_id": name, "status": status, "optuna_trial": number,
        "error": None if status == "pruned" else (str(getattr(trial, "error_msg", None) or "the trial's worker died")),
        "family": config.get("family"), "spec": json.dumps(config.get("spec"), sort_keys=True),
        "params_total": config.get("params_total"), "params_non_embedding": config.get("params_non_embedding"),
        "budget": config.get("budget"), "budget_count": config.get("count"),
        "budget_distance": config.get("budget_distance"), "seed": ctx["seed"],
        "tokens_trained": last.get("tokens"), "val_loss": loss,
        "val_ppl": math.exp(loss) if loss is not None and math.isfinite(loss) else None,
    })


def _hms(s: float) -> str:
    s = int(s)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"
