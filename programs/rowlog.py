"""A program's log of rows kept as columns: one list (or typed array) per field, not a
dictionary per row.

A run of a million programs logs a row per request, about 150 million rows: a dictionary of
sixteen fields costs some 650 bytes, a column's entry 8 (a pointer to a shared object, or the
integer itself in a typed array), and the table is built from the columns without reading a
row.
"""

from __future__ import annotations

import copy
from array import array
from collections.abc import Iterator


class RowLog:
    """Rows of fixed fields, appended in the fields' order and kept column by column; the
    columns made with the first row (a million programs are made before they run, and a
    column's empty list or array costs ~60 bytes: kilobytes a program)."""

    __slots__ = ("fields", "codes", "columns", "_appends")

    def __init__(self, fields: dict[str, str]):
        """`fields`: name -> an `array` type code for a field whose values are always integers
        or floats ("q", "d"), or "" for a list (text, flags, tuples, or a value that may be
        None)."""
        self.fields = tuple(fields)
        self.codes = fields
        self.columns: dict | None = None
        self._appends: tuple | None = None

    def _open(self) -> None:
        self.columns = {name: array(code) if code else [] for name, code in self.codes.items()}
        self._appends = tuple(c.append for c in self.columns.values())

    def __deepcopy__(self, memo: dict) -> RowLog:
        """A copy with columns of its own, its appends bound to them (`copy` keeps a bound
        built-in method as it is: the copy's rows would go to this log's columns)."""
        new = RowLog(self.codes)
        if self.columns is not None:
            new.columns = copy.deepcopy(self.columns, memo)
            new._appends = tuple(c.append for c in new.columns.values())
        return new

    def add(self, *values) -> None:
        """Append one row: a value for each field, in the fields' order."""
        if self._appends is None:
            self._open()
        if len(values) != len(self._appends):
            raise ValueError(f"row log: {len(values)} values for {len(self.fields)} fields "
                             f"{self.fields}")
        for append, value in zip(self._appends, values):
            append(value)

    def column(self, name: str) -> list:
        """A field's values as a list, in the order the rows were added."""
        if self.columns is None:
            if name not in self.codes:
                raise KeyError(name)
            return []
        c = self.columns[name]
        return c.tolist() if isinstance(c, array) else c

    def __len__(self) -> int:
        return len(self.columns[self.fields[0]]) if self.fields and self.columns else 0

    def __iter__(self) -> Iterator[dict]:
        """Each row as a fresh dictionary (live writers and tests; the simulator reads
        columns)."""
        for values in zip(*(self.columns or {}).values()):
            yield dict(zip(self.fields, values))
