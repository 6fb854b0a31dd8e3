"""How a column of a reasonsim table is declared: its name, Arrow type, doc and nullability."""

from __future__ import annotations

import pyarrow as pa


def _f(name: str, typ: pa.DataType, doc: str, nullable: bool = False) -> pa.Field:
    """A column: its doc travels in the field's metadata (Parquet files carry it)."""
    return pa.field(name, typ, nullable=nullable, metadata={b"doc": doc.encode()})


_RUN_ID = _f("run_id", pa.string(), "run this row belongs to (joins to runs.run_id)")
