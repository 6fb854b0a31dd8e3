"""A contract violation, located by file, column and row: what every check of a trace returns."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Violation:
    """One contract violation, located precisely."""

    path: str
    message: str
    column: str | None = None
    row: int | None = None

    def __str__(self) -> str:
        where = self.path
        if self.column is not None:
            where += f": column {self.column!r}"
        if self.row is not None:
            where += f" row {self.row}"
        return f"{where}: {self.message}"
