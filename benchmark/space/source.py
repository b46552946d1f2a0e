"""Where a search space came from, so that every error names the file, the line, the column and the
dotted key: `path:line:col: key.path: what is wrong`; or, for a key set on the command line
(`--set KEY=VALUE`, or a flag that is short for one: `--budget 600K`), that flag:
`--set training.sq_len=128: training.sq_len: unknown key (did you mean 'seq_len'?)`."""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from typing import Any, Iterable

from benchmark.space.yamlsafe import Document, YamlError, dotted, load_yaml, parse_yaml


class SpaceError(ValueError):
    """A search space the user must fix: `file:line:col: key: reason`."""

    def __init__(self, file: str, line: int | None, col: int | None, key: str, reason: str):
        self.file, self.line, self.col, self.key, self.reason = file, line, col, key, reason
        where = f"{file}:{line}:{col}" if line is not None else file
        super().__init__(f"{where}: {key}: {reason}" if key else f"{where}: {reason}")


def read_document(path) -> Document:
    """A YAML file of the space language (a space, an architecture file) read by the strict
    loader; a file that cannot be read or parsed is a SpaceError located in it."""
    file = str(path)
    try:
        return load_yaml(path)
    except YamlError as e:
        raise SpaceError(file, e.line, e.col, e.key, e.reason) from None
    except OSError as e:
        raise SpaceError(file, None, None, "", f"cannot read: {e.strerror or e}") from None


@dataclass(frozen=True)
class Override:
    """One key of the space set on the command line: `key` dotted through the document
    (`training.seq_len`, `axes.family`), `value` as YAML would read it, `given` as the user wrote it."""

    key: str
    value: Any
    given: str

    @classmethod
    def flag(cls, flag: str, key: str, value: Any) -> Override:
        """A command-line flag that is short for `--set key=value` (`--budget 600K`)."""
        return cls(key=key, value=value, given=f"--{flag} {value}")

    @property
    def path(self) -> tuple[str, ...]:
        return tuple(self.key.split("."))


_KEY = re.compile(r"[^.=\s]+(\.[^.=\s]+)*")


def parse_set(text: str) -> Override:
    """`KEY=VALUE` of `--set` -> Override; VALUE is a YAML flow value read by the strict loader
    (`128`, `0.05`, `[transformer, looped]`, `{kind: hourglass}`; no tags, no aliases)."""
    given = f"--set {text}"
    key, eq, raw = text.partition("=")
    key = key.strip()
    if not eq or not _KEY.fullmatch(key):
        raise SpaceError(
            given,
            None,
            None,
            "",
            "expected KEY=VALUE with a dotted KEY, e.g. --set training.seq_len=128",
        )
    if not raw.strip():
        raise SpaceError(given, None, None, key, "no value after '=' (write null for none)")
    try:
        value = parse_yaml(raw).data
    except YamlError as e:
        raise SpaceError(
            given,
            None,
            None,
            key,
            f"the value is not acceptable YAML: {e.reason} (at column {e.col})",
        ) from None
    return Override(key=key, value=value, given=given)


def apply_overrides(data: dict[str, Any], overrides: Iterable[Override]) -> dict[str, Any]:
    """A copy of a space document with each override set in turn. The first part of a key is a
    top-level key; below it, a key the document already has, nested (`ffn: {kind: ..}`) or dotted
    (`ffn.kind: ..`), is followed as written, and a new one is added as one dotted key, the form
    every section takes (`axes: {shape.head_dim: ..}`). Setting a key replaces everything under it."""
    out = copy.deepcopy(data)
    for o in overrides:
        top, *rest = o.path
        if not rest:
            out[top] = o.value
            continue
        if out.get(top) is None:  # absent, or written empty (`training:`): a section to set into
            out[top] = {}
        _set_in(out[top], (top,), tuple(rest), o)
    return out


def _set_in(node: Any, at: tuple[str, ...], rest: tuple[str, ...], o: Override) -> None:
    if not isinstance(node, dict):
        raise SpaceError(
            o.given,
            None,
            None,
            ".".join(at),
            f"is {node!r}, not a section: nothing can be set under it",
        )
    known = next((i for i in range(len(rest), 0, -1) if ".".join(rest[:i]) in node), len(rest))
    if known < len(rest):  # the longest key the document already spells, then on below it
        return _set_in(node[".".join(rest[:known])], at + rest[:known], rest[known:], o)
    key = ".".join(rest)
    for old in [
        k for k in node if str(k).startswith(key + ".")
    ]:  # `ffn.kind: ..` goes with a new `ffn`
        del node[old]
    node[key] = copy.deepcopy(o.value)


@dataclass(frozen=True)
class Source:
    """The file a space was read from, the positions of its keys and values, and the keys the
    command line set over it."""

    file: str
    doc: Document | None = None
    overrides: tuple[Override, ...] = ()

    def error(self, path: tuple, reason: str, *, value: bool = True) -> SpaceError:
        """An error at `path` (its value, or its key when `value` is false). A dotted key may be
        written nested (`ffn: {kind: ..}`) or as one key (`ffn.kind: ..`); either is found. A key
        an override set is the override's error, not the file's."""
        given = self.given(path)
        if given is not None:
            return SpaceError(given.given, None, None, dotted(path), reason)
        line, col = (None, None)
        if self.doc:
            spellings = [
                path[:i] + (".".join(map(str, path[i:])),) for i in range(len(path) - 1, -1, -1)
            ]
            found = next(
                (p for p in spellings if p in self.doc.key_marks or p in self.doc.value_marks), path
            )
            line, col = self.doc.where(found, value=value)
        return SpaceError(self.file, line, col, dotted(path), reason)

    def given(self, path: tuple) -> Override | None:
        """The last override that set `path` or a key above it; or, for a top key the file does not
        have, one that set a key below it (`--set trainng.seq_len=1` makes the unknown top key
        `trainng`). A section the file has is the file's error, whatever was set inside it."""
        parts = tuple(q for p in path for q in (p.split(".") if isinstance(p, str) else (p,)))
        created = len(parts) == 1 and not (
            self.doc and isinstance(self.doc.data, dict) and parts[0] in self.doc.data
        )
        return next(
            (
                o
                for o in reversed(self.overrides)
                if parts and (parts[: len(o.path)] == o.path or created and o.path[:1] == parts)
            ),
            None,
        )
