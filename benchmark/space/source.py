"""Where a search space came from, so that every error names the file, the line, the column and the
dotted key: `path:line:col: key.path: what is wrong`."""

from __future__ import annotations

from dataclasses import dataclass

from benchmark.space.yamlsafe import Document, dotted


class SpaceError(ValueError):
    """A search space the user must fix: `file:line:col: key: reason`."""

    def __init__(self, file: str, line: int | None, col: int | None, key: str, reason: str):
        self.file, self.line, self.col, self.key, self.reason = file, line, col, key, reason
        where = f"{file}:{line}:{col}" if line is not None else file
        super().__init__(f"{where}: {key}: {reason}" if key else f"{where}: {reason}")


@dataclass(frozen=True)
class Source:
    """The file a space was read from, and the positions of its keys and values."""

    file: str
    doc: Document | None = None

    def error(self, path: tuple, reason: str, *, value: bool = True) -> SpaceError:
        """An error at `path` (its value, or its key when `value` is false). A dotted key may be
        written nested (`ffn: {kind: ..}`) or as one key (`ffn.kind: ..`); either is found."""
        line, col = (None, None)
        if self.doc:
            spellings = [path[:i] + (".".join(map(str, path[i:])),) for i in range(len(path) - 1, -1, -1)]
            found = next((p for p in spellings if p in self.doc.key_marks or p in self.doc.value_marks), path)
            line, col = self.doc.where(found, value=value)
        return SpaceError(self.file, line, col, dotted(path), reason)
