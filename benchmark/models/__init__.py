"""The model zoo: one composable language model (lm.py) built from Llama-style layers
(layers.py) and hyper-connections (hyper.py)."""

from benchmark.models.lm import (
    LanguageModel,
    build_model,
    param_components,
    weight_decays,
)

__all__ = ["LanguageModel", "build_model", "param_components", "weight_decays"]
