"""The leaderboard's objectives, in the metric registry's names (benchmark.store.metrics): given on
the command line, or taken from what the studies declared (`<study>/_study.json`), else the default.

The board ranks by the last objective and plots the first on x and the last on y, so objectives
taken from a study are ordered cost first and quality last, whatever order the space wrote them in.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from benchmark.store import Metric, MetricError, metrics


@dataclass(frozen=True, kw_only=True)
class Objective:
    column: str  # a results column, and the name of its registry metric
    maximize: bool = False

    def __post_init__(self):
        # Only registry metrics are objectives; `Objective(column="ppl")` would read no column.
        if metrics.metric(self.column).column != self.column:
            raise MetricError(
                f"{self.column!r} is not a results column; "
                f"did you mean {metrics.metric(self.column).column}?"
            )

    @classmethod
    def parse(cls, text: str, count: str = "total") -> Objective:
        """`params`, `val_ppl:min`, `throughput:max`: a registry name, alias or column, then a
        direction (the metric's natural one when none is given). `params` is the parameters the
        study's budget counts: params_total, or params_non_embedding when `count` says so."""
        metric, direction = metrics.objective(text)
        return cls(column=metric.column_for(count), maximize=direction == "max")

    @property
    def metric(self) -> Metric:
        return metrics.metric(self.column)

    @property
    def direction(self) -> str:
        return "max" if self.maximize else "min"

    def describe(self) -> str:
        """'validation perplexity (val_ppl:min)': the registry's label, then the name and direction."""
        return f"{self.metric.label} ({self})"

    def __str__(self) -> str:
        return f"{self.column}:{self.direction}"


def objectives(*texts: str, count: str = "total") -> tuple[Objective, ...]:
    return tuple(Objective.parse(t, count) for t in texts)


DEFAULT = objectives("params_total", "val_ppl")
KIND_ORDER = {"cost": 0, "quality": 1}  # the board's order: costs on x, the ranking quality last


def secondary(primary: tuple[Objective, ...]) -> tuple[tuple[Objective, ...], ...]:
    """The other frontiers every board reports when their columns exist, against the primary's
    quality metric (the one it ranks by) where it has one."""
    last = primary[-1]
    quality = last if last.metric.kind == "quality" else DEFAULT[-1]
    return (
        (DEFAULT[0], quality),
        (Objective.parse("flops"), quality),
        objectives("int4", "ppl_int4"),
    )


def counted(declarations: Mapping[str, dict]) -> tuple[str, list[str]]:
    """Which parameters `params` means: the count the studies declare (total, non_embedding),
    or total, with a note, when they declare different ones."""
    counts = {study: info["count"] for study, info in declarations.items() if info.get("count")}
    if len(set(counts.values())) > 1:
        each = ", ".join(f"{study} {count}" for study, count in counts.items())
        return "total", [
            f"the studies count parameters differently ({each}): params is params_total here"
        ]
    return next(iter(counts.values()), "total"), []


def declared(declarations: Mapping[str, dict]) -> tuple[tuple[Objective, ...] | None, list[str]]:
    """The objectives the studies declared, ordered for the board, and notes. None (the caller
    takes DEFAULT) when no study declares any, or the studies compared declare different ones."""
    found, notes = {}, []
    for study, info in declarations.items():
        if not info.get("objectives"):
            continue
        try:
            found[study] = _ordered(info)
        except (TypeError, ValueError) as err:  # MetricError is a ValueError
            notes.append(f"{study} declares objectives the leaderboard cannot use ({err})")
    default = " vs ".join(map(str, DEFAULT))
    if not found:
        if not notes:
            notes.append(
                f"objectives {default}, the default: no study declares its objectives "
                "(results written before _study.json)"
            )
        return None, notes
    if len(set(found.values())) > 1:
        each = "; ".join(f"{study}: {' vs '.join(map(str, objs))}" for study, objs in found.items())
        return None, [
            *notes,
            f"objectives {default}, the default: the studies declare different ones ({each})",
        ]
    if undeclared := [s for s in declarations if s not in found]:
        notes.append(
            f"{', '.join(undeclared)} declare(s) no objectives: ranked by those {', '.join(found)} declare(s)"
        )
    return next(iter(found.values())), notes


def _ordered(info: dict) -> tuple[Objective, ...]:
    """A study's declaration -> its objectives, cost first and quality last (a stable sort, so
    two costs keep the order the space gave them). A single objective is paired with params."""
    count = info.get("count") or "total"
    objs = [Objective.parse(_text(entry), count) for entry in info["objectives"]]
    if len(objs) == 1:
        objs.insert(0, Objective.parse("params", count))
    if len({o.column for o in objs}) != len(objs) or len(objs) > 3:
        raise ValueError(
            f"{len(objs)} objectives ({', '.join(map(str, objs))}); "
            "the board shows 2 or 3 distinct ones"
        )
    return tuple(sorted(objs, key=lambda o: KIND_ORDER[o.metric.kind]))


def _text(entry) -> str:
    """`["val_loss", "min"]` (as the space declares it) or `"val_loss:min"` -> `val_loss:min`."""
    if isinstance(entry, str):
        return entry
    name, direction = entry
    return f"{name}:{direction}"
