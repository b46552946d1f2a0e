"""The live view of a search: each running trial's tokens, loss, tokens/s and
ETA, the search's ETA from them, and plain lines when the console is a log, not a terminal."""

import io
import time

import pytest
from rich.console import Console

from benchmark.search import live, tuning
from benchmark.search.live import LiveView, trial_line
from benchmark.space.tuning import Tune


def post(step, total=100, loss=4.0, at=None, per_step=1000):
    return {
        "step": step,
        "total": total,
        "loss": loss,
        "time": at if at is not None else time.time(),
        "tokens": step * per_step,
        "tokens_total": total * per_step,
    }


def logged(monkeypatch, study, **kwargs):
    """A view writing a plain line at every refresh, as to a log, and what it wrote."""
    monkeypatch.setattr(live, "PLAIN_EVERY_S", 0.0)
    out = io.StringIO()
    console = Console(file=out, force_terminal=False, width=400)
    return out, LiveView(console, study, metric="val_loss", **kwargs)


def test_a_running_trial_shows_tokens_loss_rate_and_eta():
    view = LiveView(None, "s", total=3, metric="val_loss")
    view.trial_started("tune-1")
    now = time.time()
    view.progress({"t0000": post(10, at=now - 10)})
    view.progress({"t0000": post(30, loss=3.5, at=now)})  # 20 steps of 1000 tokens in 10 s
    ((key, info),) = view.active()
    assert key == "t0000" and info["rate"] == pytest.approx(2000.0)
    assert trial_line(info) == "30K/100K tokens, loss 3.500, 2K tok/s, ETA 0:35"
    # the search: 35 s for this trial, then two more of (before any finished) 100K / 2K = 50 s each
    assert view.eta_s() == pytest.approx(35 + 2 * 50, rel=1e-6)
    view.trial_done("tune-1", "ok", 40.0)
    view.progress({"t0000": post(100, at=now + 35)})
    assert view.active() == []  # done training: not shown as running


def test_the_search_eta_counts_the_seeds_a_running_trial_has_still_to_train():
    """A trial trains its seeds one after another: with seeds 3..5, seed 4's run has seed 5's
    run after it (seen in the quickstart: ETA 0:03 while one seed run of 95 s was still to come)."""
    view = LiveView(None, "s", total=2, metric="val_loss", seeds=3, first_seed=3)
    view.trial_started("tune-1")
    now = time.time()
    view.progress({"t0000-s4": post(10, at=now - 10)})
    view.progress({"t0000-s4": post(30, at=now)})  # 2K tokens/s: 35 s left, 50 s per seed run
    assert view.eta_s() == pytest.approx(35 + 50 + 1 * 3 * 50, rel=1e-6)  # then one trial of 3 runs
    view.progress({"t0000-s5": post(30, at=now + 1)})
    assert view._left("t0000-s5", view.trials["t0000-s5"], 150.0) is None  # no pace of its own yet


def test_a_trial_that_has_not_reported_yet_counts_as_a_whole_trial():
    view = LiveView(None, "s", total=3, metric="val_loss")
    for key in ("tune-1", "tune-2"):
        view.trial_started(key)
        view.running[key] -= 100.0  # started 100 s ago: a span of 100 s as the driver sees it
        view.trial_done(key, "ok", 95.0)
    view.trial_started("tune-3")
    assert view.eta_s() == pytest.approx(100.0, rel=1e-3)  # was 0:00 until its first progress post


def test_stale_or_finished_trials_are_not_shown():
    view = LiveView(None, "s", total=2, metric="val_loss")
    view.progress({"old": post(5, at=time.time() - live.STALE_S - 1), "done": post(100)})
    assert view.active() == []


def test_a_long_evaluation_stays_shown_until_its_trial_ends():
    """A run posts nothing while it evaluates and quantises; that can outlast STALE_S."""
    view = LiveView(None, "s", total=2, metric="val_loss")
    view.progress({"t0001": post(100, at=time.time() - live.STALE_S - 60)})
    assert [k for k, _ in view.shown()] == ["t0001"]
    view.forget("t0001")
    assert view.shown() == []


def test_a_log_gets_plain_status_lines(monkeypatch):
    out, view = logged(monkeypatch, "quick", total=6)
    with view:
        view.trial_started("tune-1")
        now = time.time()
        view.progress({"t0002": post(10, at=now - 5)})
        view.progress({"t0002": post(20, loss=4.25, at=now)})
    lines = [line for line in out.getvalue().splitlines() if line]
    assert lines and all("quick: 0/6 done, 1 running" in line for line in lines)
    assert "t0002 20K/100K tokens, loss 4.250, 2K tok/s, ETA 0:40" in lines[-1]
    assert "\x1b[" not in out.getvalue()  # no terminal control codes in a log


def test_a_trial_that_ended_is_no_longer_shown_running():
    """Stopped by ASHA after one post: the board still holds it, the view must not."""
    view = LiveView(None, "s", total=2, metric="val_loss")
    view.progress({"t0002": post(1), "t0003-s1": post(5), "t0003-s2": post(5)})
    view.forget("t0003")
    assert [k for k, _ in view.active()] == ["t0002"]
    view.progress({"t0002": post(2)})  # a later read of the board keeps what is known
    assert [k for k, _ in view.active()] == ["t0002"]


def test_a_seed_run_that_has_trained_shows_as_evaluating_until_its_trial_goes_on(monkeypatch):
    """After its last step a seed run evaluates and quantises (~10 s in the quickstart): the view
    says so and keeps an ETA (seen before: "[4:02 / ETA ?] quickstart: 0/3 done, 1 running").
    Once the trial's next seed run posts, or the trial ends, the finished run is not shown."""
    out, view = logged(monkeypatch, "quick", total=3, seeds=2)
    view.trial_started("tune-1")
    now = time.time() - 70  # every post below lies in the past, as the board's do
    view.progress({"t0000-s0": post(80, at=now - 10)})
    view.progress({"t0000-s0": post(100, loss=3.25, at=now)})  # trained: 20K tokens in 10 s
    assert view.active() == [] and [k for k, _ in view.finishing()] == ["t0000-s0"]
    assert "t0000-s0 100K/100K tokens, loss 3.250, evaluating" in out.getvalue().splitlines()[-1]
    # seed 1 is still to come (50 s at 2K tokens/s), then two trials of two such runs
    assert view.eta_s() == pytest.approx(50 + 2 * 2 * 50, rel=1e-6)
    view.progress({"t0000-s1": post(1, at=now + 12)})  # the next seed run started
    assert [k for k, _ in view.shown()] == ["t0000-s1"]
    view.progress({"t0000-s1": post(100, at=now + 62)})
    view.forget("t0000")  # the trial ended
    assert view.shown() == []


def test_the_last_trial_evaluating_leaves_its_evaluation_time_not_zero_nor_a_whole_trial():
    """Two trials finished in 120 s each; the last has trained (100 s at its pace) and is
    evaluating: about 20 s are left, the finished trials' time beyond their training."""
    view = LiveView(None, "s", total=3, metric="val_loss")
    for key in ("tune-1", "tune-2"):
        view.trial_started(key)
        view.running[key] -= 120.0
        view.trial_done(key, "ok", 118.0)
    view.trial_started("tune-3")
    now = time.time() - 5
    view.progress({"t0002": post(80, at=now - 20)})
    view.progress({"t0002": post(100, at=now)})  # 20K tokens in 20 s: 100 s of training
    assert [k for k, _ in view.finishing()] == ["t0002"]
    assert view.eta_s() == pytest.approx(20.0, rel=1e-3)


def test_run_names():
    assert live.run_of("t0003-s12") == ("t0003", None, 12)
    assert live.run_of("t0003") == ("t0003", None, None)
    assert live.run_of("t0003-g2-s100") == ("t0003", 2, 100)  # search/tuning.trial_id
    assert live.run_of(tuning.trial_id(12, 0, 7)) == ("t0012", 0, 7)


def test_a_tuned_trials_runs_are_one_trials_and_its_eta_counts_the_grid_and_the_seeds(monkeypatch):
    """A tuned trial trains its grid's points, then its final seeds. A tuning run that has trained
    shows as evaluating only until the trial's next run posts (seen before: every finished tuning
    run of a trial listed as "evaluating" for the rest of its trial, "t0004-g1-s100 4.993M/4.993M
    tokens, loss 3.464, evaluating; t0004-g2-s100 ... evaluating; t0004-s1 ..."), and its ETA counts
    the points after it and the final seeds."""
    grid = Tune(grid=(("lr", (1e-3, 3e-3, 6e-3)),), seeds=(100,))
    out, view = logged(monkeypatch, "tuned", total=2, seeds=2, tune=grid)
    view.trial_started("tune-1")
    now = time.time() - 100
    view.progress({"t0000-g1-s100": post(10, at=now - 10)})
    view.progress({"t0000-g1-s100": post(30, at=now)})  # 2K tokens/s: 35 s left, 50 s a run
    # point 1 of 3: point 2 and the 2 seeds after it; then the other trial's 3 + 2 runs of 50 s
    assert view.eta_s() == pytest.approx(35 + 3 * 50 + 5 * 50, rel=1e-6)
    view.progress({"t0000-g1-s100": post(100, at=now + 35)})  # trained: evaluating
    assert [k for k, _ in view.shown()] == ["t0000-g1-s100"]
    assert (
        "t0000-g1-s100 100K/100K tokens, loss 4.000, evaluating" in out.getvalue().splitlines()[-1]
    )
    view.progress({"t0000-g2-s100": post(1, at=now + 40)})  # the trial's next run began
    assert [k for k, _ in view.shown()] == ["t0000-g2-s100"]
    view.progress({"t0000-g2-s100": post(100, at=now + 80), "t0000-s0": post(5, at=now + 85)})
    assert [k for k, _ in view.shown()] == ["t0000-s0"]
    assert "evaluating" not in out.getvalue().splitlines()[-1]


def test_orchestration_per_trial_leaves_out_the_trials_that_reported_no_time_inside(monkeypatch):
    """The driver's time around a trial is its span less the trial's own wall. A trial that ASHA
    stopped or that failed reports no wall: its whole span (its training) is not orchestration,
    and the plan multiplies this figure by every later candidate (driver._record_times)."""
    view = LiveView(None, "s", total=3, metric="val_loss")
    view.refresh = lambda: None
    clock = iter([0.0, 50.0, 50.0, 53.0, 53.0, 60.0])  # each start and end reads the clock once
    monkeypatch.setattr(live.time, "perf_counter", lambda: next(clock))
    assert view.overhead_s() is None
    view.trial_started("a")  # t = 0
    view.trial_done("a", "ok", 48.0)  # t = 50: 2 s around 48 s inside
    view.trial_started("b")  # t = 50
    view.trial_done("b", "pruned", None)  # t = 53: stopped early, no wall reported
    view.trial_started("c")  # t = 53
    view.trial_done("c", "ok", 3.0)  # t = 60: 4 s around
    assert view.spans == [50.0, 3.0, 7.0]
    assert view.overhead_s() == pytest.approx(3.0)  # (2 + 4) / 2, not (60 - 51) / 2
