"""A study whose database or Ray head goes away mid-search, on a real PostgreSQL server and a real
Ray: a restart while a trial completes is ridden through (no traceback, every attribute in the
study); a database down at the start, or down for longer than the retries wait, stops the search
in one line with exit code 3, rows kept, and `--resume` completes the study; Ray's head lost
mid-search ends the driver in one line, and `--resume` completes that study too. Whatever the
path, the study and the rows agree at the end."""

from __future__ import annotations

import os
import pickle
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import optuna
import pandas as pd
import pytest
import tiny_search

from benchmark.search import rows as trial_rows
from benchmark.search import searcher as searcher_module
from benchmark.search.command import search_main as main
from benchmark.search.optuna_study import DRIVER, engine_url

ROOT = Path(__file__).resolve().parent.parent

# Three candidates of ~100K parameters, 8 steps each, every one trained to its end (no ASHA).
SPACE = """\
name: blink
budget: 100K
count: total
tolerance: 2%
base: {vocab_size: 320, n_heads: 2, layers: {begin: 1, middle: 1, end: 1}}
axes:
  family: [transformer, looped, hyperloop]
training: {tokens: 2K, seq_len: 32, batch_size: 8, lr: 3e-3, eval_tokens: 512}
objectives: [val_loss:min]
pruner: none
trials: 3
"""


def flags(tmp_path: Path, corpus: Path, name: str, *more: str) -> list[str]:
    space = tmp_path / "blink.yaml"
    space.write_text(SPACE)
    return [
        str(space),
        "--name",
        name,
        "--results",
        str(tmp_path / "results"),
        *tiny_search.cli(corpus),
        "--concurrency",
        "1",
        *tiny_search.CPU_FLAGS,  # one torch thread a trial (tiny_search.py)
        *more,
    ]


@pytest.fixture(scope="module")
def started_ray(tmp_path_factory):
    """One local Ray for the module's in-process searches (each would start its own otherwise);
    the head-loss test runs its driver in a process of its own, with its own Ray."""
    import ray

    from benchmark.search import ray_session

    slot = ray_session.claim(tmp_path_factory.mktemp("module-ray"))
    ray_session.start(None, slot)
    yield
    ray.shutdown()
    slot.release(tidy=True)


@pytest.fixture
def server(postgres_server):
    """The module's PostgreSQL server, running again after each test whatever the test did."""
    yield postgres_server
    if not postgres_server.running():
        postgres_server.start()


def assert_agree(study_dir: Path, storage: str, name: str, trials: int = 3) -> None:
    """Every trial has its row, every COMPLETE trial has exactly one ok row, and the study carries
    each row's user attributes as the rows record them (the ~18 rows.user_attrs gives) and its
    values; nothing is left RUNNING or WAITING."""
    df = pd.read_parquet(study_dir)
    study = optuna.load_study(study_name=name, storage=engine_url(storage))
    complete = [t for t in study.trials if t.state.name == "COMPLETE"]
    assert len(complete) == trials and len(df) == trials, study.trials
    assert not [t for t in study.trials if t.state.name in ("RUNNING", "WAITING")]
    assert sorted(df["optuna_trial"]) == sorted(t.number for t in complete)
    for t in complete:
        found = trial_rows.trial_rows(study_dir, t.number)
        assert [r["status"] for r in found] == ["ok"]
        expected = trial_rows.user_attrs(found)
        assert len(expected) >= 15
        assert {k: t.user_attrs.get(k) for k in expected} == expected, t.number
        assert t.user_attrs.get(DRIVER)  # and the driver that asked it
        assert t.values == [found[0]["val_loss"]]


def on_completion(monkeypatch, *actions) -> list[int]:
    """Run actions[i] as the searcher is about to tell the study of the i-th trial that finished
    (after reading its rows, before setting its attributes): the moment a trial completes."""
    original, seen = searcher_module.rows.user_attrs, []

    def user_attrs(found):
        attrs = original(found)
        if found and len(seen) < len(actions):
            seen.append(int(found[0]["optuna_trial"]))
            actions[len(seen) - 1]()
        return attrs

    monkeypatch.setattr(searcher_module.rows, "user_attrs", user_attrs)
    return seen


def stderr_lines(capfd) -> list[str]:
    return [line for line in capfd.readouterr().err.splitlines() if line.strip()]


@pytest.mark.slow
def test_a_restart_while_trials_complete_loses_nothing_and_says_one_line(
    tmp_path, corpus, server, started_ray, capfd, monkeypatch
):
    def down_for_a_moment():
        server.stop()
        threading.Timer(1.5, server.start).start()  # back while the searcher waits on it

    # The first completion finds every pooled connection ended by a restart; the second finds the
    # server down for 1.5 s and waits for it.
    seen = on_completion(monkeypatch, server.restart, down_for_a_moment)
    capfd.readouterr()
    assert main(flags(tmp_path, corpus, "restart", "--storage", server.url)) == 0
    err = stderr_lines(capfd)
    assert len(seen) == 2
    assert not [line for line in err if "Traceback" in line or "Error stopping" in line], "\n".join(
        err
    )
    said = [line for line in err if "answered again" in line]
    assert len(said) == 1, "\n".join(
        err
    )  # the restart is ridden through unsaid; the outage in one line
    assert re.fullmatch(
        r"the study's database postgresql\+psycopg://postgres@127\.0\.0\.1:\d+/postgres did not "
        r"answer \(OperationalError: connection failed: .*Connection refused\); it answered again "
        r"after \d\.\d s",
        said[0],
    ), said[0]
    assert_agree(tmp_path / "results" / "restart", server.url, "restart")


@pytest.mark.slow
def test_a_database_down_at_the_start_is_one_line_and_exit_3(tmp_path, corpus, server, capfd):
    server.stop()
    capfd.readouterr()
    assert (
        main(flags(tmp_path, corpus, "down", "--storage", server.url, "--storage-wait", "2s")) == 3
    )
    err = stderr_lines(capfd)
    assert "Traceback" not in "\n".join(err)
    about = [line for line in err if "database" in line]
    assert about == [err[-1]], "\n".join(err)  # one line, the last
    assert re.fullmatch(
        r"shapebench search: down: stopped: the study's database postgresql\+psycopg://postgres@127\.0\.0\.1:\d+/postgres "
        r"has not answered within 2 s \(OperationalError: connection failed: .*Connection refused\); finished rows "
        r"are kept\. Check that the server is up and reachable from here \(or wait longer with --storage-wait\); "
        r"then: shapebench search .* --storage postgresql://postgres@127\.0\.0\.1:\d+/postgres --resume",
        err[-1],
    )
    study_dir = tmp_path / "results" / "down"  # the wait is bounded (2 s), and nothing else ran:
    assert (
        not list(study_dir.glob("trials/*")) and not (study_dir / "_ray").exists()
    )  # no Ray, no trial


@pytest.mark.slow
def test_a_database_away_past_the_wait_stops_in_one_line_and_resume_completes(
    tmp_path, corpus, server, started_ray, capfd, monkeypatch
):
    seen = on_completion(
        monkeypatch, server.stop
    )  # down as the first trial completes, and stays down
    args = flags(
        tmp_path, corpus, "away", "--trials", "2", "--storage", server.url, "--storage-wait", "3s"
    )
    capfd.readouterr()
    assert main(args) == 3
    err = stderr_lines(capfd)
    assert seen == [0] and "Traceback" not in "\n".join(err)
    assert err[-1].startswith(
        "shapebench search: away: stopped: the study's database postgresql+psycopg://postgres@"
    ), err
    assert " has not answered within 3 s (OperationalError: connection failed: " in err[-1], err[-1]
    assert err[-1].endswith(f"--storage {server.url} --resume")
    study_dir = tmp_path / "results" / "away"
    assert list(pd.read_parquet(study_dir)["optuna_trial"]) == [
        0
    ]  # the finished trial's row is kept

    server.start()
    monkeypatch.undo()
    study = optuna.load_study(study_name="away", storage=engine_url(server.url))
    assert study.trials[0].state.name == "RUNNING" and "val_loss" not in study.trials[0].user_attrs
    assert main([*args[:-2], "--resume"]) == 0
    assert_agree(
        study_dir, server.url, "away", trials=2
    )  # trial 0 told from its row, attributes included


# ---- Ray's head lost mid-search -----------------------------------------------------------------


@pytest.mark.slow
def test_a_lost_ray_head_ends_the_driver_in_one_line_and_resume_completes(
    tmp_path, corpus, started_ray
):
    from benchmark.search.ray_session import ray_processes, temp_dir

    args = flags(tmp_path, corpus, "head", "--trials", "2")
    study_dir = tmp_path / "results" / "head"
    log = tmp_path / "driver.log"
    with open(log, "w") as out:
        driver = subprocess.Popen(
            [sys.executable, str(ROOT / "run_search.py"), *args],
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 300
        while not list(
            study_dir.glob("trials/t0000*.parquet")
        ):  # the first trial's row: mid-search
            assert driver.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        heads = [
            pid
            for pid in ray_processes(temp_dir(study_dir))
            if b"gcs_server" in Path(f"/proc/{pid}/cmdline").read_bytes()
        ]
        assert len(heads) == 1, heads
        killed = time.monotonic()
        os.kill(heads[0], signal.SIGKILL)
        assert driver.wait(timeout=60) == 3
        gone_after = time.monotonic() - killed
    finally:
        if driver.poll() is None:
            driver.kill()
    lines = [line for line in log.read_text().splitlines() if line.strip()]
    assert "Traceback" not in log.read_text()
    assert lines[-1].startswith("shapebench search: head: stopped: Ray lost its head node: "), (
        lines[-3:]
    )
    assert f" --name head --results {tmp_path / 'results'} --trials 2 --data " in lines[-1]
    assert lines[-1].endswith("--no-compile --resume")
    assert gone_after < 30  # the watchdog's three refused connections, not Ray's own minute

    assert (
        main([*args, "--resume"]) == 0
    )  # ends what is left of the dead driver's Ray, then goes on
    assert not ray_processes(temp_dir(study_dir))
    assert_agree(study_dir, f"sqlite:///{study_dir / '_optuna.db'}", "head", trials=2)


# ---- the retry itself, on SQLite: what is retried, what is not, and a tell whose answer was lost --


def _storage(tmp_path, **kw):
    from benchmark.search.storage import PatientStorage

    said: list[str] = []
    return PatientStorage(f"sqlite:///{tmp_path / 'study.db'}", say=said.append, **kw), said


def _dropped(statement: str = "UPDATE trials"):
    """What SQLAlchemy raises for a connection the server ended under a statement (psycopg's
    AdminShutdown is an OperationalError), as Optuna's session wraps it."""
    import sqlalchemy.exc

    try:
        raise sqlalchemy.exc.OperationalError(
            statement,
            {},
            Exception(
                "terminating connection due to administrator "
                "command\nSSL connection has been closed"
            ),
        )
    except sqlalchemy.exc.OperationalError as e:
        try:
            raise optuna.exceptions.StorageInternalError(
                "An exception is raised during the commit."
            ) from e
        except optuna.exceptions.StorageInternalError as wrapped:
            return wrapped


def test_a_tell_committed_before_its_connection_dropped_is_not_told_twice(tmp_path, monkeypatch):
    from optuna.storages import RDBStorage
    from optuna.trial import TrialState

    storage, said = _storage(tmp_path)
    study = optuna.create_study(storage=storage, study_name="s")
    trial = study.ask()
    original, calls = RDBStorage.set_trial_state_values, []

    def committed_then_dropped(self, trial_id, state, values=None):
        calls.append(state)
        done = original(self, trial_id, state, values)
        if len(calls) == 1:
            raise _dropped()  # the write is in the database; its answer never came back
        return done

    monkeypatch.setattr(RDBStorage, "set_trial_state_values", committed_then_dropped)
    study.tell(trial, 1.5)
    assert calls == [TrialState.COMPLETE, TrialState.COMPLETE]  # retried once, found told, accepted
    assert [(t.state.name, t.values) for t in study.trials] == [("COMPLETE", [1.5])]
    assert len(said) == 1 and re.fullmatch(
        f"the study's database sqlite:///{tmp_path / 'study.db'} did not answer "
        r"\(Exception: terminating connection due to administrator command\); it "
        r"answered again after [01]\.\d s",
        said[0],
    ), said  # one backoff step


@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
def test_two_drivers_popping_one_enqueued_point_at_once_claim_it_once(tmp_path, request, database):
    """Optuna claims an enqueued (WAITING) trial by reading its state, then writing RUNNING; on
    SQLite nothing locks the row between the two, and two drivers popping the queue at the same
    moment both claimed one grid point and trained it (CI: two drivers "ran" 5 trials of 4). Here
    both reach their first write together (a barrier before it): one gets the first point, the
    other finds it taken and gets the second."""
    import uuid

    import sqlalchemy

    from benchmark.search.storage import PatientStorage

    url = (
        f"sqlite:///{tmp_path / 'study.db'}"
        if database == "sqlite"
        else engine_url(request.getfixturevalue("postgres_url"))
    )
    storages = [PatientStorage(url) for _ in range(2)]  # two drivers, one study
    name = f"claim-{uuid.uuid4().hex[:8]}"
    study = optuna.create_study(storage=storages[0], study_name=name)
    for x in (1, 2):
        study.enqueue_trial({"x": x})
    barrier, first = threading.Barrier(2, timeout=30), threading.local()

    def together(conn, cursor, statement, *args):
        if statement.startswith("UPDATE trials") and not getattr(first, "passed", False):
            first.passed = True
            barrier.wait()  # both have read the queue; neither has written

    for storage in storages:
        sqlalchemy.event.listen(storage.engine, "before_cursor_execute", together)
    popped: list[int | None] = [None, None]

    def pop(i: int) -> None:
        popped[i] = optuna.load_study(study_name=name, storage=storages[i])._pop_waiting_trial_id()

    threads = [threading.Thread(target=pop, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    trials = study.get_trials()
    assert sorted(popped) == [t._trial_id for t in trials]  # each driver its own point
    assert [t.state.name for t in trials] == ["RUNNING", "RUNNING"]
    assert all(t.datetime_start is not None for t in trials)


def test_a_full_disk_and_a_wrong_value_are_not_waited_on(tmp_path, monkeypatch):
    import sqlalchemy.exc
    from optuna.storages import RDBStorage

    from benchmark.search.storage import StorageUnavailable, transient

    storage, said = _storage(tmp_path, wait_s=30)
    study = optuna.create_study(storage=storage, study_name="s")
    trial = study.ask()
    full = sqlalchemy.exc.OperationalError("INSERT", {}, Exception("database or disk is full"))
    assert transient(_dropped()) and not transient(full) and not transient(ValueError("too long"))
    for error, kind in ((full, sqlalchemy.exc.OperationalError), (ValueError("no"), ValueError)):
        calls = []

        def fails(self, *args, error=error, **kwargs):
            calls.append(1)
            raise error

        monkeypatch.setattr(RDBStorage, "set_trial_user_attr", fails)
        start = time.monotonic()
        with pytest.raises(kind):
            trial.set_user_attr("k", 1)
        assert (
            calls == [1] and time.monotonic() - start < 1
        )  # raised at once: the disk-full halt sees it
    assert not said

    gone = _dropped()
    monkeypatch.setattr(
        RDBStorage, "set_trial_user_attr", lambda self, *a, **k: (_ for _ in ()).throw(gone)
    )
    storage.wait_s = 1.0
    with pytest.raises(
        StorageUnavailable,
        match=r"^the study's database sqlite:///\S+ has not answered within 1 s "
        r"\(Exception: terminating connection due to administrator command\); "
        r"finished rows are kept\. Check that the server is up",
    ):
        trial.set_user_attr("k", 1)


def test_the_storage_is_named_without_its_password():
    from benchmark.search.storage import shown

    assert (
        shown("postgresql+psycopg://ana:s3cret@db.example:5432/studies")
        == "postgresql+psycopg://ana:***@db.example:5432/studies"
    )
    assert shown("sqlite:////tmp/x/_optuna.db") == "sqlite:////tmp/x/_optuna.db"


def test_a_study_replaced_under_the_search_stops_it_in_one_line(tmp_path):
    """A driver of the third reference study ended in a raw KeyError ("Record does not exist.")
    from a curve point's report when its database file was checked out over mid-search: it now
    stops the search as a database away does (exit 3, every row kept), saying what happened."""
    storage, search = _search_with_a_point(tmp_path)
    trial = search._ot_trials["a"]
    assert trial.storage.get_trial(trial._trial_id).intermediate_values == {100: 4.0}
    # an older copy of the file, made before the trial, copied over it
    shutil.copyfile(_older_study(tmp_path), tmp_path / "study.db")

    assert search.on_trial_result("a", {"val_loss": 3.9, "tokens": 200}) is None
    assert search.halt.kind == "storage" and search.halt.exit_code == 3
    assert re.fullmatch(
        r"the study's database sqlite:///\S+/study\.db no longer holds study 's' as this search "
        r"wrote it \(Optuna: Record does not exist\.\): it was replaced while the search ran \(a "
        r"file copied or checked out over it, an older copy restored\) or the study deleted; "
        r"finished rows are kept\. Put back the database this search wrote \(an older copy gives "
        r"out trial numbers its rows already hold\)",
        search.halt.message,
    )
    assert search.suggest("b") is None  # nothing more is asked
    # any other KeyError is no lost record: it is raised, as before
    with pytest.raises(KeyError, match="'lr'"):
        search._stop(KeyError("lr"))


def test_a_study_file_checked_out_over_under_the_search_stops_it_and_keeps_what_it_wrote(tmp_path):
    """`git stash` of a running third-reference-study's folder put new files at its studies'
    paths; SQLite's open connections read on from the old ones and refuse to write to them
    ("attempt to write a readonly database"), which the storage took for a database away: it
    waited, then said the database had not answered, and the file the search wrote went with its
    process. The next call now sees the new file by its inode, saves the search's own beside it
    and stops the search (exit 3), saying to put that back."""
    from benchmark.search.storage import StorageReplaced

    storage, search = _search_with_a_point(tmp_path)
    path = tmp_path / "study.db"
    older = _older_study(tmp_path)
    os.replace(_new_file_copy(older), path)  # what git does: a new file, renamed over the path

    assert search.on_trial_result("a", {"val_loss": 3.9, "tokens": 200}) is None
    assert search.halt.kind == "storage" and search.halt.exit_code == 3
    assert " was replaced while the search ran " in search.halt.message
    (saved,) = tmp_path.glob("study.db.this-search-*")
    assert re.fullmatch(rf"study\.db\.this-search-\d{{8}}T\d{{6}}Z-{os.getpid()}", saved.name)
    p, k = re.escape(str(path)), re.escape(str(saved))
    assert re.fullmatch(
        rf"the study's database {p} was replaced while the search ran \(another file, or none, is "
        r"at its path: moved or checked out over it, or removed\); finished rows are kept, and the "
        rf"database this search wrote is saved as {k}\. Move the other aside and put that back "
        rf"\(mv {p} {p}\.other; mv {k} {p}\), then --resume: the other file would give out trial "
        r"numbers whose rows exist",
        search.halt.message,
    )
    assert search.suggest("b") is None
    # the saved file is the search's: its trial and the curve point told before the change
    kept = optuna.load_study(study_name="s", storage=f"sqlite:///{saved}").trials
    assert [(t.number, t.intermediate_values) for t in kept] == [(0, {100: 4.0})]
    assert optuna.load_study(study_name="s", storage=f"sqlite:///{path}").trials == []
    # every later call says the same, and saves nothing more
    with pytest.raises(StorageReplaced, match="saved as"):
        storage.get_all_studies()
    assert len(list(tmp_path.glob("study.db.this-search-*"))) == 1
    # a storage unpickled (Tune pickles the searcher) holds the file it opens, and sees it go too
    (tmp_path / "pickled").mkdir()
    again = pickle.loads(pickle.dumps(_storage(tmp_path / "pickled", wait_s=1)[0]))
    assert again.get_all_studies() == []
    os.replace(_new_file_copy(older), tmp_path / "pickled" / "study.db")
    with pytest.raises(StorageReplaced, match="saved as"):
        again.get_all_studies()
    # a folder removed with its file: nothing can be saved, and the line says so
    (tmp_path / "removed").mkdir()
    removed, _ = _storage(tmp_path / "removed", wait_s=1)
    shutil.rmtree(tmp_path / "removed")
    with pytest.raises(
        StorageReplaced, match=r"none, is at its path.* could not be saved \(FileNotFoundError: "
    ):
        removed.get_all_studies()


def _search_with_a_point(tmp_path):
    """A searcher on a SQLite study (tmp_path/study.db): trial "a" asked, its first curve point told."""
    from optuna.distributions import FloatDistribution

    from benchmark.search.searcher import AttributedSearch

    storage, _ = _storage(tmp_path, wait_s=1)
    search = AttributedSearch(
        space={"lr": FloatDistribution(1e-3, 1e-2)},
        metric="val_loss",
        mode="min",
        study_name="s",
        storage=storage,
        ctx=None,
    )
    assert "lr" in search.suggest("a")
    search.on_trial_result("a", {"val_loss": 4.0, "tokens": 100})
    return storage, search


def _older_study(tmp_path):
    """The study's file as it was before any trial (study "s", empty), in tmp_path/older."""
    (tmp_path / "older").mkdir()
    older, _ = _storage(tmp_path / "older", wait_s=1)
    optuna.create_study(storage=older, study_name="s")
    older.remove_session()
    return tmp_path / "older" / "study.db"


def _new_file_copy(path):
    """A copy of `path` beside it, for os.replace over another file (git's way: a new file)."""
    copy = path.with_suffix(".copy")
    copy.write_bytes(path.read_bytes())
    return copy


def test_a_study_file_replaced_during_a_call_is_not_waited_on(tmp_path, monkeypatch):
    """Replaced between the check and SQLite's write, the write fails ("attempt to write a
    readonly database", which reads as a database away): the retry's check says what happened at
    once instead of waiting the whole --storage-wait."""
    from optuna.storages import RDBStorage

    from benchmark.search.storage import StorageReplaced

    storage, said = _storage(tmp_path, wait_s=30)
    trial = optuna.create_study(storage=storage, study_name="s").ask()
    older = _older_study(tmp_path)
    real = RDBStorage.set_trial_user_attr

    def replaced_meanwhile(self, *args, **kwargs):
        os.replace(_new_file_copy(older), tmp_path / "study.db")
        monkeypatch.setattr(RDBStorage, "set_trial_user_attr", real)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(RDBStorage, "set_trial_user_attr", replaced_meanwhile)
    start = time.monotonic()
    with pytest.raises(StorageReplaced, match="saved as"):
        trial.set_user_attr("k", 1)
    assert time.monotonic() - start < 10 and said == []
