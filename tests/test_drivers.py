"""Several drivers on one study: each trial recorded once, with a real PostgreSQL server
and with the SQLite file beside the rows; a driver never ends the processes of a live one; and a
space edited after its study began is refused in one line, with nothing in the study changed."""

import glob
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pandas as pd
import pytest
import tiny_search

from benchmark.search import ray_session
from benchmark.search.command import search_main as main
from benchmark.search.optuna_study import StudyError, check_declared, declaration
from benchmark.space.language import load_space
from benchmark.space.source import parse_set

ROOT = Path(__file__).resolve().parent.parent

# A finite space of 4 points (2 families x 2 FFN roundings), 16 steps a trial.
SPACE = tiny_search.space(
    "shared",
    ["family: [{families}]", "ffn.multiple_of: [16, 32]"],
    "description: two drivers, one study",
    "objectives: [val_loss:min]",
    "trials: 4",
)


def space_file(
    folder: Path, families: str = "transformer, looped", name: str = "shared.yaml"
) -> Path:
    path = folder / name
    path.write_text(SPACE.format(families=families))
    return path


def flags(space: Path, results: Path, corpus: Path, *more: str) -> list[str]:
    return [
        str(space),
        "--name",
        "shared",
        "--results",
        str(results),
        *tiny_search.cli(corpus),
        "--concurrency",
        "1",
        *tiny_search.CPU_FLAGS,  # one torch thread a trial, two drivers on the machine
        *more,
    ]


# ---- two drivers at once ----------------------------------------------------------------------


def _driver(args: list[str], log: Path) -> subprocess.Popen:
    out = open(log, "w")
    return subprocess.Popen(
        [sys.executable, str(ROOT / "run_search.py"), *args],
        cwd=ROOT,
        stdout=out,
        stderr=subprocess.STDOUT,
    )


def two_drivers(tmp_path: Path, corpus: Path, *more: str) -> tuple[Path, list[str]]:
    """Driver A starts; B starts once A is registered in the study and still running; both end."""
    results, space = tmp_path / "results", space_file(tmp_path)
    a = _driver(flags(space, results, corpus, *more), tmp_path / "a.log")
    registry = results / "shared" / "_drivers"
    deadline = time.monotonic() + 120
    while not (registry.is_dir() and any(registry.glob("*.json"))):
        assert a.poll() is None and time.monotonic() < deadline, (tmp_path / "a.log").read_text()
        time.sleep(0.2)
    b = _driver(flags(space, results, corpus, *more), tmp_path / "b.log")
    assert a.poll() is None, "driver A ended before B started: the drivers did not overlap"
    codes = [p.wait(timeout=300) for p in (a, b)]
    logs = [(tmp_path / f"{x}.log").read_text() for x in "ab"]
    assert codes == [0, 0], logs
    return results / "shared", logs


def ran(log: str) -> int:
    return int(re.search(r"(\d+) ran now", " ".join(log.split())).group(1))


def assert_recorded_once(study_dir: Path, storage: str, logs: list[str]) -> None:
    rows = pd.read_parquet(study_dir)
    assert (
        len(rows) == 4 and rows["trial_id"].is_unique and set(rows["status"]) <= {"ok", "pruned"}
    )  # ASHA
    assert len(set(rows["spec"])) == 4  # the 4 points of the space, each once
    study = optuna.load_study(study_name="shared", storage=storage)
    states = {}
    for t in study.trials:
        states.setdefault(t.state.name, set()).add(t.number)
    told = states.get("COMPLETE", set()) | states.get("PRUNED", set())
    assert told == set(rows["optuna_trial"])  # Optuna and the rows agree
    assert "RUNNING" not in states and "WAITING" not in states
    # a trial asked past the quota (both drivers asking for the last one) never trained
    assert all(
        t.user_attrs.get("status") == "surplus" for t in study.trials if t.state.name == "FAIL"
    )
    assert sum(ran(log) for log in logs) == 4, logs  # each driver counts what it ran, once
    assert "ran beside 1 other driver(s) of this study" in " ".join(logs[1].split())
    assert not list((study_dir / "_drivers").glob("*.json"))  # both ended and said so
    # ... and left no Ray session folder or lock file in the temp folder
    assert not glob.glob(glob.escape(ray_session.temp_dir(study_dir)) + ".*")


@pytest.mark.slow
def test_two_drivers_share_a_study_in_postgresql(tmp_path, corpus, postgres_url):
    study_dir, logs = two_drivers(tmp_path, corpus, "--storage", postgres_url)
    from benchmark.search.optuna_study import engine_url

    assert_recorded_once(study_dir, engine_url(postgres_url), logs)
    assert not (study_dir / "_optuna.db").exists()


@pytest.fixture(scope="module")
def sqlite_study(tmp_path_factory, corpus):
    tmp = tmp_path_factory.mktemp("sqlite")
    study_dir, logs = two_drivers(tmp, corpus)
    return study_dir, logs


@pytest.mark.slow
def test_two_drivers_share_a_study_in_sqlite_beside_the_rows(sqlite_study):
    study_dir, logs = sqlite_study
    assert_recorded_once(study_dir, f"sqlite:///{study_dir / '_optuna.db'}", logs)


# ---- a space edited after its study began -----------------------------------------------------


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
    }


@pytest.mark.slow
def test_an_edited_space_is_refused_in_one_line_and_nothing_changes(
    sqlite_study, tmp_path, corpus, capfd
):
    study_dir, _ = sqlite_study
    results = tmp_path / "results"
    shutil.copytree(study_dir, results / "shared")
    before = _snapshot(results)
    edited = space_file(tmp_path, families="transformer, looped, hc", name="edited.yaml")
    capfd.readouterr()
    assert main(flags(edited, results, corpus, "--resume")) == 2
    out, err = capfd.readouterr()
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(
        f"shapebench search: shared: the space changed since this study began "
        f"({results / 'shared' / '_study.json'}): axes.family: [transformer, looped] -> "
        "[transformer, looped, hc]. A study is one experiment: undo the change to resume it, "
        "or run the changed space as a new study (--name shared-2)"
    )
    assert _snapshot(results) == before  # the study, its rows and its declaration


def test_what_changed_is_named_and_what_may_grow_continues(tmp_path):
    path = space_file(tmp_path)
    space = load_space(path)
    recorded = {**declaration(space), "seeds": 2, "trials": 4}
    check_declared(
        load_space(path, [parse_set("trials=9")]), 3, recorded, "s/_study.json", "s"
    )  # more trials, seeds
    edited = load_space(path, [parse_set("budget=200K"), parse_set("training.tokens=20K")])
    with pytest.raises(StudyError) as err:
        check_declared(edited, 1, recorded, "r/s/_study.json", "s")
    assert str(err.value).startswith(
        "the space changed since this study began (r/s/_study.json): budget: 100K "
        "-> 200K; training.tokens: 4K -> 20K; seeds: 2 -> 1 (fewer than its "
        "trials were trained with). "
    )
    assert str(err.value).endswith("rank both studies' rows together with `shapebench board r`")


# ---- the processes of a live driver are not a stale run's ---------------------------------------

OWNER = """
import subprocess, sys, time
sys.path.insert(0, {root!r})
from benchmark.search import ray_session
slot = ray_session.claim({study!r})
# stands for its Ray: a process whose command line names the session folder
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", slot.folder + "/session_x"])
print(slot.folder, child.pid, flush=True)
time.sleep(120)
"""


def test_the_registry_keeps_live_drivers_and_drops_dead_ones(tmp_path, monkeypatch):
    import json

    from benchmark.search import roster

    study = str(tmp_path / "s")
    me = roster.Registry(study, "sqlite")
    folder = tmp_path / "s" / roster.FOLDER
    folder.mkdir(parents=True)
    here, now = socket.gethostname(), time.time()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()

    def enter(name, host, pid, started, beat):
        record = {
            "driver": {"host": host, "pid": pid, "started": started, "storage": "sqlite"},
            "beat": beat,
        }
        (folder / f"{name}.json").write_text(json.dumps(record))

    enter(
        "live", here, os.getppid(), roster._started(os.getppid()), now - 10 * roster.GRACE_S
    )  # runs: beat no matter
    enter("dead", here, dead.pid, "1", now)  # its pid ended: fresh beat no matter
    enter(
        "no-proc", here, dead.pid, None, now - 2 * roster.GRACE_S
    )  # no start time (macOS): by its beat
    enter("remote-fresh", "elsewhere", 1, "1", now)
    enter("remote-stale", "elsewhere", 2, "1", now - 2 * roster.GRACE_S)
    me.beat(force=True)
    assert sorted(d.pid for d in me.others()) == [1, os.getppid()]
    assert sorted(f.name for f in folder.iterdir()) == sorted(
        ["live.json", "remote-fresh.json", f"{me.me.id}.json"]
    )
    enter("no-proc", here, dead.pid, None, now)  # ... kept while its beat is fresh
    assert dead.pid in [d.pid for d in me.others()]
    me.end()
    assert f"{me.me.id}.json" not in [f.name for f in folder.iterdir()]


def test_a_live_drivers_processes_are_left_and_a_dead_ones_ended(tmp_path):
    study = str(tmp_path / "results" / "s")
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER.format(root=str(ROOT), study=study)],
        stdout=subprocess.PIPE,
        text=True,
    )
    folder, child = owner.stdout.readline().split()
    child = int(child)
    try:
        mine = ray_session.claim(study)  # a second driver of the study, while the first lives
        assert mine.folder != folder and mine.folder.endswith(".1") and folder.endswith(".0")
        # /proc can show the child's new command line a moment after the owner has printed its pid
        # on a loaded machine: wait for it, boundedly, before asking that it is found
        deadline = time.monotonic() + 10
        while ray_session.ray_processes(folder) != [child] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert tiny_search.alive(child) and ray_session.ray_processes(folder) == [child]
        mine.release()
        os.kill(owner.pid, signal.SIGKILL)  # the first driver dies; its "Ray" lives on
        owner.wait()
        assert tiny_search.alive(child)
        again = ray_session.claim(study)  # the next driver takes its slot and ends what it left
        assert again.folder == folder
        assert tiny_search.gone([child], within_s=5) and ray_session.ray_processes(folder) == []
        again.release()
    finally:
        for slot in (locals().get("mine"), locals().get("again")):
            if slot is not None:
                slot.release()
        for pid in (owner.pid, child):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


def test_a_slot_ended_tidily_leaves_nothing_and_a_lock_on_its_removed_file_is_not_taken(
    tmp_path, monkeypatch
):
    study = str(tmp_path / "s")
    prefix = ray_session.temp_dir(study)
    first = ray_session.claim(study)
    os.makedirs(first.folder + "/session_x/logs")
    first.release()  # a failed search: its logs stay
    assert os.path.isdir(first.folder + "/session_x/logs")
    again = ray_session.claim(study)
    assert again.folder == first.folder
    again.release(tidy=True)
    assert not glob.glob(glob.escape(prefix) + ".*")
    # A claimant that opened the lock file just before its owner removed it locks a file no path
    # names: it must take the path's new file, not think it holds the slot beside the next driver
    flock = ray_session.fcntl.flock
    owner = ray_session.claim(study)
    calls = []

    def owner_tidies_meanwhile(f, how):
        if not calls:
            calls.append(f.name)
            owner.release(tidy=True)
        return flock(f, how)

    monkeypatch.setattr(ray_session.fcntl, "flock", owner_tidies_meanwhile)
    lock = ray_session._try_lock(owner.folder)
    monkeypatch.setattr(ray_session.fcntl, "flock", flock)
    assert calls and lock is not None
    assert os.fstat(lock.fileno()).st_ino == os.stat(owner.folder + ".lock").st_ino
    lock.close()
    os.unlink(owner.folder + ".lock")


# ---- Ray that does not start --------------------------------------------------------------------


def test_a_local_start_that_outran_rays_wait_is_tried_again_after_ending_what_it_left(
    tmp_path, monkeypatch
):
    """Ray gives a new local node's raylet a fixed time to register (node.py), which a busy machine
    can outrun; the start is tried again, up to LOCAL_STARTS times, with the processes the late
    one left (they name the slot's folder) ended first. Any other failure is said at once."""
    import inspect

    import ray
    import ray._private.node

    # the words the retry looks for are Ray's own: a Ray that rewords them fails here
    assert ray_session.SLOW_START in inspect.getsource(ray._private.node)

    slot = ray_session.claim(str(tmp_path / "s"))
    late = "The current node timed out during startup. This could happen because some of the raylet"
    left = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)", f"--session_dir={slot.folder}/x"]
    )
    seen = []

    def init(*args, **kwargs):  # the first start times out, leaving a process behind
        seen.append(ray_session.ray_processes(slot.folder))
        if len(seen) == 1:
            raise RuntimeError(late)

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "shutdown", lambda: None)
    try:
        deadline = time.monotonic() + 10
        while ray_session.ray_processes(slot.folder) != [left.pid] and time.monotonic() < deadline:
            time.sleep(0.05)
        monkeypatch.setattr(ray, "init", init)
        assert ray_session.start(None, slot) is True
        assert seen == [[left.pid], []]
        assert left.wait(timeout=5) == -signal.SIGKILL

        def fails(message):
            def init(*args, **kwargs):
                seen.append(message)
                raise RuntimeError(message)

            return init

        seen.clear()
        monkeypatch.setattr(ray, "init", fails(late))
        with pytest.raises(ray_session.RayStartError, match="^Ray could not start: The current"):
            ray_session.start(None, slot)
        assert len(seen) == ray_session.LOCAL_STARTS == 3
        seen.clear()
        monkeypatch.setattr(ray, "init", fails("Failed to bind to port 6379"))
        with pytest.raises(ray_session.RayStartError, match="^Ray could not start: Failed to bind"):
            ray_session.start(None, slot)
        assert len(seen) == 1
        seen.clear()
        monkeypatch.setattr(ray, "init", fails(late))
        with pytest.raises(ray_session.RayStartError, match="could not connect to 10.0.0.1:6379"):
            ray_session.start("10.0.0.1:6379", None)  # a cluster's own start is not ours to redo
        assert len(seen) == 1
    finally:
        left.kill()
        slot.release()


def test_ray_that_cannot_start_is_one_line_and_exit_3(tmp_path, corpus, capfd, monkeypatch):
    import ray

    def fails(*args, **kwargs):
        raise RuntimeError(
            "The current node timed out during startup. This could happen because ...\nmore"
        )

    monkeypatch.setattr(ray, "init", fails)
    results = tmp_path / "results"
    capfd.readouterr()
    assert main(flags(space_file(tmp_path), results, corpus)) == 3
    err = capfd.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(
        "shapebench search: shared: stopped: Ray could not start: The current node timed out during "
        "startup. This could happen because ... (Ray's logs: /"
    )
    # the resume command repeats what the study was run with (its data, tokenizer, precision)
    assert (
        f"then: shapebench search {tmp_path / 'shared.yaml'} --name shared --results {results} --data "
        in err
    )
    assert err.endswith("--resume")
    assert "Traceback" not in capfd.readouterr().err
    assert not list((results / "shared" / "_drivers").glob("*"))  # the driver ended and said so
