"""The search's bookkeeping without Ray: the sampler rule, the trial context, the metric registry
as the space reads it, and the values and attributes a trial's rows give Optuna."""

import math
from dataclasses import replace

import pytest

from benchmark.search.context import TrialContext
from benchmark.search.optuna_study import StudyError, resolve_sampler
from benchmark.search.rows import trial_rows, user_attrs, values
from benchmark.space import SpaceError, load_space
from benchmark.store import metrics
from benchmark.store.results import write_row

SPACE = """
name: s
budget: 100K
base: {{vocab_size: 320, n_heads: 2}}
axes:
{axes}
objectives: {objectives}
trials: {trials}
"""


def space(tmp_path, axes="  family: [transformer, looped]", objectives="[val_loss:min]", trials=8):
    path = tmp_path / "s.yaml"
    path.write_text(SPACE.format(axes=axes, objectives=objectives, trials=trials))
    return load_space(path)


def test_auto_follows_optunas_guide(tmp_path):
    assert resolve_sampler(None, None, space(tmp_path), 1) == "tpe"  # categorical axis
    numeric = space(
        tmp_path, axes="  layers.middle: {int: [1, 3]}\n  ffn.dh_ratio: {float: [2.0, 4.0]}"
    )
    assert resolve_sampler(None, None, numeric, 2) == "gp"
    assert (
        resolve_sampler(
            "auto", None, space(tmp_path, trials=300, objectives="[val_loss, params]"), 2
        )
        == "nsga2"
    )
    assert resolve_sampler("random", None, space(tmp_path), 1) == "random"


def test_a_resumed_study_keeps_its_sampler(tmp_path):
    assert resolve_sampler(None, "nsga2", space(tmp_path), 2) == "nsga2"
    assert resolve_sampler("nsga2", "nsga2", space(tmp_path), 2) == "nsga2"
    with pytest.raises(StudyError, match="--sampler nsga2"):
        resolve_sampler("tpe", "nsga2", space(tmp_path), 2)


@pytest.mark.parametrize("name", metrics.SEARCHABLE)
def test_every_searchable_metric_is_an_objective_of_the_language(tmp_path, name):
    m = metrics.BY_NAME[name]
    (loaded,) = space(tmp_path, objectives=f"[{name}]").objectives
    assert loaded == (name, m.direction)
    for alias in m.aliases:
        assert space(tmp_path, objectives=f"[{alias}:max]").objectives == ((name, "max"),)


@pytest.mark.parametrize("name", metrics.DIAGNOSTICS + ("budget", "nosuch"))
def test_columns_that_are_not_objectives_are_refused_with_the_choices(tmp_path, name):
    with pytest.raises(SpaceError, match="objectives.*(not an objective|is not one of).*val_loss"):
        space(tmp_path, objectives=f"[{name}]")


def test_the_trial_context_names_trials_by_number_and_seed(tmp_path):
    one = TrialContext(
        study="s",
        study_dir=str(tmp_path),
        data=None,
        training={},
        count="total",
        objectives=("val_loss",),
    )
    assert one.trial_id(7) == "t0007" and one.seed_list() == [0]
    three = TrialContext(**{**one.__dict__, "seeds": 3, "seed": 5})
    assert [three.trial_id(7, s) for s in three.seed_list()] == ["t0007-s5", "t0007-s6", "t0007-s7"]


def test_a_trials_rows_give_optuna_its_values_and_attributes(tmp_path):
    """Two seeds of trial 3 (one retried), and trial 30 beside it: the values are the mean over
    ok seeds, in the declared names; the attributes equal the rows."""
    base = {
        "study": "s",
        "optuna_trial": 3,
        "family": "looped",
        "structure": "1L→2L(×2)→1L",
        "params_total": 1000,
        "params_non_embedding": 600,
        "spec": '{"family": "looped"}',
    }
    write_row(
        tmp_path, {**base, "trial_id": "t0003-s0", "status": "ok", "val_loss": 2.0, "seed": 0}
    )
    write_row(
        tmp_path, {**base, "trial_id": "t0003-s1", "status": "failed", "error": "boom", "seed": 1}
    )
    write_row(
        tmp_path,
        {**base, "trial_id": "t0003-s1", "attempt": 1, "status": "ok", "val_loss": 3.0, "seed": 1},
    )
    write_row(
        tmp_path, {**base, "trial_id": "t0030", "optuna_trial": 30, "status": "ok", "val_loss": 9.0}
    )
    found = trial_rows(tmp_path, 3)
    assert sorted((r["trial_id"], r["attempt"]) for r in found) == [
        ("t0003-s0", 0),
        ("t0003-s1", 1),
    ]
    assert values(found, ["val_loss", "params"], "non_embedding") == [2.5, 600.0]
    # a seed that diverged counts at a uniform guess over a 1024-token vocabulary (ln 1024 = 6.93),
    # not left out: (2.0 + 3.0 + 6.93) / 3; a metric without such a bound keeps the ok seeds' mean
    lost = [*found, {**base, "trial_id": "t0003-s2", "status": "diverged", "seed": 2}]
    assert values(lost, ["val_loss", "params"], "non_embedding", 1024) == pytest.approx(
        [(5.0 + math.log(1024)) / 3, 600.0]
    )
    attrs = user_attrs(found)
    assert (
        attrs["structure"] == "1L→2L(×2)→1L"
        and attrs["params_total"] == 1000
        and attrs["val_loss"] == 2.5
    )
    assert attrs["status"] == "ok" and attrs["seeds"] == [0, 1] and "error" not in attrs
    assert attrs["rows"] == ["t0003-s0.a0.parquet", "t0003-s1.a1.parquet"]


def test_a_failed_trial_carries_its_error_line(tmp_path):
    write_row(
        tmp_path,
        {
            "study": "s",
            "trial_id": "t0001",
            "optuna_trial": 1,
            "status": "infeasible",
            "error": "budget: no d_model within 0.5% of 100K\nmore",
        },
    )
    attrs = user_attrs(trial_rows(tmp_path, 1))
    assert (
        attrs["status"] == "infeasible"
        and attrs["error"] == "budget: no d_model within 0.5% of 100K"
    )
    assert math.isnan(values(trial_rows(tmp_path, 1), ["val_loss"], "total")[0])


def test_the_best_trial_is_the_best_at_the_declared_objective():
    """The summary's best trial is ranked by the study's first objective and its direction (its
    column under the budget's count rule), not always by val_loss."""
    import pandas as pd

    from benchmark.search.rows import best_row

    ok = pd.DataFrame(
        {
            "trial_id": ["a", "b", "c"],
            "family": ["transformer", "looped", "hyperloop"],
            "structure": ["6L"] * 3,
            "params_total": [3, 2, 1],
            "params_non_embedding": [30, 10, 20],
            "val_loss": [4.0, 4.2, 4.1],
            "val_ppl": [54.6, 66.7, 60.3],
            "tokens_per_s": [9.0, 7.0, 8.0],
        }
    )
    assert best_row(ok, "val_loss", "min", "total")["trial_id"] == "a"
    assert best_row(ok, "tokens_per_s", "max", "total")["value"] == 9.0
    assert best_row(ok, "val_ppl", "max", "total")["trial_id"] == "b"
    assert best_row(ok, "params", "min", "non_embedding")["trial_id"] == "b"
    assert best_row(ok, "params", "min", "total")["trial_id"] == "c"
    assert best_row(ok, "val_loss_r4", "min", "total") is None  # no row has the column


# ---- a trial stopped part-way through its seeds, or a study that now asks more --------------------


def _context(tmp_path, seeds: int) -> TrialContext:
    return TrialContext(
        study="s",
        study_dir=str(tmp_path),
        data=None,
        training={},
        count="total",
        objectives=("val_loss",),
        seeds=seeds,
        retries=1,
    )


def _seed_row(tmp_path, number: int, seed: int, loss: float, status="ok", attempt=0):
    write_row(
        tmp_path,
        {
            "study": "s",
            "optuna_trial": number,
            "trial_id": f"t{number:04d}-s{seed}",
            "seed": seed,
            "attempt": attempt,
            "status": status,
            "val_loss": loss,
            "family": "looped",
            "spec": '{"family": "looped"}',
        },
    )


def _study():
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.create_study(storage="sqlite:///:memory:", study_name="s")


def test_a_trial_stopped_between_its_seeds_is_continued_with_the_seeds_it_lacks(tmp_path):
    """Trial 0 of a 3-seed study ran seeds 0 and 1 when its driver stopped. It is failed, not told
    the mean of two seeds; one trial of its parameters is enqueued to continue it, counted as
    the same candidate, and trains seed 2 alone; the two trials' rows are its three seeds."""
    from optuna.distributions import CategoricalDistribution
    from optuna.trial import TrialState

    from benchmark.search.optuna_study import Quota
    from benchmark.search.resume import close_running
    from benchmark.search.rows import CONTINUES, finished_seeds

    ctx, study = _context(tmp_path, 3), _study()
    stopped = study.ask({"family": CategoricalDistribution(["looped", "hyperloop"])})
    _seed_row(tmp_path, stopped.number, 0, 4.0)
    _seed_row(tmp_path, stopped.number, 1, 4.2)
    close_running(study, ctx)
    first, waiting = study.get_trials()
    assert (
        first.state == TrialState.FAIL
        and first.user_attrs["seeds"] == [0, 1]
        and first.values is None
    )
    assert waiting.state == TrialState.WAITING and waiting.user_attrs[CONTINUES] == [0]
    assert waiting.system_attrs["fixed_params"] == first.params  # asked with its parameters
    assert Quota(str(tmp_path), 1).taken(study) == 0 and not Quota(str(tmp_path), 1).reached(study)
    close_running(study, ctx)  # a second resume: still one continuation
    assert [t.state for t in study.get_trials()] == [TrialState.FAIL, TrialState.WAITING]

    again = study.ask()  # the next driver's trial is the continuation
    assert again.number == 1 and again.user_attrs[CONTINUES] == [0]
    assert again.suggest_categorical("family", ["looped", "hyperloop"]) == first.params["family"]
    earlier = finished_seeds(trial_rows(tmp_path, again.number, [0]), ctx.retries)
    assert sorted(earlier) == [0, 1]  # so it trains seed 2 alone
    _seed_row(tmp_path, again.number, 2, 4.4)
    found = trial_rows(tmp_path, again.number, [0])
    assert sorted((r["trial_id"], r["seed"]) for r in found) == [
        ("t0000-s0", 0),
        ("t0000-s1", 1),
        ("t0001-s2", 2),
    ]
    assert values(found, ["val_loss"], "total") == [pytest.approx(4.2)]
    assert user_attrs(found)["seeds"] == [0, 1, 2]
    assert (
        Quota(str(tmp_path), 1).taken(study) == 1
    )  # the candidate once, though two trials hold rows


def test_a_trial_just_asked_by_a_live_driver_is_left_to_it(tmp_path, monkeypatch):
    """A driver asks a trial (RUNNING at once) and names itself on it in a second write. A second
    driver starting between the two leaves the unnamed trial alone while a driver lives and the
    trial is younger than the registry's grace; once older, or with no driver alive, it is an
    orphan: failed and enqueued again, as before."""
    from optuna.distributions import CategoricalDistribution
    from optuna.trial import TrialState

    from benchmark.search import roster
    from benchmark.search.optuna_study import DRIVER
    from benchmark.search.resume import close_running

    ctx, study = _context(tmp_path, 1), _study()
    dist = {"family": CategoricalDistribution(["looped", "hyperloop"])}
    named = study.ask(dist)
    named.set_user_attr(DRIVER, "other")
    study.ask(dist)  # asked by "other" a moment ago, not yet named
    close_running(study, ctx, live={"other"})
    assert [t.state for t in study.get_trials()] == [TrialState.RUNNING, TrialState.RUNNING]

    close_running(study, ctx)  # no driver lives: both are orphans
    assert [t.state for t in study.get_trials()][:2] == [TrialState.FAIL, TrialState.FAIL]

    study.ask(dist)  # the first re-enqueued point, claimed, not yet named
    monkeypatch.setattr(roster, "GRACE_S", 0.0)  # ... and older than the grace
    close_running(study, ctx, live={"other"})
    assert study.get_trials()[2].state == TrialState.FAIL


def test_a_stopped_trial_whose_rows_rerun_moves_runs_again_once(tmp_path):
    """A session stopped while trial 0 trained; the next starts with --rerun matching its rows,
    which moves them (supersede) and enqueues the candidate to run again (run_again). Trial 0,
    RUNNING and now without rows, is failed (close_running) but not enqueued a second time, nor
    by a later start while that one waits: the candidate trains once."""
    from optuna.distributions import CategoricalDistribution
    from optuna.trial import TrialState

    from benchmark.search.resume import close_running, run_again, supersede

    ctx, study = _context(tmp_path, 2), _study()
    dist = {"family": CategoricalDistribution(["looped", "hyperloop"])}
    stopped = study.ask(dist)
    _seed_row(tmp_path, stopped.number, 0, 4.0)
    moved = supersede(str(tmp_path), ["family=looped"])
    assert len(moved) == 1
    run_again(study, moved, {})
    close_running(study, ctx)
    run_again(study, moved, {})  # a start that set the same rows aside again
    states = [t.state for t in study.get_trials()]
    assert states == [TrialState.FAIL, TrialState.WAITING]
    assert study.get_trials()[1].system_attrs["fixed_params"] == stopped.params
    study.enqueue_trial({"family": "hyperloop"})  # another candidate still enqueues
    run_again(study, moved, {})
    assert len(study.get_trials()) == 3


def test_more_seeds_continue_every_finished_trial_once(tmp_path):
    """A 1-seed study resumed with 2 seeds: its measured trials are continued (once each); a pruned
    trial, one whose every seed failed, and one whose rows were set aside (it runs again whole:
    run_again) are not."""
    from optuna.distributions import CategoricalDistribution
    from optuna.trial import TrialState

    from benchmark.search.resume import continue_unfinished
    from benchmark.search.rows import CONTINUES

    study = _study()
    dist = {"family": CategoricalDistribution(["looped", "hyperloop", "transformer", "hc", "mhc"])}
    for family, status in (
        ("looped", "ok"),
        ("hyperloop", "diverged"),
        ("transformer", "pruned"),
        ("hc", "failed"),
        ("mhc", "ok"),
    ):
        t = study.ask(dist)
        if family != "mhc":  # mhc's rows were set aside
            _seed_row(tmp_path, t.number, 0, 4.0, status=status)
        t.set_user_attr("status", status)
        t.set_user_attr("seeds", [0])
        study.tell(
            t,
            4.0 if status == "ok" else None,
            state=TrialState.COMPLETE if status == "ok" else TrialState.FAIL,
        )
    assert continue_unfinished(study, _context(tmp_path, 1)) == []
    assert continue_unfinished(study, _context(tmp_path, 2)) == [0, 1]
    assert continue_unfinished(study, _context(tmp_path, 2)) == []  # once
    waiting = [t for t in study.get_trials() if t.state == TrialState.WAITING]
    assert [t.user_attrs[CONTINUES] for t in waiting] == [[0], [1]]


def test_a_seeds_final_row_is_measured_or_failed_at_its_last_attempt(tmp_path):
    from benchmark.search.rows import finished_seeds

    _seed_row(tmp_path, 4, 0, 4.0)
    _seed_row(tmp_path, 4, 1, float("nan"), status="diverged")
    _seed_row(tmp_path, 4, 2, float("nan"), status="failed")  # a retry was still to come
    _seed_row(tmp_path, 4, 3, float("nan"), status="failed", attempt=1)  # its last attempt
    assert sorted(finished_seeds(trial_rows(tmp_path, 4), retries=1)) == [0, 1, 3]
    assert sorted(finished_seeds(trial_rows(tmp_path, 4), retries=0)) == [0, 1, 2, 3]


def test_a_continuing_trial_trains_only_the_seeds_it_lacks(tmp_path, monkeypatch):
    """The trainable of trial 1, continuing trial 0 (seeds 0 and 1 finished, seed 2 not): it trains
    seed 2 alone, and Optuna is told the mean over the three seeds."""
    from benchmark.search import trainable

    _seed_row(tmp_path, 0, 0, 4.0)
    _seed_row(tmp_path, 0, 1, 4.2)
    trained = []

    def attempts(config, ctx, trial_id, seed, data, report, setting=None):
        trained.append((trial_id, report is not None))
        return {"status": "ok", "seed": seed, "val_loss": 4.4, "wall_s": 7.0, "tokens_trained": 100}

    monkeypatch.setattr(trainable, "attempts", attempts)
    monkeypatch.setattr(trainable, "prepare", lambda data: None)
    under_asha = replace(
        _context(tmp_path, 3), training={"eval_every": 5}
    )  # the driver's, with ASHA
    final = trainable._trial(
        {"optuna_trial": 1, "continues": [0], "family": "looped"}, under_asha, None
    )
    assert trained == [("t0001-s2", True)]  # the first seed it trains reports ASHA's rungs
    assert (
        final["val_loss"] == pytest.approx(4.2)
        and final["status"] == "ok"
        and final["trial_wall_s"] == 7.0
    )


def test_a_resumed_study_keeps_its_first_seed(tmp_path):
    """Its trials' seeds are the list from the first one: another would make every trial lack seeds."""
    from benchmark.search.optuna_study import check_declared, declaration

    s = space(tmp_path)
    recorded = {**declaration(s), "seeds": 3, "seed": 0}
    check_declared(
        s, 5, recorded, "r/s/_study.json", "s", first_seed=0
    )  # more seeds: the study continues
    with pytest.raises(StudyError, match=r"seed: 0 -> 2 \(its trials' seeds start at 0\)"):
        check_declared(s, 3, recorded, "r/s/_study.json", "s", first_seed=2)
