"""Config fields that carry their own rule. `setting(default, choices=..., at_least=...)` is a
dataclass field whose metadata says which values it takes; `keys(cls)` reads a config dataclass
into dotted `Key`s (type from the annotation, rule from the metadata), and `Key.check` applies
the rule. ArchSpec and TrainConfig declare every key this way, so their own validation and the
search space read one rule per key, and a key or an allowed value added to a dataclass is known
everywhere at once.
"""

from __future__ import annotations

import copy
import difflib
import types
import typing
from dataclasses import MISSING, dataclass, field, fields, is_dataclass
from functools import cached_property
from typing import Any, Callable, Mapping


def did_you_mean(word: Any, options) -> str:
    """' (did you mean 'x'?)' for the closest option, else ''. Shared by every validator."""
    close = difflib.get_close_matches(str(word), [str(o) for o in options], n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


def one_of(value: Any, options) -> Any:
    if value not in options:
        raise ValueError(
            f"'{value}' is not one of {', '.join(map(str, options))}{did_you_mean(value, options)}"
        )
    return value


def setting(
    default: Any = MISSING,
    *,
    factory: Any = MISSING,
    choices: tuple = (),
    at_least: float | None = None,
    above: float | None = None,
    at_most: float | None = None,
    parse: Callable[[Any], Any] | None = None,
) -> Any:
    """A dataclass field and its rule: `choices` (a closed allow-list), bounds (`at_least` or
    `above`, and `at_most`), or `parse` (raises ValueError for a bad value; it runs after the
    annotation's type check, or alone where the annotation admits several types)."""
    rule = {
        "choices": choices,
        "at_least": at_least,
        "above": above,
        "at_most": at_most,
        "parse": parse,
    }
    return field(
        default=default,
        default_factory=factory,
        metadata={k: v for k, v in rule.items() if v not in ((), None)},
    )


@dataclass(frozen=True, kw_only=True)
class Key:
    """One dotted key of a config (`hyper.mixing`), as validators and the search space see it."""

    name: str
    types: tuple[type, ...]  # what the annotation admits besides None
    nullable: bool = False  # None is a value: "derive it" or, for a section, "none"
    default: Any = None
    choices: tuple = ()
    at_least: float | None = None
    above: float | None = None
    at_most: float | None = None
    parse: Callable[[Any], Any] | None = None
    section: type | None = None  # a nested config dataclass (ffn, layers, hyper)

    @cached_property  # read at every check: the solver validates thousands of specs
    def kind(self) -> str:
        """section | enum | list | bool | int | float | text | parsed (several types, one parser)."""
        if self.section:
            return "section"
        if self.choices:
            return "enum"
        if self.types == (tuple,):
            return "list"
        return {(bool,): "bool", (int,): "int", (float,): "float", (str,): "text"}.get(
            self.types, "parsed"
        )

    def check(self, value: Any) -> Any:
        """`value`, normalised (an integral float as int, a number as float, a list as a tuple);
        raises ValueError saying what is wrong."""
        if value is None and self.nullable:
            return None
        kind = self.kind
        if kind == "section":
            return self._section(value)
        if kind == "enum" and not (int in self.types and _is_int(value)):
            value = one_of(value, self.choices)
        elif kind == "list":
            value = self._list(value)
        elif kind == "bool" and not isinstance(value, bool):
            raise ValueError(f"expected true or false, got {value!r}")
        elif kind == "text" and not isinstance(value, str):
            raise ValueError(f"expected text, got {value!r}")
        elif kind in ("int", "enum"):
            value = self._bounded(_integer(value))
        elif kind == "float":
            value = float(self._bounded(_number(value)))
        return self.parse(value) if self.parse else value

    def _section(self, value: Any) -> Any:
        if self.parse:
            return self.parse(value)
        if not isinstance(value, (dict, Mapping)):  # dict first: an ABC check is slow
            raise ValueError(f"expected a mapping of {self.name} keys, got {value!r}")
        return value

    def _list(self, value: Any) -> tuple[int, ...]:
        lo = f" >= {self.at_least:g}" if self.at_least is not None else ""
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"expected a list of integers{lo}, got {value!r}")
        try:
            return tuple(self._bounded(_integer(v)) for v in value)
        except ValueError:
            raise ValueError(f"expected a list of integers{lo}, got {value!r}") from None

    def _bounded(self, value: float) -> Any:
        lo, hi = (self.above if self.above is not None else self.at_least), self.at_most
        low_ok = lo is None or value > lo or (value == lo and self.above is None)
        if low_ok and (hi is None or value <= hi):
            return value
        if hi is None:
            raise ValueError(f"must be {'>=' if self.above is None else '>'} {lo:g}, got {value}")
        bracket = "[" if self.above is None else "("
        raise ValueError(f"must be in {bracket}{lo:g}, {hi:g}], got {value}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _integer(value: Any) -> int:
    if _is_int(value):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    raise ValueError(f"expected an integer, got {value!r}")


def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"expected a number, got {value!r}")
    return value


def keys(cls: type, prefix: str = "") -> dict[str, Key]:
    """Every field of the config dataclass `cls` as a dotted Key, sections followed by their keys."""
    hints = typing.get_type_hints(cls)
    out: dict[str, Key] = {}
    for f in fields(cls):
        admitted = _admitted(hints[f.name])
        section = next((t for t in admitted if is_dataclass(t)), None)
        default = (
            f.default_factory()
            if f.default is MISSING and f.default_factory is not MISSING
            else f.default
        )
        key = Key(
            name=prefix + f.name,
            types=tuple(t for t in admitted if t is not type(None)),
            nullable=type(None) in admitted,
            default=None if default is MISSING else default,
            section=section,
            **f.metadata,
        )
        out[key.name] = key
        if section:
            out.update(keys(section, f"{key.name}."))
    return out


def _admitted(hint: Any) -> tuple[type, ...]:
    """int | None -> (int, NoneType); tuple[int, ...] -> (tuple,)."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        return tuple(t for arg in typing.get_args(hint) for t in _admitted(arg))
    return (typing.get_origin(hint) or hint,)


def deep_merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """Nested dict update: `over` wins; mappings merge key by key."""
    out = copy.deepcopy(dict(base))
    for k, v in over.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), Mapping):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def set_dotted(raw: dict[str, Any], key: str, value: Any) -> None:
    """raw["a"]["b"] = value for key "a.b", creating the sections on the way."""
    *path, leaf = key.split(".")
    node = raw
    for part in path:
        node = node.setdefault(part, {})
    node[leaf] = value
