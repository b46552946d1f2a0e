"""Shared fixtures: a real S3 endpoint on 127.0.0.1 (moto's server, started once per session), so
the results store is tested on URIs through the same pyarrow S3 client a cloud bucket gets."""

from __future__ import annotations

import os
import random
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid

import pytest

BUCKET = "shapebench-test"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# The server's own first lines, on Linux: stop when the parent (pytest) goes, even when a timeout kills
# it and no teardown runs (prctl PR_SET_PDEATHSIG); then moto's command line as `python -m` runs it.
SERVER = """
import ctypes, runpy, signal, sys
if sys.platform == "linux":
    ctypes.CDLL(None).prctl(1, signal.SIGTERM)
runpy.run_module("moto.server", run_name="__main__", alter_sys=True)
"""


def _wait_until_up(url: str, server: subprocess.Popen, log, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            log.seek(0)
            pytest.fail(
                f"moto server exited with {server.returncode}: {log.read().decode()[-2000:]}"
            )
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    server.kill()
    pytest.fail(f"moto server did not answer {url} within {timeout_s:g} s")


@pytest.fixture(scope="session")
def s3_endpoint():
    """`s3://<bucket>` on a moto server; AWS_* variables point pyarrow at it for the session."""
    port = _free_port()
    # moto logs every request: into a file, as a pipe nobody reads would fill up and stop it.
    with tempfile.TemporaryFile() as log:
        server = subprocess.Popen(
            [sys.executable, "-c", SERVER, "-H", "127.0.0.1", "-p", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        patch = pytest.MonkeyPatch()
        try:
            _wait_until_up(f"http://127.0.0.1:{port}/moto-api/", server, log)
            for key, value in {
                "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
                "AWS_ACCESS_KEY_ID": "testing",
                "AWS_SECRET_ACCESS_KEY": "testing",
                "AWS_DEFAULT_REGION": "us-east-1",
                "AWS_EC2_METADATA_DISABLED": "true",
            }.items():
                patch.setenv(key, value)
            for key in (
                "AWS_PROFILE",
                "AWS_SESSION_TOKEN",
            ):  # a developer's own must not reach the fake endpoint
                patch.delenv(key, raising=False)
            import pyarrow.fs as pafs

            pafs.FileSystem.from_uri(f"s3://{BUCKET}?allow_bucket_creation=true")[0].create_dir(
                BUCKET
            )
            yield f"s3://{BUCKET}"
        finally:
            patch.undo()
            server.terminate()
            try:
                server.wait(10)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()


@pytest.fixture
def s3_prefix(s3_endpoint) -> str:
    """A fresh prefix in the test bucket for one test."""
    return f"{s3_endpoint}/{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="session", autouse=True)
def one_torch_thread():
    """One intra-op thread for the tests' tiny models, here and in the processes they start
    (OMP_NUM_THREADS; Ray's trainables set their own from the CPUs they hold). Two threads do not
    speed such models up, and on a 2-core machine where anything else runs (Ray's processes, a
    subprocess, another job) they wait on each other: a tiny trial took 60 times as long, a few
    test files 5.6 times (benchmarks/2026-11-27-xeon-amx-plan-and-suite.md)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OMP_NUM_THREADS", "1")
        yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session", autouse=True)
def own_ray_folder():
    """The Ray sessions the tests start live in one folder, removed at the end: the searches that
    tests stop, kill or fail on purpose leave their session folders (with Ray's logs, as a user's
    failed search should), one per study, and each test's study is new. Short (Ray's socket paths
    are limited to ~107 chars); child processes inherit it."""
    import shutil

    folder = tempfile.mkdtemp(prefix="sbt-", dir="/tmp" if os.path.isdir("/tmp") else None)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RAY_TMPDIR", folder)
        yield
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def own_speeds_file(tmp_path_factory):
    """Tests never read or teach this machine's measured speeds (store/speeds.py): the tiny,
    uncompiled trials they run would skew a user's `--plan` estimates, and a user's would move
    the numbers the plan tests pin. Child processes and Ray workers inherit the variable."""
    from benchmark.store.speeds import ENV

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(ENV, str(tmp_path_factory.mktemp("speeds") / "perf.json"))
        yield


@pytest.fixture(autouse=True)
def plans_ignore_this_machines_token_cache(monkeypatch):
    """A plan counts the passes over the data, and refuses too many, from the token cache when the
    corpus is tokenised there (search/preflight.py). This machine's own cache
    (~/.cache/shapebench), warmed by whatever ran here before, must not decide whether a test's
    plan is refused; a test that tokenises into a cache of its own ($SHAPEBENCH_CACHE or
    data.cache_dir) reads that one. A search's refusal tokenises, so it does not depend on this."""
    from benchmark.search import preflight

    real = preflight.cached_parts

    def own_cache_only(cfg):
        if cfg.cache_dir is None and "SHAPEBENCH_CACHE" not in os.environ:
            return None
        return real(cfg)

    monkeypatch.setattr(preflight, "cached_parts", own_cache_only)


@pytest.fixture(scope="session")
def corpus(tmp_path_factory):
    """A folder with `text.txt`, 400 paragraphs of a 13-word vocabulary, and its token cache: the
    corpus of the search and cluster tests (a module's own `corpus` fixture takes precedence)."""
    root = tmp_path_factory.mktemp("words")
    rng = random.Random(0)
    words = "the cat dog sat ran on under a mat log hill and then".split()
    (root / "text.txt").write_text(
        "\n\n".join(" ".join(rng.choice(words) for _ in range(40)) for _ in range(400))
    )
    return root


@pytest.fixture(scope="module")
def grammar_corpus(tmp_path_factory):
    """A few hundred short paragraphs of a tiny grammar, tokenised: learnable structure, fast to
    tokenise; the corpus of the trial and curve tests (tiny_trial.py)."""
    from benchmark.data import DataConfig, prepare

    words = "the cat dog sat ran on under a mat log hill big small red blue and then".split()
    root = tmp_path_factory.mktemp("corpus")
    rng = random.Random(0)
    paras = []
    for _ in range(400):
        sents = [
            f"{rng.choice(words[:3])} {rng.choice(words[3:5])} {rng.choice(words[5:7])} the {rng.choice(words[7:10])}."
            for _ in range(rng.randint(2, 5))
        ]
        paras.append(" ".join(sents).capitalize())
    (root / "text.txt").write_text("\n\n".join(paras))
    return prepare(
        DataConfig(
            source=str(root / "text.txt"), tokenizer="bpe:300", cache_dir=str(root / "cache")
        )
    )


@pytest.fixture
def count_encodes(monkeypatch) -> list[int]:
    """The batch sizes the tokenizer encoded while the test ran: empty when a token cache was hit."""
    from benchmark.data.tokenizer import Tokenizer

    calls: list[int] = []
    original = Tokenizer.encode_batch

    def counting(self, texts):
        calls.append(len(texts))
        return original(self, texts)

    monkeypatch.setattr(Tokenizer, "encode_batch", counting)
    return calls


@pytest.fixture(scope="module")
def postgres_server():
    """A PostgreSQL server (tests/postgres.py) for one test module; skipped, saying why, where
    none can start. A test that stops it leaves it running again."""
    from postgres import Unavailable, start_server

    try:
        server = start_server()
    except Unavailable as e:
        pytest.skip(str(e))
    try:
        yield server
    finally:
        server.end()


@pytest.fixture(scope="module")
def postgres_url(postgres_server) -> str:
    return postgres_server.url
