"""shapebench: a declarative architecture-search benchmark for parameter-efficient LMs.

Public API (private modules re-exported here):
  ArchSpec, SpecError, FAMILIES   the architecture spec (spec.py)
  build_model, param_components   the model zoo (models/)
  count_params, count_flops       analytic accounting (counting.py)
"""

from .counting import count_flops, count_params
from .models import build_model, param_components
from .spec import FAMILIES, ArchSpec, SpecError

__all__ = ["ArchSpec", "SpecError", "FAMILIES", "build_model", "param_components",
           "count_params", "count_flops"]
