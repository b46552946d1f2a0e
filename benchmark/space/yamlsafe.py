"""Load a YAML config as plain data, remembering where every key and value sits.

A config must never run code (STYLE.md: "a config must never run code"). `StrictLoader` is a
`yaml.SafeLoader` that additionally refuses anchors/aliases and merge keys, and we only ever
construct the core scalar tags (str, int, float, bool, null) ourselves, so `!!python/object`
and friends are errors, not objects. Duplicate keys are errors (PyYAML silently keeps the last).

`load_yaml(path)` returns a `Document`: the data (dicts, lists, scalars) and the 1-based
(line, column) of every key and value, addressed by their path of keys and list indices, so a
validator can report `path:line:col: key.path: what is wrong`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

KeyPath = tuple[Any, ...]  # a path of mapping keys (str) and list indices (int)

_CORE_SCALARS = {f"tag:yaml.org,2002:{t}" for t in ("str", "int", "float", "bool", "null")}
_SEQ, _MAP = "tag:yaml.org,2002:seq", "tag:yaml.org,2002:map"


class YamlError(ValueError):
    """A file that is not acceptable YAML; `line` and `col` are 1-based, `key` the dotted path of
    the entry at fault ("" when the parser cannot tell)."""

    def __init__(self, line: int, col: int, reason: str, key: str = ""):
        self.line, self.col, self.reason, self.key = line, col, reason, key
        super().__init__(f"{line}:{col}: {key + ': ' if key else ''}{reason}")


def dotted(path: KeyPath) -> str:
    """('axes', 'family', 1) -> 'axes.family[1]'."""
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else f".{p}" if out else str(p)
    return out


def _at(mark: yaml.Mark) -> tuple[int, int]:
    return mark.line + 1, mark.column + 1


class StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses aliases while composing (so no alias bomb is ever built)."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            raise YamlError(
                *_at(self.peek_event().start_mark), "anchors and aliases (*name) are not supported"
            )
        return super().compose_node(parent, index)


# YAML 1.1 reads `6e-4` and `1.5e3` (no dot, or no exponent sign) as text; the docs write a learning
# rate as `6e-4`, so read any decimal with an exponent as a number, as YAML 1.2 does.
StrictLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+.0123456789"),
)


@dataclass(frozen=True, kw_only=True)
class Document:
    data: Any
    key_marks: dict[KeyPath, tuple[int, int]]  # where the key of a mapping entry starts
    value_marks: dict[KeyPath, tuple[int, int]]  # where a value (or list item) starts

    def where(self, path: KeyPath, *, value: bool = False) -> tuple[int, int]:
        """The position of `path` (its value if `value`), else of its nearest recorded parent."""
        marks = self.value_marks if value else self.key_marks
        path = tuple(path)
        while path:
            if path in marks:
                return marks[path]
            if value and path in self.key_marks:
                return self.key_marks[path]
            path = path[:-1]
        return self.value_marks.get((), (1, 1))


def load_yaml(path: str | Path) -> Document:
    """Parse one YAML document; raises YamlError (with line and column) for anything unsafe or
    malformed, and OSError if the file cannot be read."""
    return parse_yaml(Path(path).read_text(encoding="utf-8"))


def parse_yaml(text: str) -> Document:
    """`load_yaml` of text (a file's, or a `--set KEY=VALUE`'s value)."""
    loader = StrictLoader(text)
    try:
        node = loader.get_single_node()
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        raise YamlError(*_at(mark), f"YAML syntax: {_plain(e.problem or e.context)}") from None
    finally:
        loader.dispose()
    if node is None:
        raise YamlError(1, 1, "the file is empty")
    keys: dict[KeyPath, tuple[int, int]] = {}
    values: dict[KeyPath, tuple[int, int]] = {}
    data = _convert(node, loader, (), keys, values)
    return Document(data=data, key_marks=keys, value_marks=values)


# PyYAML's parser vocabulary, in words a config author can act on.
_PLAIN = {
    "expected <block end>": "inconsistent indentation",
    "mapping values are not allowed here": "unexpected ':' (check the indentation, or quote a value containing ': ')",
    "could not find expected ':'": "expected 'key: value'",
    "found character '\\t' that cannot start any token": "tabs are not allowed; indent with spaces",
}


def _plain(problem: str) -> str:
    return next((words for start, words in _PLAIN.items() if problem.startswith(start)), problem)


def _convert(node: yaml.Node, loader: StrictLoader, path: KeyPath, keys: dict, values: dict) -> Any:
    values[path] = _at(node.start_mark)
    if isinstance(node, yaml.ScalarNode):
        _check_tag(node, path, *_CORE_SCALARS)
        return loader.construct_object(node)
    if isinstance(node, yaml.SequenceNode):
        _check_tag(node, path, _SEQ)
        return [
            _convert(item, loader, path + (i,), keys, values) for i, item in enumerate(node.value)
        ]
    _check_tag(node, path, _MAP)
    out: dict[str, Any] = {}
    for key_node, value_node in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            raise YamlError(
                *_at(key_node.start_mark), "merge keys (<<) are not supported", dotted(path)
            )
        key = loader.construct_object(key_node) if isinstance(key_node, yaml.ScalarNode) else None
        if not isinstance(key, str):
            raise YamlError(
                *_at(key_node.start_mark), f"keys must be text, got {key!r}; quote it", dotted(path)
            )
        if key in out:
            first = keys[path + (key,)]
            raise YamlError(
                *_at(key_node.start_mark),
                f"duplicate key (first given at line {first[0]})",
                dotted(path + (key,)),
            )
        keys[path + (key,)] = _at(key_node.start_mark)
        out[key] = _convert(value_node, loader, path + (key,), keys, values)
    return out


def _check_tag(node: yaml.Node, path: KeyPath, *allowed: str) -> None:
    if node.tag not in allowed:
        name = node.tag.replace("tag:yaml.org,2002:", "!!")
        raise YamlError(
            *_at(node.start_mark),
            f"YAML tag {name} is not allowed: a config holds only text, numbers, "
            "true/false, null, lists and mappings (quote a value to make it text)",
            dotted(path),
        )
