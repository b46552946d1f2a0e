"""The results store: what a trial reports and where it is kept. Other packages import from here
(the path helpers as `location.join` and the like, the speeds file as `speeds`); the modules
behind it, lowest first:

    errors      what can go wrong with results, in one place
    atomic      the one atomic writer: a file or folder appears only once it is whole
    location    where results live: a folder or a URI (s3://, gs://), and the free space there
    metrics     the metric registry: every number a trial reports, its column and direction
    results     the Parquet rows: the schema, writing one row, reading a study back
    curves      training curves beside the rows
    declaration what a study declared (`_study.json`)
    speeds      speeds measured on this machine, for time estimates
    provenance  what produced a result: code and package versions, hardware

The names load on first use (PEP 562), so that importing one module costs only that module: the
spec's counts read metrics.py without loading pyarrow and pandas.
"""

from benchmark.lazy import lazy_face

_EXPORTS = {
    "atomic_dir": "atomic",
    "atomic_open": "atomic",
    "read_curves": "curves",
    "write_curve": "curves",
    "ResultsError": "errors",
    "ResultsPathError": "errors",
    "ResultsWarning": "errors",
    "StoreFull": "errors",
    "RESULTS_ROOT": "location",
    "check_results": "location",
    "disk_full": "location",
    "is_uri": "location",
    "COUNTS": "metrics",
    "DIAGNOSTICS": "metrics",
    "LOOP_COUNTS": "metrics",
    "LOOP_LOSSES": "metrics",
    "METRICS": "metrics",
    "PARAM_COLUMNS": "metrics",
    "SEARCHABLE": "metrics",
    "TIME_SPLIT": "metrics",
    "Metric": "metrics",
    "MetricError": "metrics",
    "count_columns": "metrics",
    "loop_loss": "metrics",
    "metric": "metrics",
    "objective": "metrics",
    "code_version": "provenance",
    "hardware": "provenance",
    "gpus": "provenance",
    "machine": "provenance",
    "package_versions": "provenance",
    "PHASES": "results",
    "SCHEMA": "results",
    "SCHEMA_VERSION": "results",
    "check_study_name": "results",
    "finished_trials": "results",
    "quarantine": "results",
    "read_files": "results",
    "read_study": "results",
    "recover": "results",
    "sweep_orphans": "results",
    "trial_files": "results",
    "write_row": "results",
    "STUDY_FILE": "declaration",
    "read_study_info": "declaration",
    "write_study_info": "declaration",
}
__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_face(__name__, _EXPORTS)
