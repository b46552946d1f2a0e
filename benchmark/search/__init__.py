"""Searches: the driver (Ray Tune + Optuna), the trainable each worker runs, the Optuna study and
its sampler, the rows a search writes, the live view. Names load on first use, so that reading
`SAMPLERS` (the command line does) imports neither Ray nor torch."""

import importlib

_EXPORTS = {
    "SearchOptions": "driver",
    "SearchSummary": "driver",
    "run_search": "driver",
    "check_declared": "driver",
    "SearchHalted": "halt",
    "ray_processes": "ray_session",
    "temp_dir": "ray_session",
    "OPTUNA_DB": "study",
    "SAMPLERS": "study",
    "StudyError": "study",
    "storage_url": "study",
    "STORAGE_WAIT_S": "storage",
}
__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"benchmark.search.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'benchmark.search' has no attribute {name!r}")
