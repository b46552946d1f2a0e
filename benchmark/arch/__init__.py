"""The architecture spec: one mapping -> a validated `ArchSpec`, and its exact parameter and FLOP
counts, with no model built. Other packages import from here; the modules behind it, lowest first:

    fields     config fields that carry their own rule (`setting`), dotted keys, "did you mean"
    presets    the paper families, each a preset of the seed paper's configuration
    spec       ArchSpec and its parts (FFN, layers, hyper-connections), validated
    counting   exact parameter counts by rule (COUNTS) and FLOPs per token
    describe   a spec as the columns papers tabulate (`describe.COLUMNS`, `describe.describe`)
"""

from benchmark.arch.counting import COUNTS, count_flops, count_params, with_counts
from benchmark.arch.describe import variant
from benchmark.arch.fields import Key, deep_merge, did_you_mean, keys, one_of, set_dotted, setting
from benchmark.arch.presets import PRESETS
from benchmark.arch.spec import (
    FAMILIES,
    FFN_WIDTHS,
    SPEC_KEYS,
    STREAM_DTYPES,
    ArchSpec,
    FFNSpec,
    HyperSpec,
    LayerSplit,
    SpecError,
    format_structure,
    hyper_spans,
    is_looped,
)

__all__ = [
    "COUNTS",
    "FAMILIES",
    "FFN_WIDTHS",
    "PRESETS",
    "SPEC_KEYS",
    "STREAM_DTYPES",
    "ArchSpec",
    "FFNSpec",
    "HyperSpec",
    "Key",
    "LayerSplit",
    "SpecError",
    "count_flops",
    "count_params",
    "deep_merge",
    "did_you_mean",
    "format_structure",
    "hyper_spans",
    "is_looped",
    "keys",
    "one_of",
    "set_dotted",
    "setting",
    "variant",
    "with_counts",
]
