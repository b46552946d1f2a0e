"""The recipe: how much and how a candidate trains, as torch-free data. It sits below the space
language (which validates its `training:` and `quantize:` sections with these very classes) and
above the architecture spec (whose count rules a `20x` token amount multiplies). Other packages
import from here; the modules behind it, lowest first:

    amounts    parameter and token amounts (`113M`, `20x`), tolerances, and their short forms
    settings   TrainConfig and QuantizeConfig: the training and quantisation settings, their rules
"""

from benchmark.recipe.amounts import (
    Tokens,
    fmt_count,
    fmt_fraction,
    parse_amount,
    parse_tokens,
    parse_tolerance,
)
from benchmark.recipe.settings import (
    DEFAULTS,
    PRECISIONS,
    QUANTIZE_DEFAULTS,
    SCHEDULES,
    QuantizeConfig,
    QuantizeConfigError,
    TrainConfig,
    TrainConfigError,
)

__all__ = [
    "DEFAULTS",
    "PRECISIONS",
    "QUANTIZE_DEFAULTS",
    "SCHEDULES",
    "QuantizeConfig",
    "QuantizeConfigError",
    "Tokens",
    "TrainConfig",
    "TrainConfigError",
    "fmt_count",
    "fmt_fraction",
    "parse_amount",
    "parse_tokens",
    "parse_tolerance",
]
