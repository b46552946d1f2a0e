"""Compilation: torch.compile by region, so that a model's repeated layers, loops and gates share
one compiled graph per class, and the cache settings that let compiled code be reused.
"""

from __future__ import annotations

from typing import Callable

import torch

COMPILE_SCOPES = ("regions", "model")


def compile_regions(model) -> Callable[[], None]:
    """Regional compilation: each of the model's repeated units (`LanguageModel.regions`: its
    layers or sublayers, its gates) gets its own compiled method, with one graph per class that
    every layer and loop reuses. Returns the function that makes the model eager again, which
    the step calls when training ends: a deep copy (quantisation) must not carry methods bound
    to the original model.

    Against the whole loss compiled as one graph, regions compile in about half the time cold and
    a third warm, at the same steady speed; most of the gain over eager is the head's fused
    softmax (benchmarks/2026-11-24-perf-cpu-epyc.md, "First step")."""
    compiled = []
    for module, name in model.regions():
        setattr(module, name, torch.compile(getattr(module, name), dynamic=False))
        compiled.append((module, name))

    def restore():
        for module, name in compiled:
            module.__dict__.pop(name, None)

    return restore


def cached_functions():
    """Lets torch's AOTAutograd cache keep graphs with a custom autograd Function in them (the
    gates' write, StreamWrite in models/hyper.py), which it passes by unless told: a warm trial of
    a hyper-connected family then re-traced that region each time. Its key covers the Function's
    traced forward and backward, so a changed backward misses the cache rather than reusing stale
    code. Scoped to the step, so code compiled elsewhere in the process keeps torch's default."""
    return torch._functorch.config.patch(autograd_cache_allow_custom_autograd_functions=True)
