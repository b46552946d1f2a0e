"""The metric registry: every number a trial reports, written once.

A metric has the name a person writes (in a space's `objectives:`, in `shapebench board --x`, in the
Optuna study's metric names), the results-store column it is read from, its natural direction,
a label and a unit for tables and axes, and short aliases. The search space validates objectives
against it, the trainable reports every searchable metric from its row, Optuna names the study's
values with it, ASHA cuts on it, and the leaderboard labels and aggregates with it: a metric is
added here and nowhere else.

`params` is the one metric whose column depends on the study: the parameters the budget counts
(`count: total` -> params_total, `count: non_embedding` -> params_non_embedding, `count:
non_embedding_head` -> params_non_embedding_head). Every row has a column for each count rule.

Kinds: `quality` (what a model is for: loss, perplexity), `cost` (what it takes: parameters,
FLOPs, bytes, time), `diagnostic` (whether a mechanism acts; not searchable: null for models
without the mechanism), `bookkeeping` (budget, tokens: aggregated for tables, not searchable).
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from typing import Mapping

# The count rules a budget may count and every row has a column for (`params_<rule>`); each is
# computed in arch/counting.py, which says whose count it is (paper and section).
COUNTS = ("total", "non_embedding", "non_embedding_head")

KINDS = ("quality", "cost", "diagnostic", "bookkeeping", "time")
DIRECTIONS = ("min", "max")


class MetricError(ValueError):
    pass


@dataclass(frozen=True, kw_only=True)
class Metric:
    name: str
    column: str  # results column; "{count}" is filled with the study's count rule
    direction: str = "min"  # the natural direction: what "better" means when none is given
    label: str
    unit: str = ""
    aliases: tuple[str, ...] = ()
    kind: str = "cost"
    intermediate: bool = False  # reported at every evaluation during training (ASHA can cut on it)

    def __post_init__(self):
        if self.direction not in DIRECTIONS or self.kind not in KINDS:
            raise MetricError(
                f"metric {self.name}: direction {self.direction!r}, kind {self.kind!r}"
            )

    @property
    def searchable(self) -> bool:
        return self.kind in ("quality", "cost")

    def column_for(self, count: str = "total") -> str:
        return self.column.format(count=count)

    def axis_label(self) -> str:
        """'validation perplexity' or 'parameters (count)': a figure axis or a table header."""
        return f"{self.label} ({self.unit})" if self.unit else self.label


def _m(name, column=None, **kw) -> Metric:
    return Metric(name=name, column=column or name, **kw)


# The test-time iterations AbbIE evaluates its models at (§4.3, Fig. 6, Table 2): each gives a metric,
# the validation loss at r iterations of the looped block, for models with `eval_loops` (null
# otherwise). Another loop count a spec evaluates has no metric: it stays in the row's
# val_ppl_by_loops, which keeps every count evaluated.
LOOP_COUNTS = (1, 2, 4, 8)


def loop_loss(r: int) -> str:
    return f"val_loss_r{r}"


METRICS: tuple[Metric, ...] = (
    # quality
    _m(
        "val_loss",
        label="validation loss",
        unit="nats/token",
        aliases=("loss",),
        kind="quality",
        intermediate=True,
    ),
    _m(
        "val_ppl",
        label="validation perplexity",
        aliases=("ppl",),
        kind="quality",
        intermediate=True,
    ),
    _m("val_ppl_int8", label="INT8 perplexity (GPTQ)", aliases=("ppl_int8",), kind="quality"),
    _m("val_ppl_int4", label="INT4 perplexity (GPTQ)", aliases=("ppl_int4",), kind="quality"),
    _m("val_ppl_int4_rtn", label="INT4 perplexity (round-to-nearest)", kind="quality"),
    # what INT4 costs: the perplexity it adds over full precision, relative (val_ppl_int4 / val_ppl - 1;
    # Hyperloop §4, Table 1: Looped 14.85 -> 15.18 is +0.022), written by the trial (trial/run.py)
    _m(
        "int4_ppl_increase",
        label="INT4 perplexity increase (GPTQ)",
        unit="fraction",
        aliases=("int4_cost",),
        kind="quality",
    ),
    _m(
        "int4_rtn_ppl_increase",
        label="INT4 perplexity increase (round-to-nearest)",
        unit="fraction",
        aliases=("int4_rtn_cost",),
        kind="quality",
    ),
    *(
        _m(loop_loss(r), label=f"validation loss at r = {r}", unit="nats/token", kind="quality")
        for r in LOOP_COUNTS
    ),
    # cost
    _m("params", "params_{count}", label="parameters counted by the budget"),
    _m("params_total", label="parameters"),
    _m("params_non_embedding", label="non-embedding parameters", aliases=("non_embedding",)),
    _m(
        "params_non_embedding_head",
        label="non-embedding + LM head parameters",
        aliases=("non_embedding_head",),
    ),
    _m("params_attention", label="attention parameters"),
    _m("params_ffn", label="FFN parameters"),
    _m(
        "flops_per_token_train",
        label="training FLOPs per token",
        unit="FLOPs/token",
        aliases=("flops",),
    ),
    _m(
        "flops_per_token_infer",
        label="inference FLOPs per token",
        unit="FLOPs/token",
        aliases=("flops_infer",),
    ),
    _m("int4_bytes", label="INT4 model size", unit="bytes", aliases=("size", "int4")),
    _m("int8_bytes", label="INT8 model size", unit="bytes", aliases=("int8",)),
    _m(
        "tokens_per_s",
        direction="max",
        label="training throughput",
        unit="tokens/s",
        aliases=("throughput",),
    ),
    _m("peak_mem_bytes", label="peak memory", unit="bytes", aliases=("memory",)),
    _m("wall_s", label="trial wall time", unit="s", aliases=("wall",)),
    # where a trial's wall time went (trial/run.py); what is not train_s is its overhead
    _m("compile_s", label="compile time", unit="s", kind="time"),
    _m("train_s", label="training-step time", unit="s", kind="time"),
    _m("eval_s", label="evaluation time", unit="s", kind="time"),
    _m("quantize_s", label="quantisation time", unit="s", kind="time"),
    # whether a hyper-connected model's mechanism acts (trial/analysis.py)
    _m("stream_cosine", label="stream cosine", kind="diagnostic"),
    _m("hres_deviation", label="|H_res − I|", kind="diagnostic"),
    _m("loop_emb_norm", label="loop-embedding norm", kind="diagnostic"),
    _m("gate_saturation", label="saturated gates", unit="fraction", kind="diagnostic"),
    # bookkeeping
    _m("tokens_trained", label="training tokens", unit="tokens", kind="bookkeeping"),
    _m("budget", label="parameter budget", kind="bookkeeping"),
    _m("budget_distance", label="distance from budget", unit="fraction", kind="bookkeeping"),
)
BY_NAME = {m.name: m for m in METRICS}
_LOOKUP = {
    **{a: m for m in METRICS for a in m.aliases},
    **{m.column: m for m in METRICS if "{" not in m.column},
    **BY_NAME,
}
DIAGNOSTICS = tuple(m.name for m in METRICS if m.kind == "diagnostic")
LOOP_LOSSES = tuple(map(loop_loss, LOOP_COUNTS))
TIME_SPLIT = tuple(m.name for m in METRICS if m.kind == "time")
SEARCHABLE = tuple(m.name for m in METRICS if m.searchable)
PARAM_COLUMNS = tuple(f"params_{rule}" for rule in COUNTS)  # a candidate's counts, in every row


def count_columns(counts: Mapping[str, int]) -> dict[str, int]:
    """count_params' rules as the row's columns: {params_total: ..., params_non_embedding: ..., ...}."""
    return {f"params_{rule}": counts[rule] for rule in COUNTS}


def metric(name: str) -> Metric:
    """The metric a name, alias or column denotes; MetricError naming the choices otherwise."""
    found = _LOOKUP.get(str(name).strip())
    if found is None and re.fullmatch(r"val_loss_r\d+", str(name).strip()):
        raise MetricError(
            f"unknown metric {name!r}: the per-loop losses are {', '.join(LOOP_LOSSES)} (AbbIE's "
            "test-time iterations); every other loop count evaluated is in the row's val_ppl_by_loops"
        )
    if found is None:
        names = [*SEARCHABLE, *(a for m in METRICS if m.searchable for a in m.aliases)]
        close = difflib.get_close_matches(str(name).strip(), names, n=1, cutoff=0.6)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        raise MetricError(
            f"unknown metric {name!r}{hint}; choose one of {', '.join(SEARCHABLE)} "
            f"(aliases: {', '.join(a for m in METRICS if m.searchable for a in m.aliases)})"
        )
    return found


def objective(text: str) -> tuple[Metric, str]:
    """`val_loss`, `val_loss:min`, `throughput:max` -> (searchable metric, direction)."""
    name, _, direction = str(text).strip().partition(":")
    m = metric(name)
    if not m.searchable:
        raise MetricError(
            f"{m.name} is a {m.kind} column, not an objective; choose one of {', '.join(SEARCHABLE)}"
        )
    if direction and direction not in DIRECTIONS:
        raise MetricError(
            f"objective {text!r}: direction must be 'min' or 'max', not {direction!r}"
        )
    return m, direction or m.direction


def row_value(row, name: str, count: str = "total") -> float:
    """A metric's value in a results row (a mapping); NaN when the row has none."""
    m = BY_NAME[name]
    value = row.get(m.column_for(count))
    try:
        return float(value) if value is not None else float("nan")
    except (TypeError, ValueError):
        return float("nan")
