"""What a person sees while a search runs: a live rich panel (trials done / running / failed, the
current best, ETA). It only displays: the Tune callback (search/callback.py) tells it what
happened."""

from __future__ import annotations

import time


class LiveView:
    def __init__(self, console, study: str, total: int, metric: str, maximize: bool = False):
        self.console, self.study, self.total, self.metric, self.maximize = console, study, total, metric, maximize
        self.running: dict[str, float] = {}      # trial -> start time
        self.statuses: dict[str, int] = {}
        self.finished = 0
        self.trial_walls: list[float] = []       # seconds inside run_trial, per finished trial
        self.spans: list[float] = []             # start -> complete, as the driver saw it
        self.best: tuple[float, str] | None = None
        self.started = time.perf_counter()
        self._live = None

    def __getstate__(self):
        # Tune pickles its callbacks with the experiment state; the terminal stays with the driver.
        return {**self.__dict__, "console": None, "_live": None}

    # ---- what happened -------------------------------------------------------------------
    def trial_started(self, key: str) -> None:
        self.running[key] = time.perf_counter()
        self.refresh()

    def trial_result(self, value: float, label: str) -> None:
        if self.best is None or (value > self.best[0] if self.maximize else value < self.best[0]):
            self.best = (value, label)
        self.refresh()

    def trial_done(self, key: str, status: str, wall_s: float | None) -> None:
        start = self.running.pop(key, None)
        if start is not None:
            self.spans.append(time.perf_counter() - start)
        if wall_s is not None:
            self.trial_walls.append(wall_s)
        self.statuses[status] = self.statuses.get(status, 0) + 1
        self.finished += 1
        self.refresh()

    # ---- rendering -----------------------------------------------------------------------
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


def _hms(s: float) -> str:
    s = int(s)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"
