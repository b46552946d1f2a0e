"""Training and quantisation settings: torch-free dataclasses whose fields carry their own rules
(`setting`, arch/fields.py), so the search space validates its `training:` and `quantize:`
sections with the very classes a trial runs with (one validator path).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, fields
from typing import Any, Mapping

from benchmark.arch import COUNTS, did_you_mean, keys, setting
from benchmark.recipe.amounts import parse_amount, parse_tokens

SCHEDULES = ("cosine", "wsd")
PRECISIONS = ("auto", "bf16", "fp32")
# Which parameter count `Nx` multiplies: a count rule of the model's own, or `budget`: the declared
# budget, the same for every candidate of a size class (Hyperloop §4.1 trains every model of a
# size class on the same tokens, 50x the non-looped baseline's parameters).
TOKENS_PER = (*COUNTS, "budget")


def settings_json(settings: Any) -> str:
    """Settings (a TrainConfig or QuantizeConfig) as a row stores them in its `training` and
    `quantize` columns: every field, keys sorted. One text, so that a saved run's name
    (trial/runstate.py) and a reused run's key (search/reuse.py) compare what the row holds."""
    return json.dumps(asdict(settings), sort_keys=True)


class TrainConfigError(ValueError):
    """A training setting that breaks its rule: `key` names it (unknown keys too), `reason` says why."""

    section = "training"

    def __init__(self, key: str, reason: str):
        self.key, self.reason = key, reason
        super().__init__(f"{self.section}.{key}: {reason}")


class QuantizeConfigError(TrainConfigError):
    """A quantisation setting that breaks its rule (the space's `quantize:` section)."""

    section = "quantize"


def _checked(
    known: Mapping[str, Any], raw: Mapping[str, Any], error: type[TrainConfigError]
) -> dict[str, Any]:
    """Each setting of `raw` by its field's rule; `error` for the first unknown key or broken rule,
    in the order of `raw`."""
    out = {}
    for name, value in raw.items():
        if name not in known:
            raise error(name, f"unknown key{did_you_mean(name, known)}")
        try:
            out[name] = known[name].check(value)
        except ValueError as e:
            raise error(name, str(e)) from None
    return out


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    tokens: str | int = setting(
        "20x", parse=parse_tokens
    )  # absolute ("5M", 5_000_000) or per parameter ("20x")
    tokens_per: str = setting("total", choices=TOKENS_PER)  # which parameter count "Nx" multiplies
    seq_len: int = setting(256, at_least=1)
    batch_size: int = setting(16, at_least=1)  # sequences per micro-batch
    grad_accum: int = setting(1, at_least=1)  # micro-batches per optimiser step (a batch of
    # 256 x 2048 tokens, Hyperloop App. A, on one GPU)
    lr: float = setting(6e-4, above=0)  # peak learning rate
    min_lr: float | None = setting(
        None, at_least=0
    )  # end of the decay; default lr / 10 (Hyperloop App. A: 4e-4 -> 4e-5)
    schedule: str = setting("cosine", choices=SCHEDULES)  # wsd: warmup-stable-decay (AbbIE §3.2)
    warmup: float = setting(
        0.05, at_least=0
    )  # fraction of the steps (< 1) or a number of steps (>= 1)
    decay: float = setting(
        0.2, at_least=0, at_most=1
    )  # wsd: fraction of the steps in the final decay (AbbIE §3.2)
    weight_decay: float = setting(0.1, at_least=0)
    beta1: float = setting(0.9, at_least=0, at_most=1)
    beta2: float = setting(0.95, at_least=0, at_most=1)
    grad_clip: float = setting(1.0, at_least=0)  # max gradient norm; 0 turns clipping off
    eval_every: int = setting(0, at_least=0)  # steps between evaluations; 0: val_points of them
    val_points: int = setting(
        3, at_least=0
    )  # evaluations spread over the run (eval_every 0), besides the last
    eval_tokens: int | str = setting(65_536, parse=parse_amount)  # held-out tokens per source
    precision: str = setting("auto", choices=PRECISIONS)
    compile: bool = True
    seed: int = setting(0, at_least=0)
    device: str = "auto"  # auto, cpu, cuda, cuda:1, ...

    def __post_init__(self):
        checked = self.checked(vars(self))
        object.__setattr__(self, "eval_tokens", checked["eval_tokens"])  # "1K" -> 1000 tokens

    @classmethod
    def checked(cls, raw: Mapping[str, Any]) -> dict[str, Any]:
        """Each setting of `raw` by its field's rule (`tokens` as Tokens, `eval_tokens` as a count);
        TrainConfigError for the first unknown key or broken rule, in the order of `raw`."""
        return _checked(_KEYS, raw, TrainConfigError)

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> "TrainConfig":
        cls.checked(raw)  # unknown keys are named before the constructor sees them
        return cls(**raw)

    def total_tokens(self, params: Mapping[str, int]) -> int:
        """`params`: the counts by rule, and `budget` where tokens_per is `budget`."""
        if self.tokens_per not in params:
            raise TrainConfigError(
                "tokens_per", f"{self.tokens_per}: no such count given ({', '.join(params)})"
            )
        return parse_tokens(self.tokens).resolve(params[self.tokens_per])

    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * self.seq_len * self.grad_accum

    def steps(self, params: Mapping[str, int]) -> int:
        return max(1, math.ceil(self.total_tokens(params) / self.tokens_per_step))

    def warmup_steps(self, total: int) -> int:
        """`warmup` in steps of a `total`-step run: a fraction of it (< 1) or a count (>= 1)."""
        return int(self.warmup if self.warmup >= 1 else round(self.warmup * total))

    def evaluates(self, done: int, total: int) -> bool:
        """Whether the held-out set is scored after `done` of `total` steps, before the end: every
        `eval_every` steps (ASHA's rungs), else at `val_points` evenly spaced steps (the curve's
        validation points; the final evaluation is the row's own)."""
        if done >= total:
            return False
        if self.eval_every:
            return done % self.eval_every == 0
        return any(
            done == round(total * k / (self.val_points + 1)) for k in range(1, self.val_points + 1)
        )

    def decay_steps(self, total: int) -> int:
        """`wsd`: the steps of the final decay."""
        return max(1, int(round(self.decay * total)))

    def lr_at(self, step: int, total: int) -> float:
        """Linear warmup, then cosine to min_lr, or stable then cosine decay (WSD)."""
        warm = self.warmup_steps(total)
        if step < warm:
            return self.lr * (step + 1) / warm
        floor = self.lr / 10 if self.min_lr is None else self.min_lr
        if self.schedule == "cosine":
            start, length = warm, max(1, total - warm)
        else:
            length = self.decay_steps(total)
            start = total - length
            if step < start:
                return self.lr
        progress = min(1.0, (step - start) / length)
        return floor + 0.5 * (self.lr - floor) * (1 + math.cos(math.pi * progress))


_KEYS = keys(TrainConfig)
DEFAULTS = {f.name: f.default for f in fields(TrainConfig)}


@dataclass(frozen=True, kw_only=True)
class QuantizeConfig:
    """How a trial quantises its trained model (trial/run.py, trial/quant.py): GPTQ and RTN per row
    and group of `group_size` input columns, GPTQ's Hessians from `calib_sequences` windows of
    `seq_len` tokens of the training split. A layer narrower than the group has one group per row.
    The defaults: group 128, as GPTQ (Frantar et al. §5) and the Hyperloop paper at every size (§4);
    128 calibration sequences, as GPTQ's reference (§5: "128 random 2048 token segments"). The
    Hyperloop paper calibrates on 1024 sequences of its training corpus (§4), which its spaces set."""

    group_size: int = setting(128, at_least=1)
    calib_sequences: int = setting(128, at_least=1)

    def __post_init__(self):
        _checked(_QUANTIZE_KEYS, vars(self), QuantizeConfigError)

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> "QuantizeConfig":
        return cls(**_checked(_QUANTIZE_KEYS, raw, QuantizeConfigError))  # 64.0 -> 64


_QUANTIZE_KEYS = keys(QuantizeConfig)
QUANTIZE_DEFAULTS = {f.name: f.default for f in fields(QuantizeConfig)}


class DataSettingsError(TrainConfigError):
    """A data setting that breaks its rule (the space's `data:` section)."""

    section = "data"


SAMPLINGS = ("permutation", "replacement")
# Passes over any part of the corpus a run may make before a plan or search refuses it. 4: up to
# about four epochs of repeated data train nearly as well as unique data (Muennighoff et al. 2023,
# "Scaling Data-Constrained Language Models", §5), and every committed study is within it (the most:
# ref2-ladder's 10M-token runs, 2.3 passes over the embedded bible at BPE-1024:
# results/reference-2/README.md). The papers train one pass (Hyperloop: 12.5B tokens of FineWeb-Edu).
MAX_EPOCHS = 4.0


@dataclass(frozen=True, kw_only=True)
class DataSettings:
    """The space's `data:` section: how much of the source a run reads and how it draws from it.
    `max_docs`: the documents read from each part (null: the whole split). `max_epochs`: the most
    passes a run may make over any part (plan and search refuse more). `sampling`: `permutation`
    draws each part's windows without replacement within a pass (a per-seed permutation, so one
    pass sees each token once), `replacement` at random starts with replacement (the sampling of
    studies begun before, which finish under it: data/sampling.py)."""

    max_docs: int | None = setting(None, at_least=1)
    max_epochs: float = setting(MAX_EPOCHS, above=0)
    sampling: str = setting("permutation", choices=SAMPLINGS)

    def __post_init__(self):
        _checked(_DATA_KEYS, vars(self), DataSettingsError)

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> "DataSettings":
        return cls(**_checked(_DATA_KEYS, raw, DataSettingsError))


_DATA_KEYS = keys(DataSettings)
DATA_DEFAULTS = {f.name: f.default for f in fields(DataSettings)}
