"""shapebench: a declarative architecture-search benchmark for parameter-efficient LMs.

Public API (private modules re-exported here, loaded on first use so that light tools such as
`shapebench plan` and the results store do not pay for importing torch):
  ArchSpec, SpecError, FAMILIES   the architecture spec (arch/spec.py)
  build_model, param_components   the model zoo (models/)
  count_params, count_flops       analytic accounting (arch/counting.py)
"""

from benchmark.lazy import lazy_face

_EXPORTS = {
    "ArchSpec": "arch.spec",
    "SpecError": "arch.spec",
    "FAMILIES": "arch.spec",
    "count_params": "arch.counting",
    "count_flops": "arch.counting",
    "build_model": "models",
    "param_components": "models",
}
__all__ = list(_EXPORTS)

__getattr__, __dir__ = lazy_face(__name__, _EXPORTS)
