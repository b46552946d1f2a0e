"""The keys a search space may name, read off the configs instead of kept here: every ArchSpec key
with its rule (arch.spec.SPEC_KEYS: type, allowed values, bounds) and the derived-shape keys
(shape.py). A key or an allowed value added to ArchSpec is accepted by the space as it is.
(`training:` keys are TrainConfig's fields, checked by TrainConfig itself: language.py.)"""

from __future__ import annotations

from typing import Any

from benchmark.arch import SPEC_KEYS, Key, SpecError
from benchmark.space.shape import SHAPE_KEYS
from benchmark.space.source import Source

KEYS: dict[str, Key] = {**SPEC_KEYS, **SHAPE_KEYS}
SECTIONS: dict[str, type] = {
    name: key.section for name, key in SPEC_KEYS.items() if key.section
}  # ffn, layers, hyper
LEAF_KEYS = tuple(name for name, key in SPEC_KEYS.items() if not key.section)


def value_kind(key: str) -> str:
    """int | float | bool | text | enum | list | section, for an ArchSpec or shape key."""
    return KEYS[key].kind


def check_value(key: str, value: Any) -> None:
    """Raise ValueError if `value` cannot be the value of `key` (an ArchSpec dotted key or a shape
    key). Combinations (e.g. every 5 layers of a 12-layer loop) are checked by ArchSpec itself."""
    try:
        KEYS[key].check(value)
    except SpecError as e:  # a shorthand's own key (`layers: 0` is layers.n)
        raise ValueError(e.reason) from None


def first_key(section: str) -> str:
    """The first key of a section, for an example (`ffn` -> `ffn.kind`)."""
    return next(name for name in SPEC_KEYS if name.startswith(section + "."))


def checked(src: Source, path: tuple, key: str, value: Any) -> Any:
    """`value` as written, if `key` takes it; else a SpaceError pointing at `path` in the file."""
    try:
        check_value(key, value)
    except ValueError as e:
        raise src.error(path, str(e)) from None
    return value
