"""The paper families: each `family` names a preset, the seed paper's own configuration, that
fills the keys a spec leaves out (docs/reference.md "Family presets"). The families are exactly the presets, so a
new family is one entry here (plus its YAML).

ArchSpec's field defaults are the plain Transformer's; a preset lists what its paper sets on top.
"""

from __future__ import annotations

from typing import Any

_MIDDLE_CYCLE = {"begin": 2, "middle": 4, "end": 2}

PRESETS: dict[str, dict[str, Any]] = {
    "transformer": {},
    # Hyperloop §4.1: ~25% / 50% / 25% of the layers, middle looped 3 times.
    "looped": {"layers": _MIDDLE_CYCLE, "loops": 3},
    "hyperloop": {
        # Hyperloop §3: loop-level HC, 4 streams, diagonal sigmoid H_res, loop position embedding,
        # and eq. 3 read literally: F is the middle block as a whole.
        "layers": _MIDDLE_CYCLE,
        "loops": 3,
        "injection": "hyper",
        "hyper": {
            "streams": 4,
            "every": "loop",
            "mixing": "diagonal",
            "loop_embedding": True,
            "read": "block",
        },
    },
    # mHC: no looping, 4 streams at every sublayer, Sinkhorn-projected H_res.
    "mhc": {"hyper": {"streams": 4, "every": "sublayer", "mixing": "sinkhorn"}},
    # HC (Zhu et al.): dynamic (tanh) hyper-connections at every sublayer, expansion rate 4.
    "hc": {"hyper": {"streams": 4, "every": "sublayer", "mixing": "dynamic"}},
    # AbbIE §3.2: head/body/tail, trained at 2 iterations, evaluated at 1/2/4/8.
    "abbie-c": {"layers": _MIDDLE_CYCLE, "loops": 2, "eval_loops": [1, 2, 4, 8]},
    # AbbIE-D eq. 4, h_{k+1} = B(h_k) + h_k "for k = 0, ..., N - 1": the inter-iteration residual
    # acts from the first iteration (§2.1 works it through as h_{k+1} = 2 h_k + Δh_k, and §4 reports
    # AbbIE-D's "distinctive reduction of performance at r = 1", which a model that is the plain
    # Transformer at r = 1 would not show). `loop_residual_from: 1` is the other reading.
    "abbie-d": {
        "layers": _MIDDLE_CYCLE,
        "loops": 2,
        "eval_loops": [1, 2, 4, 8],
        "injection": "residual",
        "loop_residual_from": 0,
    },
    # AbbIE §3.1 "Depth" (Geiping et al.): concatenated input injection, random initial state.
    "depth": {
        "layers": _MIDDLE_CYCLE,
        "loops": 2,
        "eval_loops": [1, 2, 4, 8],
        "injection": "concat",
    },
    # The relaxed recursive baseline: the looped model with a per-loop LoRA on the looped layers.
    "lora-looped": {"layers": _MIDDLE_CYCLE, "loops": 3, "lora_rank": 8},
}
FAMILIES = tuple(PRESETS)
