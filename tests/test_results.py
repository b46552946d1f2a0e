"""The results store: atomic one-file-per-attempt rows, a study that reads as one table,
concurrent writers, orphan sweeping and schema validation."""

import multiprocessing as mp
import os

import pandas as pd
import pytest

from benchmark.store.results import (
    COLUMNS,
    SCHEMA_VERSION,
    ResultsError,
    finished_trials,
    read_study,
    sweep_orphans,
    write_row,
)


def _writer(study_dir, worker, n, start):
    start.wait(120)  # every process imported and waiting: the writes overlap, not the start-ups
    for i in range(n):
        write_row(
            study_dir,
            {
                "study": "conc",
                "trial_id": f"w{worker}-t{i}",
                "status": "ok",
                "val_loss": worker + i / 100,
                "seed": worker,
            },
        )
    # Every row is written (renamed into place). Leave without the interpreter's teardown, where
    # Arrow's background threads can meet its already-destroyed pools and abort the process
    # (SIGABRT, "terminate called without an active exception": apache/arrow#34314; seen once here
    # under a loaded suite). An abort while writing would still show as a non-zero exit code.
    os._exit(0)


def test_eight_processes_writing_at_once(tmp_path):
    study, n = tmp_path / "conc", 4
    ctx = mp.get_context("spawn")
    start = ctx.Barrier(8)
    procs = [ctx.Process(target=_writer, args=(str(study), w, n, start)) for w in range(8)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    df = pd.read_parquet(study)  # the SPEC's one-liner
    assert len(df) == 8 * n and df["trial_id"].nunique() == 8 * n
    assert sorted(df.groupby("seed").size().tolist()) == [n] * 8
    assert not list((study / "trials").glob(".tmp-*"))


def test_row_round_trip_with_schema_and_extra_columns(tmp_path):
    path = write_row(
        tmp_path / "s",
        {
            "study": "s",
            "trial_id": "t/1",
            "status": "ok",
            "val_loss": 2.5,
            "val_ppl_by_loops": {"1": 20.0, "2": 15.5},
            "my_metric": 7,
        },
    )
    assert path == str(tmp_path / "s" / "trials" / "t-1.a0.parquet")
    df = read_study(tmp_path / "s")
    assert list(df.columns) == list(COLUMNS)
    row = df.iloc[0]
    assert row["schema_version"] == SCHEMA_VERSION and row["val_loss"] == 2.5
    assert (
        row["val_ppl_by_loops"] == '{"1": 20.0, "2": 15.5}' and row["extra"] == '{"my_metric": 7}'
    )


def test_version_1_files_read_beside_version_2_with_the_diagnostics_null(tmp_path):
    """Schema 2 added the hyper-connection diagnostics; a study written before still reads, in
    pandas' one line as well as through read_study."""
    import pyarrow.parquet as pq

    from benchmark.store.metrics import DIAGNOSTICS
    from benchmark.store.results import to_table

    old = to_table({"study": "s", "trial_id": "old", "status": "ok", "val_loss": 3.0}).drop_columns(
        list(DIAGNOSTICS)
    )
    old = old.set_column(0, "schema_version", pa_int64([1]))
    (tmp_path / "s" / "trials").mkdir(parents=True)
    pq.write_table(old, tmp_path / "s" / "trials" / "old.a0.parquet")
    write_row(
        tmp_path / "s",
        {"study": "s", "trial_id": "new", "status": "ok", "val_loss": 2.0, "stream_cosine": 0.9},
    )
    df = read_study(tmp_path / "s").set_index("trial_id")
    assert (
        df.loc["old", "schema_version"] == 1
        and df.loc["new", "schema_version"] == SCHEMA_VERSION == 7
    )
    assert pd.isna(df.loc["old", "stream_cosine"]) and df.loc["new", "stream_cosine"] == 0.9
    assert len(pd.read_parquet(tmp_path / "s")) == 2


def test_version_4_files_read_beside_version_5_with_its_new_columns_null(tmp_path):
    """Version 5 added the per-loop losses, the Hyperloop count rule's column, what INT4 costs and
    the quantisation settings; a study holding rows of both versions reads as one table."""
    import pyarrow.parquet as pq

    from benchmark.store.metrics import LOOP_LOSSES
    from benchmark.store.results import to_table

    new = [
        "params_non_embedding_head",
        "int4_ppl_increase",
        "int4_rtn_ppl_increase",
        "quantize",
        *LOOP_LOSSES,
    ]
    old = to_table({"study": "s", "trial_id": "old", "status": "ok", "val_loss": 3.0}).drop_columns(
        new
    )
    old = old.set_column(0, "schema_version", pa_int64([4]))
    (tmp_path / "s" / "trials").mkdir(parents=True)
    pq.write_table(old, tmp_path / "s" / "trials" / "old.a0.parquet")
    write_row(
        tmp_path / "s",
        {
            "study": "s",
            "trial_id": "new",
            "status": "ok",
            "val_loss": 2.0,
            "params_non_embedding_head": 1_000,
            "int4_ppl_increase": 0.022,
            "quantize": {"group_size": 128, "calib_sequences": 1024},
        },
    )
    df = read_study(tmp_path / "s").set_index("trial_id")
    assert df.loc["old", new].isna().all()
    assert (df.loc["new", "params_non_embedding_head"], df.loc["new", "int4_ppl_increase"]) == (
        1_000,
        0.022,
    )
    assert df.loc["new", "quantize"] == '{"calib_sequences": 1024, "group_size": 128}' and pd.isna(
        df.loc["new", "extra"]
    )


def pa_int64(values):
    import pyarrow as pa

    return pa.array(values, pa.int64())


def test_attempts_are_separate_files_and_the_latest_wins(tmp_path):
    s = tmp_path / "s"
    write_row(
        s, {"study": "s", "trial_id": "t1", "status": "failed", "error": "boom", "attempt": 0}
    )
    write_row(s, {"study": "s", "trial_id": "t1", "status": "ok", "val_loss": 1.0, "attempt": 1})
    assert len(read_study(s)) == 2
    latest = finished_trials(s)
    assert list(latest) == ["t1"] and latest["t1"]["status"] == "ok"


def test_invalid_rows_are_refused_and_nothing_is_written(tmp_path):
    with pytest.raises(
        ResultsError, match="status 'done' is not one of ok, failed, pruned, diverged"
    ):
        write_row(tmp_path / "s", {"study": "s", "trial_id": "t", "status": "done"})
    with pytest.raises(ResultsError, match="a result row needs trial_id"):
        write_row(tmp_path / "s", {"study": "s", "status": "ok"})
    assert not (tmp_path / "s").exists()


def test_orphan_temporary_files_are_invisible_and_swept(tmp_path):
    s = tmp_path / "s"
    write_row(s, {"study": "s", "trial_id": "t1", "status": "ok"})
    orphan = s / "trials" / ".tmp-dead.parquet"
    orphan.write_bytes(b"half a file")
    assert len(pd.read_parquet(s)) == 1  # readers never see it
    old = os.stat(orphan).st_mtime - 3600
    os.utime(orphan, (old, old))
    assert sweep_orphans(s, older_than_s=60) == 1 and not orphan.exists()


def test_empty_study_reads_as_an_empty_table(tmp_path):
    df = read_study(tmp_path / "nothing")
    assert df.empty and "val_loss" in df.columns
