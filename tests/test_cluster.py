"""Searches on a multi-node Ray cluster: resources sized per node, trials on every
node, a worker node lost mid-trial, results on S3, the infeasible case, and the README's
`ray start` commands driven from the command line.

The cluster is `ray.cluster_utils.Cluster` on this machine: a head with no CPUs (it runs no trial,
as a cluster's head often does) and two worker nodes of one CPU each, so no node can hold a trial
that asks for the cluster's total."""

import os
import secrets
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd
import pytest
import tiny_search

from benchmark.search import SearchHalted, SearchOptions, run_search
from benchmark.search.resources import Node, ResourcesError, per_trial
from benchmark.space.language import load_space

ROOT = Path(__file__).resolve().parent.parent

SPACE = """
name: {name}
description: cluster test
budget: 100K
count: total
tolerance: 2%
base: {{vocab_size: 320, n_heads: 2, layers: {{begin: 1, middle: 1, end: 1}}}}
axes:
  family: [transformer, looped, hyperloop, abbie-d]
training: {{tokens: {tokens}, seq_len: 32, batch_size: 8, lr: 3e-3, eval_tokens: 2K}}
objectives: [val_loss:min]
trials: {trials}
"""
POLICY = {"compile": False, "precision": "fp32"}


# ---- resources per trial: pure functions of the nodes ------------------------------------------


def test_defaults_come_from_the_largest_node_not_the_cluster_total():
    two_small = [Node(0, 0), Node(1, 0), Node(1, 0)]  # the head runs nothing
    res = per_trial(two_small)
    assert (res.cpus, res.gpus, res.concurrency) == (1, 0, 2)  # the bug: it asked for 2 CPUs
    one_machine = [Node(16, 0)]
    assert (per_trial(one_machine).cpus, per_trial(one_machine).concurrency) == (16, 1)
    assert per_trial(one_machine, concurrency=4).cpus == 4


def test_gpu_nodes_get_one_gpu_per_trial_and_fractions_share_one():
    nodes = [Node(8, 0), Node(32, 4), Node(32, 4)]
    res = per_trial(nodes)
    assert (res.cpus, res.gpus, res.concurrency) == (8, 1, 8)
    quarter = per_trial(nodes, gpus=0.25, cpus=2)
    assert quarter.concurrency == 2 * min(32 // 2, 16)
    assert quarter.bundle() == {"cpu": 2, "gpu": 0.25}


def test_no_node_holds_a_trial_names_what_is_missing():
    with pytest.raises(ResourcesError, match=r"CPU: a trial asks for 2, the largest node has 1"):
        per_trial([Node(0, 0), Node(1, 0), Node(1, 0)], cpus=2)
    with pytest.raises(ResourcesError, match=r"GPU: a trial asks for 1, the largest node has 0"):
        per_trial([Node(4, 0)], gpus=1)
    with pytest.raises(ResourcesError, match="no single node has 8 CPUs and 1 GPU"):
        per_trial([Node(8, 0), Node(2, 1)], cpus=8, gpus=1)


def test_a_run_started_on_a_node_that_died_waits_again_on_the_progress_board():
    """What the callback reads to tell runs that cannot start (search/progress.py): a run whose
    node died is Ray's to run again, not training; a trial run again asks anew for runs that had
    started; a trial ended for good leaves none of its runs waiting."""
    from benchmark.search.progress import Board

    alive = {"a", "b"}
    board = Board(alive=lambda: alive)
    board.ask(0, ["t0000-s0", "t0000-s1"])
    assert board.read()["runs"] == {"asked": 2, "started": 0}
    board.stage("t0000-s0", "started", "a")
    board.stage("t0000-s1", "started", "b")
    assert board.read()["runs"] == {"asked": 0, "started": 2}
    alive.discard("a")
    assert board.read()["runs"] == {"asked": 1, "started": 1}
    board.stage("t0000-s0", "started", "b")  # Ray ran its task again, on b
    assert board.read()["runs"] == {"asked": 0, "started": 2}
    board.ask(0, ["t0000-s0", "t0000-s1"])  # Tune ran the trial again (its node lost)
    assert board.read()["runs"] == {"asked": 2, "started": 0}
    board.stop(0)  # its last attempt failed: the callback ended it
    assert board.read()["runs"] == {"asked": 0, "started": 0}
    assert board.news(0, None, 0)["stopped"]


# ---- a real cluster -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster(s3_endpoint):
    """Started after the S3 endpoint's variables are set, so every node's workers can reach it."""
    import ray
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    workers = [c.add_node(num_cpus=1), c.add_node(num_cpus=1)]
    c.wait_for_nodes()
    yield c, workers
    ray.shutdown()
    c.shutdown()


def _space(tmp_path: Path, name: str, tokens: str = "40K", trials: int = 4):
    path = tmp_path / f"{name}.yaml"
    path.write_text(SPACE.format(name=name, tokens=tokens, trials=trials))
    return load_space(path)


def _options(corpus: Path, results, name: str, **kw) -> SearchOptions:
    return SearchOptions(
        name=name,
        results_dir=results,
        asha=False,
        retries=0,
        data=tiny_search.data(corpus),
        **kw,
    )


@pytest.mark.slow
def test_results_on_s3_from_every_node(cluster, corpus, tmp_path, s3_endpoint):
    import optuna

    from benchmark.leaderboard.command import main as board
    from benchmark.search.optuna_study import OPTUNA_DB
    from benchmark.store.location import resolve

    c, workers = cluster
    results = f"{s3_endpoint}/runs"
    opts = _options(corpus, results, "ons3", address=c.address)
    summary = run_search(_space(tmp_path, "ons3", tokens="8K"), opts, policy=POLICY)
    df = pd.read_parquet(f"{results}/ons3")  # pandas reads the URI through pyarrow.fs
    assert sorted(df["trial_id"]) == ["t0000", "t0001", "t0002", "t0003"] and set(df["status"]) == {
        "ok"
    }
    assert set(df["node_id"]) == {
        w.node_id for w in workers
    }  # both worker nodes ran trials; the head none
    assert summary.ran == 4 and summary.written == 4
    fs, path = resolve(f"{results}/ons3/{OPTUNA_DB}")
    local = tmp_path / "study.db"
    local.write_bytes(fs.open_input_file(path).read())  # the study, copied beside the rows
    study = optuna.load_study(study_name="ons3", storage=f"sqlite:///{local}")
    assert len([t for t in study.trials if t.state.name == "COMPLETE"]) == 4
    assert board([f"{results}", "--out", str(tmp_path / "site"), "--format", "html,md"]) == 0
    page = (tmp_path / "site" / "index.html").read_text()
    assert "ons3" in page and "transformer" in page


@pytest.mark.slow
def test_a_worker_node_lost_mid_trial_is_run_again_elsewhere(cluster, corpus, tmp_path):
    import ray
    from ray._private.state import available_resources_per_node

    c, workers = cluster
    lost: list[str] = []

    def remove_a_busy_node():
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not lost:
            if ray.is_initialized():
                free = available_resources_per_node()
                # A node whose CPU is all taken by a trial: Ray leaves a resource at 0 out of the dict.
                busy = [w for w in workers if w.node_id in free and not free[w.node_id].get("CPU")]
                if busy:
                    time.sleep(2.0)  # well inside the trial, which runs for tens of seconds
                    c.remove_node(busy[0])
                    lost.append(busy[0].node_id)
            time.sleep(0.2)

    watcher = threading.Thread(target=remove_a_busy_node, daemon=True)
    watcher.start()
    opts = _options(corpus, tmp_path / "results", "lost", address=c.address, pending_timeout_s=120)
    run_search(_space(tmp_path, "lost", tokens="120K", trials=2), opts, policy=POLICY)
    watcher.join(timeout=5)
    df = pd.read_parquet(tmp_path / "results" / "lost")
    assert lost, "no trial was seen running on a worker node"
    assert sorted(df["trial_id"]) == ["t0000", "t0001"]  # each trial exactly once
    assert set(df["status"]) == {"ok"} and df["val_loss"].notna().all()
    assert lost[0] not in set(df["node_id"])  # what ran on the lost node ran again on the other
    workers[:] = [w for w in workers if w.node_id != lost[0]] + [c.add_node(num_cpus=1)]
    c.wait_for_nodes()


@pytest.mark.slow
def test_no_node_can_hold_a_trial_stops_within_seconds(cluster, corpus, tmp_path):
    c, _ = cluster
    opts = _options(corpus, tmp_path / "results", "toolarge", address=c.address, cpus_per_trial=2)
    start = time.monotonic()
    with pytest.raises(
        SearchHalted, match=r"CPU: a trial asks for 2, the largest node has 1"
    ) as err:
        run_search(_space(tmp_path, "toolarge"), opts, policy=POLICY)
    assert err.value.kind == "resources" and time.monotonic() - start < 30
    import ray

    assert not ray.is_initialized()  # the search disconnected from the cluster it had connected to


@pytest.mark.slow
@pytest.mark.parametrize("what", ["run", "trial"])
def test_trials_that_cannot_start_stop_the_search_saying_what_is_free(
    cluster, corpus, tmp_path, what
):
    """Every node could hold a trial, but something else holds their CPUs: after
    `pending_timeout_s` with trials waiting and none running the search stops, never hangs. With
    every run its own task (the default) the trials start, holding nothing, and their runs wait
    (a longer timeout: a trial's worker takes seconds to start on a busy machine, and until
    then it is the trial that waits)."""
    import ray

    c, workers = cluster
    ray.init(address=c.address, log_to_driver=False)

    @ray.remote(num_cpus=1)
    class Squatter:
        def ready(self):
            return True

    squatters = [Squatter.remote() for _ in workers]
    ray.get([s.ready.remote() for s in squatters])
    opts = _options(
        corpus,
        tmp_path / "results",
        "pending",
        address=c.address,
        pending_timeout_s=20 if what == "run" else 5,
        runs_as_tasks=what == "run",
    )
    start = time.monotonic()
    try:
        with pytest.raises(
            SearchHalted,
            match=rf"no {what} has started for \d+ s: each asks for 1 CPU, and the "
            r"cluster has 0 CPUs and 0 GPUs free on 3 alive nodes",
        ) as err:
            run_search(_space(tmp_path, "pending"), opts, policy=POLICY)
        took = time.monotonic() - start
    finally:  # the squatters were this driver's actors: they end with its connection, which a
        ray.shutdown()  # failed case must not leave to the next (`ray.init` twice)
    assert err.value.kind == "resources" and took < 90


@pytest.mark.slow
def test_a_run_whose_node_is_lost_and_cannot_start_again_stops_the_search(corpus, tmp_path):
    """The node of the one worker a run can train on is lost while the run trains: Ray runs its
    task again (or Tune its trial, when the trial's actor was there too, which asks for the run
    again), and it cannot start, as no node has a CPU. The progress board had the run as
    started, and must not go on saying so: the search stops after `pending_timeout_s`, saying
    what is missing, rather than running to its time budget (the guard that ends this test if
    the run still counts as training). The timeout is long enough for a worker to start on a
    busy 2-core machine: a shorter one stopped the search before its run had begun."""
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    node = c.add_node(num_cpus=1)
    c.wait_for_nodes()
    saved = tmp_path / "results" / "gone" / "_runstate"
    removed, done = threading.Event(), threading.Event()

    def remove_the_node_once_its_run_has_saved():
        while not done.wait(0.1):  # a state saved: the run's task has started
            if list(saved.glob("*.state.safetensors")):
                c.remove_node(node)
                removed.set()
                return

    watcher = threading.Thread(target=remove_the_node_once_its_run_has_saved, daemon=True)
    watcher.start()
    opts = _options(
        corpus,
        tmp_path / "results",
        "gone",
        address=c.address,
        pending_timeout_s=30,
        time_budget_s=300,
        checkpoint_every="5",
    )
    try:
        with pytest.raises(
            SearchHalted, match=r"no run has started for \d+ s: each asks for 1 CPU"
        ):
            run_search(_space(tmp_path, "gone", tokens="1M", trials=1), opts, policy=POLICY)
    finally:
        done.set()
        watcher.join(timeout=5)
        c.shutdown()
    assert removed.is_set(), "the search stopped before its run had started"


# ---- the README's commands: `ray start`, then the command line with --address ---------------------


@pytest.mark.slow
def test_the_cli_against_a_cluster_started_with_ray_start(corpus, tmp_path):
    """A second cluster, started as the README says (a head with no CPUs, one worker node,
    token authentication on), and `shapebench search --address`: a trial runs on the worker; a
    trial that no node can hold is one line and exit 2."""
    ray_bin = shutil.which("ray", path=str(Path(sys.executable).parent))
    temp = f"/tmp/sbcli-{os.getpid()}"
    port = str(_free_port())
    token = (
        tmp_path / "auth_token"
    )  # README: one token, on every node, with token authentication on
    token.write_text(secrets.token_hex(32))
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN_PATH": str(token),
    }
    try:
        subprocess.run(
            [
                ray_bin,
                "start",
                "--head",
                "--num-cpus=0",
                f"--port={port}",
                f"--temp-dir={temp}",
                "--include-dashboard=false",
            ],
            check=True,
            capture_output=True,
            env=env,
            timeout=120,
        )
        subprocess.run(
            [ray_bin, "start", f"--address=127.0.0.1:{port}", "--num-cpus=1"],
            check=True,
            capture_output=True,
            env=env,
            timeout=120,
        )
        space = tmp_path / "cli.yaml"
        space.write_text(SPACE.format(name="cli", tokens="8K", trials=1))
        out = subprocess.run(
            [
                sys.executable,
                str(ROOT / "run_search.py"),
                str(space),
                "--address",
                f"127.0.0.1:{port}",
                "--results",
                str(tmp_path / "results"),
                *tiny_search.cli(corpus),
                "--storage",
                f"sqlite:///{tmp_path / 'shared.db'}",
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
            cwd=tmp_path,
        )
        assert out.returncode == 0, out.stderr[-3000:]
        import optuna  # the study is in the database --storage named, not beside the rows

        shared = optuna.load_study(study_name="cli", storage=f"sqlite:///{tmp_path / 'shared.db'}")
        assert [t.state.name for t in shared.trials] == ["COMPLETE"]
        assert not (tmp_path / "results" / "cli" / "_optuna.db").exists()
        df = pd.read_parquet(tmp_path / "results" / "cli")
        assert len(df) == 1 and set(df["status"]) == {"ok"} and df["node_id"].notna().all()
        tight = subprocess.run(
            [
                sys.executable,
                str(ROOT / "run_search.py"),
                str(space),
                "--address",
                f"127.0.0.1:{port}",
                "--results",
                str(tmp_path / "r2"),
                "--cpus-per-trial",
                "4",
                "--data",
                str(corpus / "text.txt"),
                "--tokenizer",
                tiny_search.TOKENIZER,
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
            cwd=tmp_path,
        )
        assert (
            tight.returncode == 2
            and "CPU: a trial asks for 4, the largest node has 1" in tight.stderr
        )
    finally:
        _stop(temp)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop(temp: str) -> None:
    """End this test's Ray processes only (`ray stop` would end every Ray on the machine)."""
    import signal

    from benchmark.search import ray_processes

    for pid in ray_processes(temp):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    shutil.rmtree(temp, ignore_errors=True)
