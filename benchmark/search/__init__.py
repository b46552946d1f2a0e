"""Searches: the driver (Ray Tune + Optuna), the trainable each worker runs, the Optuna study and
its sampler, the rows a search writes, the live view. Names load on first use, so that reading
`SAMPLERS` (the command line does) imports neither Ray nor torch."""

from benchmark.lazy import lazy_face

_EXPORTS = {
    "SearchOptions": "driver",
    "SearchSummary": "driver",
    "run_search": "driver",
    "check_declared": "driver",
    "SearchHalted": "halt",
    "ray_processes": "ray_session",
    "temp_dir": "ray_session",
    "OPTUNA_DB": "optuna_study",
    "SAMPLERS": "optuna_study",
    "StudyError": "optuna_study",
    "storage_url": "optuna_study",
    "STORAGE_WAIT_S": "storage",
}
__all__ = list(_EXPORTS)

__getattr__, __dir__ = lazy_face(__name__, _EXPORTS)
