"""Conditions of a search space (`when: "family == 'hyperloop' and loops > 2"`), without eval.

A tokenizer and a recursive-descent parser compile the text into a Python closure. Grammar:

    expr    := and ('or' and)*
    and     := not ('and' not)*
    not     := 'not' not | compare
    compare := atom [('==' | '!=' | '<' | '<=' | '>' | '>=' | 'in' | 'not in') atom]
    atom    := NUMBER | STRING | NAME | true | false | null | '[' [atom (',' atom)*] ']' | '(' expr ')'

NAME is a dotted name (`ffn.K`, `shape.layers`) resolved by the caller at evaluation time.
An unset name reads as null; an ordering comparison with null is false, so a condition on an
axis that is switched off for this candidate is simply not met.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

_TOKEN = re.compile(
    r"""
    \s*(?:
      (?P<number>-?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)
    | (?P<string>'[^']*'|"[^"]*")
    | (?P<name>[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)
    | (?P<op>==|!=|<=|>=|<|>|\(|\)|\[|\]|,)
    )""",
    re.VERBOSE,
)
_KEYWORDS = {"and", "or", "not", "in", "true", "false", "null"}
_CONSTANTS = {"true": True, "false": False, "null": None}

Lookup = Callable[[str], Any]


class ExprError(ValueError):
    """A malformed condition; `offset` is the 0-based character where the problem starts."""

    def __init__(self, reason: str, offset: int = 0):
        self.reason, self.offset = reason, offset
        super().__init__(reason)


@dataclass(frozen=True)
class _Tok:
    kind: str  # number | string | name | op | keyword | end
    text: str
    offset: int


def _tokenize(text: str) -> list[_Tok]:
    toks, pos = [], 0
    while text[pos:].strip():
        m = _TOKEN.match(text, pos)
        if not m:
            at = len(text) - len(text[pos:].lstrip())
            what = (
                "unterminated string" if text[at] in "'\"" else f"unexpected character {text[at]!r}"
            )
            raise ExprError(what, at)
        kind = m.lastgroup
        word, start = m.group(kind), m.start(kind)
        if kind == "name" and word in _KEYWORDS:
            kind = "keyword"
        toks.append(_Tok(kind, word, start))
        pos = m.end()
    toks.append(_Tok("end", "", len(text)))
    return toks


def _show(t: _Tok) -> str:
    return repr(t.text) if t.text else "the end"


def _compare(op: str, a: Any, b: Any) -> bool:
    if op == "==":
        return a == b
    if op == "!=":
        return a != b
    if op in ("in", "not in"):
        if not isinstance(b, list):
            raise ExprError(f"'{op}' needs a list on its right, got {b!r}")
        return (a in b) == (op == "in")
    if a is None or b is None:
        return False
    try:
        return {"<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b}[op]
    except TypeError:
        raise ExprError(f"cannot compare {a!r} {op} {b!r}") from None


class _Parser:
    def __init__(self, text: str):
        self.toks = _tokenize(text)
        self.i = 0
        self.names: dict[str, int] = {}  # name -> offset of its first use

    def peek(self, *texts: str) -> bool:
        t = self.toks[self.i]
        return t.kind in ("op", "keyword") and t.text in texts

    def take(self) -> _Tok:
        t = self.toks[self.i]
        self.i += 1
        return t

    def expect(self, text: str) -> None:
        t = self.take()
        if t.text != text or t.kind not in ("op", "keyword"):
            raise ExprError(f"expected '{text}', found {_show(t)}", t.offset)

    def parse(self) -> Callable[[Lookup], Any]:
        fn = self.or_()
        t = self.toks[self.i]
        if t.kind != "end":
            raise ExprError(f"unexpected {_show(t)}", t.offset)
        return fn

    def or_(self):
        parts = [self.and_()]
        while self.peek("or"):
            self.take()
            parts.append(self.and_())
        return parts[0] if len(parts) == 1 else (lambda get: any(bool(p(get)) for p in parts))

    def and_(self):
        parts = [self.not_()]
        while self.peek("and"):
            self.take()
            parts.append(self.not_())
        return parts[0] if len(parts) == 1 else (lambda get: all(bool(p(get)) for p in parts))

    def not_(self):
        if self.peek("not"):
            self.take()
            inner = self.not_()
            return lambda get: not inner(get)
        return self.compare()

    def compare(self):
        left = self.atom()
        if self.peek("not") and self.toks[self.i + 1].text == "in":
            self.i += 2
            op = "not in"
        elif self.peek("==", "!=", "<", "<=", ">", ">=", "in"):
            op = self.take().text
        else:
            return left
        right = self.atom()
        return lambda get: _compare(op, left(get), right(get))

    def atom(self):
        t = self.take()
        if t.kind == "number":
            value = float(t.text) if any(c in t.text for c in ".eE") else int(t.text)
            return lambda get: value
        if t.kind == "string":
            return lambda get, s=t.text[1:-1]: s
        if t.kind == "keyword" and t.text in _CONSTANTS:
            return lambda get, v=_CONSTANTS[t.text]: v
        if t.kind == "name":
            self.names.setdefault(t.text, t.offset)
            return lambda get, n=t.text: get(n)
        if t.text == "(" and t.kind == "op":
            inner = self.or_()
            self.expect(")")
            return inner
        if t.text == "[" and t.kind == "op":
            items = []
            if not self.peek("]"):
                items.append(self.atom())
                while self.peek(","):
                    self.take()
                    items.append(self.atom())
            self.expect("]")
            return lambda get: [item(get) for item in items]
        raise ExprError(f"expected a value, found {_show(t)}", t.offset)


@dataclass(frozen=True)
class Condition:
    """A compiled condition. `names` maps every name it reads to the offset of its first use."""

    text: str
    names: Mapping[str, int] = field(compare=False)
    _fn: Callable[[Lookup], Any] = field(compare=False, repr=False)

    def __call__(self, get: Lookup) -> bool:
        return bool(self._fn(get))

    def __reduce__(self):
        # Pickled as its text and compiled again when loaded: the closure cannot be pickled, and
        # Ray Tune pickles the Optuna searcher (with the space and its conditions) at every
        # experiment checkpoint; a space with a `when` used to crash the search there.
        return parse_condition, (self.text,)


def parse_condition(text: str) -> Condition:
    """Compile `text`; raises ExprError (with the offset of the problem) if it is malformed."""
    if not isinstance(text, str) or not text.strip():
        raise ExprError("a condition must be a non-empty text, e.g. \"family == 'hyperloop'\"")
    p = _Parser(text)
    fn = p.parse()
    return Condition(text, p.names, fn)
