"""The search end to end through Ray Tune and Optuna on ~100K-parameter trials: rows, the
persisted Optuna study, resume after SIGKILL, and trials that diverge or raise."""

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import replace
from pathlib import Path

import optuna
import pandas as pd
import pytest
import tiny_search

from benchmark.search import OPTUNA_DB, SearchOptions, StudyError, ray_processes, run_search
from benchmark.search import temp_dir as _ray_temp_dir
from benchmark.space.language import load_space
from benchmark.space.source import parse_set

pytestmark = pytest.mark.slow

SPACE = """
name: tiny
description: end-to-end smoke test
budget: 100K
count: total
tolerance: 2%
base: {{vocab_size: 320, n_heads: 2, layers: {{begin: 1, middle: 1, end: 1}}}}
axes:
{axes}
training: {{tokens: {tokens}, seq_len: 32, batch_size: 8, lr: {lr}, grad_clip: {clip}, eval_tokens: 2K}}
quantize: {{group_size: 16, calib_sequences: 16}}
objectives: [val_loss:min]
trials: {trials}
"""


FAMILIES = "  family: [transformer, looped, hyperloop, abbie-d]"


# 8K tokens, 32 steps: no assertion of the tests that train this default depends on what a trial
# learns, and each run is the shorter for it; those that stop a search mid-trial train longer.
def space_file(
    root: Path, name: str, trials=4, tokens="8K", lr="3e-3", clip=1.0, axes=FAMILIES
) -> Path:
    path = root / f"{name}.yaml"
    path.write_text(SPACE.format(trials=trials, tokens=tokens, lr=lr, clip=clip, axes=axes))
    return path


def options(corpus: Path, results: Path, name: str) -> SearchOptions:
    return SearchOptions(
        name=name,
        results_dir=results,
        asha=False,
        retries=1,
        data=tiny_search.data(corpus),
        cpus_per_trial=tiny_search.CPUS_PER_TRIAL,  # one torch thread a run (tiny_search.py)
    )


POLICY = {"compile": False, "precision": "fp32"}


@pytest.fixture(scope="module")
def _ray_for_module():
    yield
    import ray

    ray.shutdown()


_SLOTS: list = []


@pytest.fixture
def started_ray(_ray_for_module, tmp_path_factory):
    """A local Ray this process started before the search, as a notebook's `ray.init()` would
    (here the search's own way of starting one): run_search runs on it and leaves it running, so
    the module starts Ray once (~5 s each start here) where every search used to start and end
    its own. The resume test below runs with none, so a search's own start, the clean-up of a
    killed run's processes and its end stay covered."""
    import ray

    from benchmark.search import ray_session

    if not ray.is_initialized():
        _SLOTS.append(
            ray_session.claim(tmp_path_factory.mktemp("module-ray"))
        )  # held while the module runs
        ray_session.start(None, _SLOTS[-1])
    yield
    assert ray.is_initialized(), "run_search ended the Ray its caller had started"


@pytest.fixture
def no_ray():
    import ray

    ray.shutdown()


DRIVER = """
import sys
sys.path.insert(0, {root!r})
from pathlib import Path
from benchmark.data import DataConfig
from benchmark.search import SearchOptions, run_search
from benchmark.space.language import load_space
opts = SearchOptions(name="killme", results_dir=Path({results!r}), asha=False, cpus_per_trial={cpus},
                     data=DataConfig(source={text!r}, tokenizer="bpe:320", cache_dir={cache!r}))
run_search(load_space({space!r}), opts, console=None, policy={{"compile": False, "precision": "fp32"}})
"""


def test_resume_after_the_driver_is_killed(corpus, tmp_path, no_ray):
    space_path = space_file(tmp_path, "killme", trials=4, tokens="40K")
    results = tmp_path / "results"
    code = textwrap.dedent(
        DRIVER.format(
            root=str(Path(__file__).resolve().parent.parent),
            results=str(results),
            text=str(corpus / "text.txt"),
            cache=str(corpus / "cache"),
            space=str(space_path),
            cpus=tiny_search.CPUS_PER_TRIAL,
        )
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    trials = results / "killme" / "trials"
    deadline = time.time() + 600
    while (
        time.time() < deadline
        and len(list(trials.glob("[!.]*.parquet")) if trials.is_dir() else []) < 2
    ):
        assert proc.poll() is None, "the driver ended before it could be killed"
        time.sleep(0.5)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    before = set(pd.read_parquet(results / "killme")["trial_id"])
    assert 2 <= len(before) < 4

    opts = replace(
        options(corpus, results, "killme"), concurrency=1
    )  # one at a time on any machine
    recorded = searches_recorded()
    summary = run_search(load_space(space_path), opts, console=None, policy=POLICY)
    df = pd.read_parquet(results / "killme")
    assert summary.finished_before == len(before)
    # a search that started its own Ray and ran its trials one at a time records its time outside
    # them for the next plan here (driver._record_times): the start, and the time around each trial
    ((start_s, per_trial_s),) = searches_recorded()[len(recorded) :]
    inside = df.loc[~df["trial_id"].isin(before), "wall_s"].sum()  # the rows this run wrote
    assert summary.busy_s >= inside and 0 < start_s < summary.wall_s - inside
    assert 0 <= per_trial_s == pytest.approx(summary.overhead_s)
    assert (
        df["trial_id"].is_unique and len(df) == 4
    )  # each finished trial exactly once, total reached
    assert before <= set(df["trial_id"])
    study = optuna.load_study(
        study_name="killme", storage=f"sqlite:///{results / 'killme' / OPTUNA_DB}"
    )
    assert "RUNNING" not in [t.state.name for t in study.trials]
    # the search started its own Ray (ending the killed run's processes first) and ended it
    assert not ray_processes(_ray_temp_dir(opts.study_dir))  # nothing of either run is left
    import ray

    assert not ray.is_initialized()


def searches_recorded() -> list[tuple[float, float]]:
    """The searches' times recorded in this session's speeds file (conftest.own_speeds_file)."""
    from benchmark.data import cache_root
    from benchmark.store import speeds

    return speeds.searches(speeds.path_in(cache_root()))


def test_a_search_runs_through_ray_tune_and_optuna(corpus, tmp_path, started_ray):
    space = load_space(space_file(tmp_path, "tiny"))
    opts = options(corpus, tmp_path / "results", "tiny")
    recorded = searches_recorded()
    summary = run_search(space, opts, console=None, policy=POLICY)
    assert (
        searches_recorded() == recorded
    )  # on a Ray its caller started: its start is not the search's
    df = pd.read_parquet(tmp_path / "results" / "tiny")
    assert len(df) == 4 and df["trial_id"].nunique() == 4
    assert set(df["status"]) == {"ok"} and df["val_loss"].notna().all()
    assert sorted(df["family"]) == [
        "abbie-d",
        "hyperloop",
        "looped",
        "transformer",
    ]  # the grid, once each
    assert (abs(df["budget_distance"]) <= 0.02).all()
    assert (
        df["quantize"] == '{"calib_sequences": 16, "group_size": 16}'
    ).all()  # the space's, through Ray
    assert summary.ran == 4 and summary.overhead_s is not None
    assert summary.progress_reads > 0  # the running trials' progress reached the live view
    study = optuna.load_study(
        study_name="tiny", storage=f"sqlite:///{tmp_path / 'results' / 'tiny' / OPTUNA_DB}"
    )
    states = [t.state.name for t in study.trials]
    assert states.count("COMPLETE") == 4 and "RUNNING" not in states
    # running it again finds the study complete and runs nothing
    again = run_search(space, opts, console=None, policy=POLICY)
    assert (
        again.ran == 0
        and again.finished_before == 4
        and len(pd.read_parquet(tmp_path / "results" / "tiny")) == 4
    )
    # a row file cut short (a bad copy, a full disk): set aside, its candidate trained again, once
    trials = tmp_path / "results" / "tiny" / "trials"
    damaged = trials / "t0002.a0.parquet"
    family = pd.read_parquet(damaged)["family"].iloc[0]
    damaged.write_bytes(damaged.read_bytes()[:300])
    healed = run_search(space, opts, console=None, policy=POLICY)
    assert healed.finished_before == 3 and healed.ran == 1 and healed.written == 1
    assert any(
        "set aside damaged row file" in note and "t0002.a0.parquet" in note for note in healed.notes
    )
    assert (
        tmp_path / "results" / "tiny" / "_quarantine" / "t0002.a0.parquet"
    ).stat().st_size == 300
    df = pd.read_parquet(tmp_path / "results" / "tiny")
    assert len(df) == 4 and sorted(df["family"]) == [
        "abbie-d",
        "hyperloop",
        "looped",
        "transformer",
    ]
    assert (
        df.loc[df["trial_id"] == "t0004", "family"].item() == family
    )  # the same candidate, run again


def test_a_study_takes_the_runs_another_measured_and_trains_the_rest(corpus, tmp_path, started_ray):
    """--reuse-runs RESULTS: a second study sharing a candidate with the first trains only the
    candidate it does not share; the shared run's row is the first's, under the second's trial
    name, saying where it came from."""
    from benchmark.store import read_curves

    results = tmp_path / "results"
    axes = "  family: [transformer]"
    first = load_space(space_file(tmp_path, "first", trials=1, axes=axes))
    run_search(first, options(corpus, results, "first"), console=None, policy=POLICY)
    space = load_space(space_file(tmp_path, "both", trials=2, axes=axes.replace("]", ", looped]")))
    opts = replace(options(corpus, results, "both"), reuse_runs=(str(results),))
    summary = run_search(space, opts, console=None, policy=POLICY)
    assert (summary.ran, summary.written, summary.reused) == (2, 2, 1)
    df = pd.read_parquet(results / "both").set_index("family")
    (source,) = pd.read_parquet(results / "first").to_dict("records")
    taken = df.loc["transformer"]
    assert (
        json.loads(taken["extra"])["reused_from"] == f"first/trials/{source['trial_id']}.a0.parquet"
    )
    for column in ("val_loss", "started_at", "wall_s", "spec", "training"):
        assert taken[column] == source[column], column
    assert "reused_from" not in str(df.loc["looped", "extra"])  # trained here
    assert df.loc["looped", "started_at"] > source["finished_at"]
    curve = read_curves(str(results / "both")).dropna(subset=["train_loss"])
    mine = curve[curve["trial_id"] == taken["trial_id"]]["train_loss"].tolist()
    theirs = read_curves(str(results / "first")).dropna(subset=["train_loss"])
    assert mine == theirs["train_loss"].tolist() and len(mine) > 3


def test_more_seeds_continue_a_study_training_only_the_seeds_it_lacks(
    corpus, tmp_path, started_ray
):
    """A study of two candidates at one seed, run again with two: each candidate trains seed 1
    alone (a trial that continues its first, resume.continue_unfinished), and Optuna is told the
    mean of both seeds; a third run finds it complete."""
    space = load_space(
        space_file(tmp_path, "grow", trials=2, axes="  family: [transformer, looped]")
    )
    opts = options(corpus, tmp_path / "results", "grow")
    run_search(space, opts, console=None, policy=POLICY)
    more = replace(opts, seeds=2)
    summary = run_search(space, more, console=None, policy=POLICY)
    assert summary.ran == 2 and summary.written == 2
    df = pd.read_parquet(tmp_path / "results" / "grow")
    assert len(df) == 4 and set(df["status"]) == {"ok"}
    assert df.groupby("family")["seed"].apply(sorted).to_dict() == {
        "looped": [0, 1],
        "transformer": [0, 1],
    }
    study = optuna.load_study(
        study_name="grow", storage=f"sqlite:///{tmp_path / 'results' / 'grow' / OPTUNA_DB}"
    )
    continuing = [t for t in study.trials if t.user_attrs.get("continues")]
    assert sorted(t.user_attrs["continues"] for t in continuing) == [[0], [1]]
    for t in continuing:
        rows = df[df["family"] == t.params["family"]]
        assert t.state.name == "COMPLETE" and t.user_attrs["seeds"] == [0, 1]
        assert t.values[0] == pytest.approx(rows["val_loss"].mean())
    again = run_search(space, more, console=None, policy=POLICY)
    assert again.ran == 0 and len(pd.read_parquet(tmp_path / "results" / "grow")) == 4
    # --rerun family=looped: the candidate's rows of both its trials (the first and its
    # continuation) are set aside, and it trains anew once, at both seeds
    old = set(df.loc[df["family"] == "looped", "trial_id"])
    rerun = run_search(space, replace(more, rerun=("family=looped",)), console=None, policy=POLICY)
    assert rerun.ran == 1 and rerun.written == 2
    assert any(
        note.startswith("--rerun family=looped: the rows of 2 trials moved to")
        for note in rerun.notes
    )
    df = pd.read_parquet(tmp_path / "results" / "grow")
    looped = df[df["family"] == "looped"]
    assert sorted(looped["seed"]) == [0, 1] and not set(looped["trial_id"]) & old and len(df) == 4
    (kept,) = (tmp_path / "results" / "grow" / "_superseded").iterdir()
    assert sorted(p.name.split(".")[0] for p in kept.iterdir()) == sorted(old)
    with pytest.raises(StudyError, match="--rerun family=hyperlop: no row of the study matches"):
        run_search(space, replace(more, rerun=("family=hyperlop",)), console=None, policy=POLICY)


def test_diverging_and_raising_trials_are_recorded_and_the_search_completes(
    corpus, tmp_path, started_ray
):
    # vocab 200 < the tokenizer's: that candidate raises (and is retried once); lr 50 without
    # (effectively no) clipping makes the other diverge.
    space = load_space(
        space_file(
            tmp_path,
            "faults",
            trials=4,
            lr="50",
            clip="1e9",
            tokens="20K",
            axes="  vocab_size: [320, 200]",
        )
    )
    opts = options(corpus, tmp_path / "results", "faults")
    summary = run_search(space, opts, console=None, policy=POLICY)
    df = pd.read_parquet(tmp_path / "results" / "faults")
    assert set(df["status"]) == {"diverged", "failed"}
    failed = df[df["status"] == "failed"]
    assert (
        failed.groupby("trial_id")["attempt"].apply(sorted).map(tuple) == (0, 1)
    ).all()  # retried once
    assert failed["error"].str.contains("vocab_size: the spec has 200").all()
    assert summary.ran == 4 and df["trial_id"].nunique() == 4
    study = optuna.load_study(
        study_name="faults", storage=f"sqlite:///{tmp_path / 'results' / 'faults' / OPTUNA_DB}"
    )
    assert "RUNNING" not in [t.state.name for t in study.trials]


def test_successive_halving_records_every_trial_once(corpus, tmp_path, started_ray):
    """One objective: ASHA over training tokens may stop weak trials early; a stopped trial is
    recorded as `pruned` with the tokens it got, every other as `ok`; none is lost or doubled."""
    # 20K tokens: 80 steps, 8 evaluations (ASHA's rungs at 2.5K and 7.5K tokens)
    space = load_space(space_file(tmp_path, "asha", trials=5, tokens="20K"))
    opts = SearchOptions(**{**options(corpus, tmp_path / "results", "asha").__dict__, "asha": True})
    run_search(space, opts, console=None, policy=POLICY)
    df = pd.read_parquet(tmp_path / "results" / "asha")
    assert len(df) == 5 and df["trial_id"].is_unique
    assert set(df["status"]) <= {"ok", "pruned"} and "ok" in set(df["status"])
    full = df.loc[df["status"] == "ok", "tokens_trained"].max()
    assert (df.loc[df["status"] == "pruned", "tokens_trained"] < full).all()
    evals = df.loc[df["status"] == "ok", "evals"].map(lambda s: len(__import__("json").loads(s)))
    assert (evals >= 4).all()  # intermediate evaluations gave ASHA its rungs


# ---- what the tools around a study read: Optuna, optuna-dashboard -----------------------------


def _load(results: Path, name: str):
    return optuna.load_study(study_name=name, storage=f"sqlite:///{results / name / OPTUNA_DB}")


def _get_json(url: str, timeout: float = 90.0):
    import json
    import urllib.request

    deadline = time.time() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                return json.loads(r.read())
        except OSError:
            if time.time() > deadline:
                raise
            time.sleep(0.5)


def test_the_optuna_study_speaks_the_declared_names_and_carries_each_row(
    corpus, tmp_path, started_ray
):
    """Every searchable metric of the registry can be declared as an objective: metric_names are
    the declared objectives and each trial's values are its Parquet row's; every trial's user
    attributes hold its structure and parameter counts, equal to its row; the study holds the
    declaration; optuna-dashboard serves both; a resumed study keeps its sampler."""
    import socket

    from benchmark.search import StudyError
    from benchmark.store.declaration import read_study_info
    from benchmark.store.metrics import BY_NAME, LOOP_LOSSES, SEARCHABLE, row_value

    # every metric these families report: none evaluates loop counts, so none has a val_loss_r*
    names = [
        "val_loss",
        "params",
        *(n for n in SEARCHABLE if n not in ("val_loss", "params", *LOOP_LOSSES)),
    ]
    declared = [[n, BY_NAME[n].direction] for n in names]
    path = space_file(
        tmp_path, "named", trials=3, axes="  family: [transformer, looped, hyperloop]"
    )
    path.write_text(
        path.read_text().replace(
            "objectives: [val_loss:min]",
            f"objectives: [val_loss:min, params:min, {', '.join(names[2:])}]",
        )
    )
    space = load_space(path)
    results = tmp_path / "results"
    summary = run_search(space, options(corpus, results, "named"), console=None, policy=POLICY)
    assert summary.sampler == "tpe"  # categorical axis, few trials: Optuna's guide
    study = _load(results, "named")
    assert study.metric_names == names
    assert (
        study.user_attrs["sampler"] == "tpe" and study.user_attrs["space"] == space.name == "tiny"
    )  # the space's name; the study is --name
    assert study.user_attrs["objectives"] == declared
    assert read_study_info(results / "named")["objectives"] == declared
    df = pd.read_parquet(results / "named").set_index("optuna_trial")
    assert len(study.trials) == 3
    for t in study.trials:
        row = df.loc[t.number]
        assert t.state.name == "COMPLETE" and t.user_attrs["status"] == "ok"
        assert (
            t.user_attrs["structure"] == row["structure"]
            and t.user_attrs["family"] == row["family"]
        )
        assert t.user_attrs["params_total"] == row["params_total"]
        assert t.user_attrs["params_non_embedding"] == row["params_non_embedding"]
        assert all(math.isfinite(v) for v in t.values), t.values  # every metric has a value
        assert t.values == pytest.approx([row_value(row, n) for n in names])
        assert t.values[:2] == pytest.approx([row["val_loss"], row["params_total"]])
        assert t.user_attrs["rows"] == [f"{row['trial_id']}.a0.parquet"]
    frame = study.trials_dataframe()
    assert {"values_val_loss", "values_params", "values_wall_s", "user_attrs_structure"} <= set(
        frame.columns
    )

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(
        [
            str(Path(sys.executable).with_name("optuna-dashboard")),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            f"sqlite:///{results / 'named' / OPTUNA_DB}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        listed = _get_json(f"http://127.0.0.1:{port}/api/studies")["study_summaries"]
        detail = _get_json(f"http://127.0.0.1:{port}/api/studies/{listed[0]['study_id']}")
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert detail["objective_names"] == names
    served = {
        t["number"]: {a["key"]: a["value"] for a in t["user_attrs"]} for t in detail["trials"]
    }
    assert served[0]["structure"] == df.loc[0, "structure"]
    assert int(served[0]["params_total"]) == df.loc[0, "params_total"]

    with pytest.raises(StudyError, match="--sampler tpe"):
        run_search(
            load_space(path, [parse_set("trials=4")]),
            SearchOptions(**{**options(corpus, results, "named").__dict__, "sampler": "random"}),
            policy=POLICY,
        )


# ---- a full disk ------------------------------------------------------------------------------


@pytest.fixture
def small_disk(tmp_path):
    """A real 3 MB file system (tmpfs; needs root, as CI has)."""
    root = tmp_path / "disk"
    root.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(root)],
        capture_output=True,
        text=True,
    )
    if done.returncode:
        pytest.skip(f"cannot mount a small file system here: {done.stderr.strip()}")
    yield root
    subprocess.run(["umount", "-l", str(root)], capture_output=True)


def test_a_full_disk_stops_the_search_cleanly_and_resume_finishes_it(
    corpus, tmp_path, small_disk, capfd, started_ray
):
    """capfd, not capsys: Ray Tune's loggers write to the stderr they found at import, which only
    the file descriptor shows."""
    from benchmark.search.command import search_main as main

    results = small_disk / "results"
    space_path = space_file(tmp_path, "full", trials=1, tokens="20K")
    run_search(
        load_space(space_path), options(corpus, results, "full"), console=None, policy=POLICY
    )
    filler = small_disk / "filler"
    filler.write_bytes(b"\0" * (shutil.disk_usage(small_disk).free - 60 * 1024))  # 60 kB left
    flags = [
        str(space_path),
        "--trials",
        "2",
        "--name",
        "full",
        "--results",
        str(results),
        *tiny_search.cli(corpus),
        *tiny_search.CPU_FLAGS,  # not in the resume command: a machine's choice, not the study's
    ]
    capfd.readouterr()
    assert main(flags) == 3
    err = capfd.readouterr().err
    assert (
        f"shapebench search: full: stopped: {results / 'full'}: the disk is full" in err
        and "MiB free" in err
    )
    assert (
        f"once there is space: shapebench search {space_path} --name full --results {results} --trials 2 "
        f"--data {corpus / 'text.txt'} --tokenizer bpe:320 --precision fp32 --no-compile --resume"
    ) in err
    assert "Traceback" not in err
    kept = pd.read_parquet(results / "full")
    assert len(kept) >= 1 and not list(
        (results / "full" / "trials").glob(".*")
    )  # no half-written file

    filler.unlink()
    assert main([*flags, "--resume"]) == 0
    df = pd.read_parquet(results / "full")
    assert len(df) == 2 and df["trial_id"].is_unique and set(df["status"]) <= {"ok", "pruned"}
    assert set(kept["trial_id"]) <= set(df["trial_id"])
    study = optuna.load_study(
        study_name="full", storage=f"sqlite:///{results / 'full' / OPTUNA_DB}"
    )
    assert "RUNNING" not in [t.state.name for t in study.trials]


def test_ray_tunes_own_ctrl_c_handler_is_seen_as_a_stop():
    """ray_session.fit_interrupted against Ray Tune's own handler (tune.py, _setup_signal_catching,
    which every Tuner.fit installs): a run the signal reached is seen as stopped, one it did not as
    finished, and the handler found before is back after either. From Python's own handler, as in
    a fresh process: one an earlier test's Ray left in this one may not raise KeyboardInterrupt."""
    from ray.tune.tune import _setup_signal_catching

    from benchmark.search.ray_session import fit_interrupted

    left = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        before = signal.getsignal(signal.SIGINT)
        reached = []

        def stopped_fit():
            event = _setup_signal_catching()
            signal.raise_signal(signal.SIGINT)  # Ray's handler: ends the run, returns normally
            reached.append(event.is_set())

        assert fit_interrupted(stopped_fit) and reached == [True]
        assert signal.getsignal(signal.SIGINT) is before
        assert not fit_interrupted(_setup_signal_catching)  # a run no signal reached
        assert signal.getsignal(signal.SIGINT) is before
        with pytest.raises(KeyboardInterrupt):  # a second Ctrl-C still ends the process as usual
            fit_interrupted(lambda: (stopped_fit(), signal.raise_signal(signal.SIGINT)))
    finally:
        signal.signal(signal.SIGINT, left)


def test_ctrl_c_stops_the_search_with_exit_130_and_says_how_to_go_on(corpus, tmp_path):
    """`shapebench search` stopped by the user ends non-zero (a shell loop over spaces stops
    with it), prints its summary and says how to go on, its finished rows kept."""
    space_path = space_file(tmp_path, "stopme", trials=4, tokens="40K")
    results = tmp_path / "results"
    flags = [
        "--name",
        "stopme",
        "--results",
        str(results),
        "--concurrency",
        "1",
        *tiny_search.CPU_FLAGS,
    ]
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "benchmark.main",
            "search",
            str(space_path),
            *flags,
            *tiny_search.cli(corpus),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    trials = results / "stopme" / "trials"
    deadline = time.time() + 600
    while time.time() < deadline and not (trials.is_dir() and list(trials.glob("[!.]*.parquet"))):
        assert proc.poll() is None, "the search ended before it could be stopped"
        time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, err
    # the summary of what ran (on stderr, as after a finished search)
    assert "rows written now" in err
    assert "shapebench search: stopme: stopped: the user stopped it (Ctrl-C)" in err, err
    assert f"to go on: shapebench search {space_path} --name stopme --results {results}" in err
    assert "--resume" in err and "Traceback" not in err
    kept = pd.read_parquet(results / "stopme")
    assert 1 <= len(kept) < 4 and set(kept["status"]) == {"ok"}
