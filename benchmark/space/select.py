"""Rows picked by the values of their columns: a claim's groups (`{family: hyperloop, budget: 1M}`)
and a search's `--rerun family=hyperloop`. A filter names a results column, or a search axis as
`axes.<key>` (the value the row's sampled point gave it: its `axes` JSON); it takes one value or a
list of them; a numeric column takes numbers or amounts such as 1.5M (a budget)."""

from __future__ import annotations

import json
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from benchmark.arch import did_you_mean
from benchmark.recipe import parse_amount
from benchmark.space.yamlsafe import YamlError, parse_yaml

AXES_PREFIX = "axes."  # a filter on a search axis: `axes.hyper.mixing: diagonal`


class FilterError(ValueError):
    """A filter the rows cannot answer: `column` names it; `value` says whether its value, rather
    than its column, is wrong."""

    def __init__(self, column: str, message: str, value: bool):
        super().__init__(message)
        self.column, self.value = column, value


def mask(rows: pd.DataFrame, filters: Mapping[str, Sequence[Any]]) -> np.ndarray:
    """Which rows hold one of the wanted values in every filtered column."""
    keep = np.ones(len(rows), dtype=bool)
    for column, wanted in filters.items():
        if column.startswith(AXES_PREFIX) and column not in rows and "axes" in rows:
            values = axis_values(rows["axes"], column[len(AXES_PREFIX) :])
        elif column not in rows:
            raise FilterError(
                column,
                f"no column {column!r} in the results{did_you_mean(column, rows.columns)}",
                value=False,
            )
        else:
            values = rows[column]
        if pd.api.types.is_numeric_dtype(values):
            keep &= values.isin([number(column, w) for w in wanted]).to_numpy()
        else:
            keep &= values.astype(str).isin([str(w) for w in wanted]).to_numpy()
    return keep


def axis_values(axes: pd.Series, key: str) -> pd.Series:
    """The value each row's search point gave `key` (the row's `axes` JSON: `hyper.mixing`,
    `variant`, ...), as text; None where the point did not decide it."""

    def value(text):
        point = json.loads(text) if isinstance(text, str) and text else {}
        return None if point.get(key) is None else str(point[key])

    return axes.map(value).astype(object)


def number(column: str, value: Any) -> float:
    """A filter value for a numeric column: a number, or an amount such as 1.5M (a budget)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    try:
        return float(parse_amount(value))
    except ValueError:
        raise FilterError(
            column, f"this column holds numbers; {value!r} is none", value=True
        ) from None


def parse(text: str, flag: str) -> tuple[str, tuple]:
    """`COLUMN=VALUE` given to `flag` -> (column, values): VALUE as YAML (`hyperloop`, `1M`, a list
    `[hc, mhc]` for any of several); ValueError, one line, otherwise."""
    column, eq, raw = text.partition("=")
    try:
        value = parse_yaml(raw).data if eq and raw.strip() else None
    except YamlError as e:
        raise ValueError(f"{flag} {text}: the value is not acceptable YAML: {e.reason}") from None
    if not column.strip() or value is None or isinstance(value, dict):
        raise ValueError(f"{flag} {text}: expected COLUMN=VALUE, e.g. {flag} family=hyperloop")
    return column.strip(), tuple(value) if isinstance(value, list) else (value,)
