"""The results store under faults, on real files and a real S3 endpoint: damaged row files are
skipped and named, then quarantined; a results location that cannot take rows is refused before
any training; a full disk keeps the row in a fallback folder until `recover`; and every store
function works on an s3:// URI as on a path."""

from __future__ import annotations

import errno
import math
import os
import re
import socket
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import tiny_search

from benchmark.store import location
from benchmark.store.declaration import read_study_info, write_study_info
from benchmark.store.errors import ResultsPathError
from benchmark.store.location import check_results, free_bytes
from benchmark.store.results import (
    COLUMNS,
    ResultsWarning,
    StoreFull,
    damaged_files,
    finished_trials,
    quarantine,
    read_files,
    read_study,
    read_table,
    recover,
    sweep_orphans,
    to_table,
    trial_files,
    write_row,
)

ROOT = Path(__file__).resolve().parents[1]


def row(i: int, study: str = "demo", **kw) -> dict:
    """Trial i of a small study: the columns the leaderboard ranks by, at realistic magnitudes."""
    return {
        "study": study,
        "trial_id": f"t{i:04d}",
        "status": "ok",
        "val_loss": 3.0 + i / 8,
        "val_ppl": math.exp(3.0 + i / 8),
        "params_total": 1_500_000 + 1_000 * i,
        "params_non_embedding": 1_000_000 + 1_000 * i,
        "family": "transformer",
        "seed": 0,
        **kw,
    }


def a_study(folder, n: int = 5) -> list[str]:
    return [write_row(folder, row(i)) for i in range(n)]


def trial_ids(table: pa.Table) -> list[str]:
    return sorted(table["trial_id"].to_pylist())


# ---- damaged files: skipped, named, quarantined -------------------------------------------------


def _truncated(path: Path) -> str:
    path.write_bytes(path.read_bytes()[:300])
    return "Parquet magic bytes not found in footer"


def _emptied(path: Path) -> str:
    path.write_bytes(b"")
    return "empty file"


def _footer_garbled(path: Path) -> str:
    # Keep the size and both "PAR1" marks; scramble the footer (the schema) that precedes the end.
    data = bytearray(path.read_bytes())
    n = int.from_bytes(data[-8:-4], "little")
    data[-8 - n : -8] = bytes((b * 7 + 13) % 256 for b in data[-8 - n : -8])
    path.write_bytes(bytes(data))
    return ""  # thrift's wording varies; that the file is named is what counts


def _text_in_a_number_column(path: Path) -> str:
    table = to_table(row(2)).set_column(COLUMNS.index("val_loss"), "val_loss", pa.array(["2.5"]))
    pq.write_table(table, path)
    return "its columns do not match the study's"


@pytest.mark.parametrize(
    "damage", [_truncated, _emptied, _footer_garbled, _text_in_a_number_column]
)
def test_a_damaged_file_is_skipped_and_named_and_the_other_rows_read(tmp_path, damage):
    files = a_study(tmp_path / "demo")
    words = damage(Path(files[2]))
    skipped: list = []
    assert trial_ids(read_table(tmp_path / "demo", skipped)) == ["t0000", "t0001", "t0003", "t0004"]
    assert skipped == [files[2]]
    with pytest.warns(ResultsWarning) as said:
        assert len(read_study(tmp_path / "demo")) == 4
    assert len(said) == 1
    assert re.fullmatch(
        rf"{re.escape(files[2])}: not a readable Parquet file \(.*{re.escape(words)}.*\); skipped",
        str(said[0].message),
    )
    assert damaged_files(tmp_path / "demo") == [files[2]]


def test_quarantine_moves_damaged_files_out_of_every_reader(tmp_path):
    study = tmp_path / "demo"
    files = a_study(study)
    _truncated(Path(files[2]))
    assert quarantine(study) == [str(study / "_quarantine" / "t0002.a0.parquet")]
    assert (
        not Path(files[2]).exists()
        and (study / "_quarantine" / "t0002.a0.parquet").stat().st_size == 300
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert trial_ids(read_table(study)) == ["t0000", "t0001", "t0003", "t0004"]
        assert len(pd.read_parquet(study)) == 4  # pandas (pyarrow) skips "_quarantine" too
        assert set(finished_trials(study)) == {"t0000", "t0001", "t0003", "t0004"}
    # The same name damaged again does not overwrite the first one kept.
    _emptied(Path(write_row(study, row(2))))
    assert quarantine(study) == [str(study / "_quarantine" / "t0002.a0.parquet.1")]
    assert quarantine(study) == [] and damaged_files(study) == []


def load_leaderboard():
    from benchmark.leaderboard import command as cli

    return cli


def test_the_leaderboard_shows_a_study_with_a_damaged_file_and_says_how_to_redo_it(
    tmp_path, capsys
):
    results = tmp_path / "results"
    files = a_study(results / "demo", 6)
    write_study_info(
        results / "demo", {"space": "demo", "objectives": [["params", "min"], ["val_ppl", "min"]]}
    )
    _truncated(Path(files[3]))
    assert load_leaderboard().main([str(results), "--format", "md"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith("# Leaderboard: demo")
    assert (
        f"- demo: 1 unreadable trial file skipped (t0003.a0.parquet); redo with: shapebench search "
        f"SPACE.yaml --name demo --results {results} --resume (SPACE.yaml: the file of space 'demo')"
    ) in out
    shown = {float(v) for v in re.findall(r"\| (\d+\.\d+) \|", out.split("## Budget")[1])}
    assert {round(r["val_ppl"], 2) for i, r in enumerate(map(row, range(6))) if i != 3} <= shown
    assert f"shapebench board: {files[3]}: not a readable Parquet file; skipped" in err.splitlines()


# ---- a results location that cannot take rows is refused before any training -------------------


@pytest.fixture
def tmpfs(tmp_path):
    """mount(name, options) -> a real tmpfs folder (unmounted after the test); skips when this
    machine does not let the test mount (not root, or in a container without the capability)."""
    mounted = []

    def mount(name: str, options: str) -> Path:
        folder = tmp_path / name
        folder.mkdir()
        try:
            done = subprocess.run(
                ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)],
                check=False,
                capture_output=True,
                text=True,
                timeout=20,
            )
        except (OSError, subprocess.TimeoutExpired) as err:
            pytest.skip(f"cannot run mount here ({err}); the injected variant covers the code path")
        if done.returncode:
            pytest.skip(
                f"mounting a tmpfs is not permitted here ({done.stderr.strip()}); "
                "the injected variant covers the code path"
            )
        mounted.append(folder)
        return folder

    yield mount
    for folder in mounted:
        subprocess.run(["umount", str(folder)], check=False, capture_output=True, timeout=20)


def refused(where, timeout_s: float = 20) -> tuple[str, float]:
    start = time.monotonic()
    with pytest.raises(ResultsPathError) as caught:
        check_results(where, timeout_s)
    return str(caught.value), time.monotonic() - start


def test_a_results_path_that_is_a_file_is_refused_at_once(tmp_path):
    (tmp_path / "file").write_text("not a folder")
    said, took = refused(tmp_path / "file")
    assert said == f"{tmp_path / 'file'}: exists and is a file, not a directory" and took < 1
    below = tmp_path / "file" / "results"
    assert refused(below)[0] == f"{below}: a parent is a file, not a directory"


def test_a_missing_results_folder_is_made_and_the_probe_leaves_nothing(tmp_path):
    check_results(tmp_path / "new" / "results")
    assert os.listdir(tmp_path / "new" / "results") == []


def test_a_read_only_file_system_is_refused(tmpfs):
    ro = tmpfs("ro", "size=1m,ro")
    assert refused(ro) == (f"{ro}: read-only file system", pytest.approx(0, abs=1))
    assert refused(ro / "results")[0] == f"{ro / 'results'}: read-only file system"


def test_an_injected_read_only_file_system_is_refused(tmp_path, monkeypatch):
    real = os.open

    def read_only(path, *args, **kw):
        if os.path.basename(path).startswith(".probe-"):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), path)
        return real(path, *args, **kw)

    monkeypatch.setattr(os, "open", read_only)
    assert refused(tmp_path)[0] == f"{tmp_path}: read-only file system"


def test_a_bucket_that_does_not_exist_is_refused_and_a_good_one_passes(s3_endpoint, s3_prefix):
    said, took = refused("s3://no-such-bucket-here/results", timeout_s=10)
    assert said == "s3://no-such-bucket-here/results: the bucket does not exist" and took < 5
    check_results(f"{s3_prefix}/results")
    assert location.files(f"{s3_prefix}/results") == []  # the probe is gone


# ---- a full disk: the row is kept aside, then recovered -----------------------------------------


def fill(folder: Path) -> Path:
    """Writes a file in `folder` until its file system has no byte left."""
    filler = folder / "filler"
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError as err:
            assert err.errno == errno.ENOSPC
    try:
        with open(filler, "ab", buffering=0) as f:
            while f.write(b"\0"):
                pass
    except OSError:
        pass
    return filler


def test_a_full_disk_keeps_the_row_aside_and_recover_brings_it_back(tmp_path, tmpfs):
    disk = tmpfs("disk", "size=160k")
    study, aside = disk / "demo", tmp_path / "aside"
    write_row(study, row(0))
    filler = fill(disk)
    assert free_bytes(study) == 0
    with pytest.raises(StoreFull) as caught:
        write_row(study, row(1), fallback=aside)
    full = caught.value
    assert (full.path, full.saved) == (
        str(study / "trials" / "t0001.a0.parquet"),
        str(aside / "demo" / "trials" / "t0001.a0.parquet"),
    )
    assert full.needed == os.path.getsize(full.saved) > 4096
    assert (
        str(full)
        == f"{full.path}: the disk is full ({full.needed} bytes needed); the row was saved to {full.saved}"
    )
    assert sorted(os.listdir(study / "trials")) == [
        "t0000.a0.parquet"
    ]  # no partial file, no temporary
    assert [r["trial_id"] for r in read_files([full.saved])] == ["t0001"]
    filler.unlink()
    assert recover(study, aside) == ["t0001.a0.parquet"]
    assert trial_ids(read_table(study)) == ["t0000", "t0001"]
    assert not (aside / "demo").exists() and recover(study, aside) == []


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT], ids=["ENOSPC", "EDQUOT"])
def test_an_injected_full_disk_keeps_the_row_aside(tmp_path, monkeypatch, code):
    study, aside = tmp_path / "disk" / "demo", tmp_path / "aside"
    write_row(study, row(0))
    real = os.replace

    def full(src, dst, *args, **kw):  # the temporary file is written; publishing it fails
        if str(dst).startswith(str(study)):
            raise OSError(code, os.strerror(code), dst)
        return real(src, dst, *args, **kw)

    monkeypatch.setattr(os, "replace", full)
    with pytest.raises(
        StoreFull, match=re.escape(f"{study / 'trials' / 't0001.a0.parquet'}: the disk is full (")
    ):
        write_row(study, row(1), fallback=aside)
    with pytest.raises(
        StoreFull, match=r"bytes needed\); the row was not saved anywhere$"
    ) as caught:
        write_row(study, row(2))
    assert caught.value.saved is None
    assert sorted(os.listdir(study / "trials")) == ["t0000.a0.parquet"]
    monkeypatch.undo()
    (aside / "demo" / "trials" / "t0009.a0.parquet").write_bytes(b"PAR1 torn")
    with pytest.warns(
        ResultsWarning, match=r"t0009.a0.parquet: not a readable Parquet file .*; left where it is"
    ):
        assert recover(study, aside) == ["t0001.a0.parquet"]
    assert trial_ids(read_table(study)) == ["t0000", "t0001"]
    assert os.listdir(aside / "demo" / "trials") == ["t0009.a0.parquet"]


@pytest.mark.slow
def test_ray_tunes_full_disk_tracebacks_are_not_shown(tmp_path, tmpfs, corpus):
    """Ray Tune logs a traceback each time its experiment state finds the disk full (twice as a
    search ends: tune.py's last checkpoint waits for its sync, then syncs and waits again); the
    rows and the study are what a search keeps, so the user sees none of them. Tune's folder
    alone is full here, so the search still finishes."""
    (tmp_path / "results" / "demo").mkdir(parents=True)
    tmpfs("results/demo/_ray", "size=40k")
    space = tmp_path / "demo.yaml"
    space.write_text(
        "name: demo\ndescription: d\nbudget: 100K\ncount: total\ntolerance: 2%\n"
        "base: {vocab_size: 320, n_heads: 2, layers: {begin: 1, middle: 1, end: 1}}\n"
        "axes: {family: [transformer]}\nobjectives: [val_loss:min]\ntrials: 1\n"
        "training: {tokens: 4K, seq_len: 32, batch_size: 8, eval_tokens: 2K}\n"
    )
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "run_search.py"),
            str(space),
            "--results",
            str(tmp_path / "results"),
            *tiny_search.cli(corpus),
            *tiny_search.CPU_FLAGS,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert len(read_study(tmp_path / "results" / "demo")) == 1


def test_a_write_that_fails_for_another_reason_is_not_called_a_full_disk(tmp_path, monkeypatch):
    def denied(src, dst, *args, **kw):
        raise PermissionError(errno.EACCES, "Permission denied", dst)

    monkeypatch.setattr(os, "replace", denied)
    with pytest.raises(PermissionError):
        write_row(tmp_path / "demo", row(0), fallback=tmp_path / "aside")
    assert not (tmp_path / "aside").exists()


# ---- the same store on a URI -------------------------------------------------------------------


def test_locations_are_paths_or_uris():
    assert location.is_uri("s3://bucket/results") and location.is_uri("file:///tmp/x")
    assert (
        not location.is_uri("C://results")
        and not location.is_uri("/tmp/x")
        and not location.is_uri(Path("x"))
    )
    assert (
        location.join("s3://b/results?region=eu-west-1", "demo", "trials")
        == "s3://b/results/demo/trials?region=eu-west-1"
    )
    assert location.join("results/", "demo") == "results/demo"
    assert [location.basename(w) for w in ("s3://b/results/demo/", "results/demo", "s3://b")] == [
        "demo",
        "demo",
        "b",
    ]
    assert [location.parent(w) for w in ("s3://b/results/demo", "results/demo", "demo")] == [
        "s3://b/results",
        "results",
        ".",
    ]
    assert (
        location.local_path("file:///tmp/x") == "/tmp/x" and location.free_bytes("s3://b/x") is None
    )
    with pytest.raises(ResultsPathError, match=r"^nope://x: not a location pyarrow.fs can open \("):
        location.resolve("nope://x")


def test_a_file_uri_is_a_local_study(tmp_path):
    path = write_row(f"file://{tmp_path}/demo", row(0))
    assert path == f"file://{tmp_path}/demo/trials/t0000.a0.parquet"
    assert (tmp_path / "demo" / "trials" / "t0000.a0.parquet").exists()
    assert trial_ids(read_table(f"file://{tmp_path}/demo")) == ["t0000"]


def test_the_store_on_s3(s3_prefix):
    study = f"{s3_prefix}/results/demo"
    files = a_study(study, 4)
    assert files == [f"{study}/trials/t{i:04d}.a0.parquet" for i in range(4)]
    write_row(study, {**row(1), "attempt": 1, "val_loss": 2.0})
    assert trial_files(study) == sorted([*files, f"{study}/trials/t0001.a1.parquet"])
    assert trial_files(study, "t0001.") == [files[1], f"{study}/trials/t0001.a1.parquet"]
    assert read_table(study).num_rows == 5 and finished_trials(study)["t0001"]["val_loss"] == 2.0
    assert list(read_study(study).columns) == list(COLUMNS)
    info = {"space": "demo", "objectives": [["params", "min"], ["val_ppl", "min"]]}
    assert (
        write_study_info(study, info) == f"{study}/_study.json" and read_study_info(study) == info
    )
    assert read_study_info(f"{s3_prefix}/nothing") == {}
    assert len(pd.read_parquet(study)) == 5  # pandas' one line, on the bucket (_study.json skipped)
    location.write_bytes(files[2], location.read_bytes(files[2])[:300])
    skipped: list = []
    assert read_table(study, skipped).num_rows == 4 and skipped == [files[2]]
    assert quarantine(study) == [f"{study}/_quarantine/t0002.a0.parquet"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert read_table(study).num_rows == 4
    assert len(pd.read_parquet(study)) == 4 and sweep_orphans(study) == 0


def test_the_leaderboard_reads_a_results_root_on_s3(s3_prefix, capsys):
    root = f"{s3_prefix}/results"
    a_study(f"{root}/demo", 4)
    write_study_info(
        f"{root}/demo", {"space": "demo", "objectives": [["params", "min"], ["val_ppl", "min"]]}
    )
    assert load_leaderboard().main([root, "--format", "md"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# Leaderboard: demo")
    shown = {float(v) for v in re.findall(r"\| (\d+\.\d+) \|", out.split("## Budget")[1])}
    assert {round(row(i)["val_ppl"], 2) for i in range(4)} <= shown
    assert "ranked by validation perplexity" in out


# Last in the module on purpose: the probe it abandons keeps retrying for a few seconds, and while it
# does, pyarrow makes no new S3 client (its clients share one lock with the requests in flight).
def test_an_endpoint_that_does_not_answer_is_refused_within_the_timeout(s3_endpoint, monkeypatch):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{closed}")
    said, took = refused(f"{s3_endpoint}/results", timeout_s=1.5)
    assert took < 3
    assert said in (
        f"{s3_endpoint}/results: no answer within 1.5 s (is the endpoint reachable?)",
        f"{s3_endpoint}/results: cannot connect to the endpoint",
    )
