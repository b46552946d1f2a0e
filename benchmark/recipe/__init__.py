"""The recipe: how much and how a candidate trains, as torch-free data. It sits below the space
language (which validates its `training:` and `quantize:` sections with these very classes) and
above the architecture spec (whose count rules a `20x` token amount multiplies). Other packages
import from here; the modules behind it, lowest first:

    amounts    parameter and token amounts (`113M`, `20x`), tolerances, and their short forms
    settings   TrainConfig, QuantizeConfig and DataSettings: the training, quantisation and data
               settings, their rules, and the JSON a row stores them as (settings_json)
    memory     a training step's estimated peak memory, and the micro-batch that fits a GPU
"""

from benchmark.recipe.amounts import (
    Tokens,
    fmt_count,
    fmt_fraction,
    parse_amount,
    parse_duration,
    parse_tokens,
    parse_tolerance,
)
from benchmark.recipe.memory import (
    USABLE,
    MemoryEstimate,
    estimate_memory,
    fit_micro_batch,
    fmt_size,
    parse_size,
)
from benchmark.recipe.settings import (
    DATA_DEFAULTS,
    DEFAULTS,
    MAX_EPOCHS,
    PRECISIONS,
    QUANTIZE_DEFAULTS,
    SAMPLINGS,
    SCHEDULES,
    DataSettings,
    DataSettingsError,
    QuantizeConfig,
    QuantizeConfigError,
    TrainConfig,
    TrainConfigError,
    settings_json,
)

__all__ = [
    "DATA_DEFAULTS",
    "DEFAULTS",
    "MAX_EPOCHS",
    "SAMPLINGS",
    "DataSettings",
    "DataSettingsError",
    "MemoryEstimate",
    "PRECISIONS",
    "QUANTIZE_DEFAULTS",
    "SCHEDULES",
    "QuantizeConfig",
    "QuantizeConfigError",
    "Tokens",
    "TrainConfig",
    "TrainConfigError",
    "USABLE",
    "estimate_memory",
    "fit_micro_batch",
    "fmt_count",
    "fmt_fraction",
    "fmt_size",
    "parse_amount",
    "parse_duration",
    "parse_size",
    "parse_tokens",
    "parse_tolerance",
    "settings_json",
]
