"""What a person sees while a search runs: a live rich panel (trials done / running / failed, the
current best, each running trial's tokens, loss, tokens/s and ETA, the search's ETA), or, when
the console is not a terminal (a log file), the same as plain lines every PLAIN_EVERY_S seconds.
It only displays: the Tune callback (search/callback.py) tells it what happened, and the progress
board (search/progress.py) what each running trial has done."""

from __future__ import annotations

import re
import time

PLAIN_EVERY_S = 30.0  # a log gets a status line this often
STALE_S = 120.0  # a trial that has posted nothing for this long is not shown as running


class LiveView:
    def __init__(
        self,
        console,
        study: str,
        total: int,
        metric: str,
        maximize: bool = False,
        seeds: int = 1,
        first_seed: int = 0,
        tune=None,
    ):
        self.console, self.study, self.total, self.metric, self.maximize = (
            console,
            study,
            total,
            metric,
            maximize,
        )
        self.seeds, self.first_seed = seeds, first_seed  # a trial's seed runs, one after another
        # space/tuning.Tune: a tuned trial trains its grid on its tuning seeds first
        self.tune = tune
        self.runs = (tune.runs if tune is not None else 0) + seeds  # a trial's, one after another
        self.running: dict[str, float] = {}  # trial -> start time
        self.statuses: dict[str, int] = {}
        self.finished = 0
        self.spans: list[float] = []  # start -> complete, as the driver saw it
        self.around: list[float] = []  # span - wall inside run_trial, per trial that reported it
        self.best: tuple[float, str] | None = None
        self.started = time.perf_counter()
        self._live = None
        self.trials: dict[str, dict] = {}  # trial -> its latest progress, with tokens/s
        self.ended: dict[str, float] = {}  # trial-name prefix -> when it ended
        self.progress_reads = 0
        self._printed = time.perf_counter()

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

    def progress(self, state: dict[str, dict]) -> None:
        """The progress board's latest read: keeps tokens/s from successive posts of each trial."""
        self.progress_reads += 1
        for key, info in state.items():
            before = self.trials.get(key)
            rate = before.get("rate") if before else None
            if before and info["time"] > before["time"] and info["tokens"] >= before["tokens"]:
                rate = (info["tokens"] - before["tokens"]) / (info["time"] - before["time"])
            self.trials[key] = {**info, "rate": rate}
        self.refresh()

    def forget(self, prefix: str) -> None:
        """A trial ended (finished, stopped by ASHA, failed): its progress, on the board until a
        run of it posts again, is no longer shown."""
        self.ended[prefix] = time.time()

    def active(self) -> list[tuple[str, dict]]:
        """Trials still training that posted lately, by name."""
        now = time.time()
        return sorted(
            (k, v)
            for k, v in self.trials.items()
            if v["step"] < v["total"] and now - v["time"] < STALE_S and not self._ended(k, v)
        )

    def finishing(self) -> list[tuple[str, dict]]:
        """Seed runs whose training is done and whose trial goes on with its evaluations and
        quantisation (no later seed run of it has posted yet), by name. Not bounded by STALE_S:
        a run posts nothing while it evaluates (minutes for a large model's GPTQ on a CPU), and
        the callback ends it with its trial (`forget`), a lost worker's too."""
        latest: dict[str, float] = {}
        for k, v in self.trials.items():
            trial = run_of(k)[0]
            latest[trial] = max(latest.get(trial, 0.0), v["time"])
        return sorted(
            (k, v)
            for k, v in self.trials.items()
            if v["step"] >= v["total"]
            and not self._ended(k, v)
            and v["time"] >= latest[run_of(k)[0]]
        )

    def shown(self) -> list[tuple[str, dict]]:
        """The seed runs the view lists: training, then finishing."""
        return sorted(self.active() + self.finishing())

    def _ended(self, key: str, info: dict) -> bool:
        return any(key.startswith(p) and info["time"] <= t for p, t in self.ended.items())

    def trial_done(self, key: str, status: str, wall_s: float | None) -> None:
        start = self.running.pop(key, None)
        if start is not None:
            self.spans.append(time.perf_counter() - start)
        if wall_s is not None and start is not None:
            self.around.append(max(0.0, self.spans[-1] - wall_s))
        self.statuses[status] = self.statuses.get(status, 0) + 1
        self.finished += 1
        self.refresh()

    # ---- rendering -----------------------------------------------------------------------
    def __enter__(self):
        if self.console is not None and self.console.is_terminal:
            from rich.live import Live

            self._live = Live(
                self.render(), console=self.console, refresh_per_second=2, transient=False
            )
            self._live.__enter__()
        return self

    def __exit__(self, *exc):
        if self._live is not None:
            self._live.update(self.render())
            self._live.__exit__(*exc)
        elif self.console is not None:
            self.console.print(self.plain(), soft_wrap=True)  # a log's last status line

    def render(self):
        from rich.table import Table

        t = Table.grid(padding=(0, 2))
        counts = " ".join(f"{k} {v}" for k, v in sorted(self.statuses.items())) or "-"
        t.add_row("[bold]study[/bold]", self.study)
        t.add_row(
            "trials", f"{self.finished}/{self.total} done, {len(self.running)} running ({counts})"
        )
        if self.best:
            t.add_row(f"best {self.metric}", f"{self.best[0]:.4f}  {self.best[1]}")
        for key, info in self.shown():
            t.add_row(f"  {key}", trial_line(info))
        eta = self.eta_s()
        t.add_row(
            "elapsed / ETA",
            f"{_hms(time.perf_counter() - self.started)} / {_hms(eta) if eta is not None else '?'}",
        )
        return t

    def refresh(self):
        if self._live is not None:
            self._live.update(self.render())
        elif self.console is not None and time.perf_counter() - self._printed >= PLAIN_EVERY_S:
            self._printed = time.perf_counter()
            self.console.print(self.plain(), soft_wrap=True)

    def plain(self) -> str:
        """One line for a log: counts, elapsed / ETA, then each running trial."""
        eta = self.eta_s()
        head = (
            f"[{_hms(time.perf_counter() - self.started)} / ETA {_hms(eta) if eta is not None else '?'}] {self.study}: "
            f"{self.finished}/{self.total} done, {len(self.running)} running"
        )
        return "; ".join([head, *(f"{k} {trial_line(v)}" for k, v in self.shown())])

    def eta_s(self) -> float | None:
        """The search's time left: the running trials' own ETAs, then the trials not yet started at
        the mean span of those finished (or, before any finished, of the running ones' totals)."""
        if self.finished >= self.total:
            return 0.0
        shown = self.shown()
        per_trial = sum(self.spans) / len(self.spans) if self.spans else None
        if per_trial is None:
            per_trial = (
                self.runs * max((trial_total_s(v) or 0 for _, v in shown), default=0) or None
            )
        if per_trial is None:
            return None
        running = [self._left(k, v, per_trial) for k, v in shown]
        known = [e for e in running if e is not None]
        waiting = max(0, self.total - self.finished - max(len(self.running), len(running)))
        parallel = max(1, len(self.running))
        # A running trial with no pace yet (just started, or between two seed runs) has about a
        # trial's span ahead of it, not nothing (seen: "2/3 done, 1 running, ETA 0:00" as the
        # quickstart's last trial started)
        if len(self.running) > len(known):
            known.append(per_trial)
        return (max(known) if known else 0.0) + waiting * per_trial / parallel

    def _left(self, key: str, info: dict, per_trial: float) -> float | None:
        """A running trial's time left: this run, then its later runs at this run's pace (a trial
        trains its tuning runs, then its seeds, one after another; a resumed trial skips those it
        has, so this may overstate). A run that has trained has its evaluations and quantisation
        left: a finished trial's span per run beyond this run's training time (0 before any trial
        has finished)."""
        eta = trial_eta(info)
        if eta is None:
            return None
        if info["step"] >= info["total"]:
            eta += max(0.0, per_trial / self.runs - (trial_total_s(info) or 0.0))
        _, point, seed = run_of(key)
        if point is not None and self.tune is not None and seed in self.tune.seeds:
            # a tuning run (search/tuning.settle: the grid's points in order, each on every tuning
            # seed): the rest of the grid, then the final seeds
            done = point * len(self.tune.seeds) + self.tune.seeds.index(seed) + 1
            later = self.tune.runs - done + self.seeds
        elif seed is None or self.seeds <= 1:
            return eta
        else:
            later = self.first_seed + self.seeds - 1 - seed
        return eta + max(0, later) * (trial_total_s(info) or 0.0)

    def overhead_s(self) -> float | None:
        """Mean orchestration time per trial: what the driver saw minus time inside the trial, over
        the trials that reported their time inside (a trial that ASHA stopped or that failed
        reports none, and its whole span would count as orchestration)."""
        return sum(self.around) / len(self.around) if self.around else None


def trial_eta(info: dict) -> float | None:
    rate = info.get("rate")
    return (info["tokens_total"] - info["tokens"]) / rate if rate else None


def trial_total_s(info: dict) -> float | None:
    rate = info.get("rate")
    return info["tokens_total"] / rate if rate else None


def run_of(key: str) -> tuple[str, int | None, int | None]:
    """A progress key as (trial, grid point, seed): `t0003-s1` -> (`t0003`, None, 1), one seed's
    `t0003` -> (`t0003`, None, None), a tuning run's `t0003-g2-s100` -> (`t0003`, 2, 100). The keys
    are search/context.py's trial ids and search/tuning.py's tuning runs: a trial's runs, tuning
    or final, are known as one trial's."""
    match = re.fullmatch(r"(.*?)(?:-g(\d+))?-s(\d+)", key)
    if not match:
        return key, None, None
    trial, point, seed = match.groups()
    return trial, int(point) if point is not None else None, int(seed)


def trial_line(info: dict) -> str:
    """`409.6K/800K tokens, loss 4.123, 2.1K tok/s, ETA 3:05`, or once trained
    `800K/800K tokens, loss 3.912, evaluating`."""
    rate, eta = info.get("rate"), trial_eta(info)
    if info["step"] >= info["total"]:
        return f"{_count(info['tokens'])}/{_count(info['tokens_total'])} tokens, loss {info['loss']:.3f}, evaluating"
    return (
        f"{_count(info['tokens'])}/{_count(info['tokens_total'])} tokens, loss {info['loss']:.3f}, "
        f"{_count(rate) + ' tok/s' if rate else '? tok/s'}, ETA {_hms(eta) if eta is not None else '?'}"
    )


def _count(n: float) -> str:
    for unit, size in (("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.4g}{unit}"
    return f"{n:.0f}"


def _hms(s: float) -> str:
    s = int(s)
    return (
        f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"
    )
