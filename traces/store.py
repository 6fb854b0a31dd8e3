"""Reading and writing trace directories: crash-safe part files, resume, and validation.

A trace directory holds one sub-directory per table; each table is a set of Parquet part files
`{table}/part-{unit}.parquet`, one per unit of work (a profiling grid cell, a chunk of requests).
A part is written to a temporary name and renamed into place, so a tracer killed at any point
(even SIGKILL) leaves only complete parts: every flushed row reads back. A unit's marker
`_units/{unit}.done` is written after all its parts; `--resume` skips done units and rewrites
the parts of unfinished ones under the same names, so rows are never duplicated.
"""

from __future__ import annotations

import json
import os
import re
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from traces.manifest import parts, seal as seal_dir, unseal, verify
from traces.schema import (ADDED_COLUMNS, COUNT_COLUMNS, ENUM_COLUMNS, META_TABLE, META_VERSION,
                           ORDERED_TIMES, SCHEMAS, TIME_COLUMNS, UNIQUE_KEYS, schema_of,
                           table_version)

_UNIT_RE = re.compile(r"^[A-Za-z0-9_.=-]+$")
PARTIAL_RE = re.compile(r"^\..+\.partial-\d+$")
"""a hidden sibling an output directory is written into before its rename"""
MAX_REPORTED = 20


class TraceError(ValueError):
    """A trace violates the data contract; the message names file, column and row."""


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


def _atomic_write(table: pa.Table, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    pq.write_table(table, tmp)
    os.replace(tmp, path)


def to_table(name: str, columns: dict[str, list[Any]] | pa.Table) -> pa.Table:
    """Build a table of the named schema from columns; missing nullable columns become null."""
    schema = schema_of(name)
    if isinstance(columns, pa.Table):
        columns = {c: columns.column(c) for c in columns.column_names}
    unknown = set(columns) - set(schema.names)
    if unknown:
        raise TraceError(f"{name}: unknown columns {sorted(unknown)}")
    n = max((len(v) for v in columns.values()), default=0)
    arrays = []
    for field in schema:
        if field.name in columns:
            arrays.append(pa.array(columns[field.name], type=field.type)
                          if not isinstance(columns[field.name], (pa.Array, pa.ChunkedArray))
                          else columns[field.name].cast(field.type))
        elif field.nullable:
            arrays.append(pa.nulls(n, type=field.type))
        else:
            raise TraceError(f"{name}: missing required column {field.name!r}")
    return pa.Table.from_arrays(arrays, schema=schema)


def check_out_dir(trace_dir: str | Path, resume: bool, can_resume: bool = True) -> Path:
    """A trace directory to write: empty or new, or any when resuming (tracers call this before
    they start an engine, so the error comes at once)."""
    path = Path(trace_dir)
    if path.exists() and any(path.iterdir()) and not resume:
        hint = "pass --resume to continue it or choose" if can_resume else "choose"
        raise TraceError(f"{path}: not empty; {hint} a new directory")
    return path


class TraceWriter:
    """Buffered, crash-safe, resumable writer of one run into a trace directory."""

    def __init__(self, trace_dir: str | Path, run: dict[str, Any], resume: bool = False):
        self.dir = check_out_dir(trace_dir, resume)
        runs_part = self.dir / "runs" / "part-run.parquet"
        if resume and runs_part.exists():
            old = pq.read_table(runs_part).to_pylist()[0]
            for key in ("kind", "model_config_hash", "load_format", "dtype", "params_json"):
                if key in run and old[key] != run[key]:
                    raise TraceError(f"{runs_part}: cannot resume: {key} differs "
                                     f"(trace has {old[key]!r}, now {run[key]!r})")
            self.run_id = old["run_id"]
        else:
            self.run_id = run.get("run_id") or uuid.uuid4().hex[:12]
            self.dir.mkdir(parents=True, exist_ok=True)
            (self.dir / "runs").mkdir(exist_ok=True)
            _atomic_write(to_table("runs", {k: [v] for k, v in {**run, "run_id": self.run_id}
                                            .items()}), runs_part)
        (self.dir / "_units").mkdir(exist_ok=True)
        unseal(self.dir)  # written again: sealed anew at its end
        self._buf: dict[str, dict[str, list]] = {}

    def done_units(self) -> set[str]:
        """Units whose parts were all written by this or an earlier (killed) session."""
        return {p.name[:-5] for p in (self.dir / "_units").glob("*.done")}

    def add(self, table: str, **row: Any) -> None:
        """Buffer one row of `table` (run_id is filled in)."""
        cols = self._buf.setdefault(table, {})
        row["run_id"] = self.run_id
        n = len(next(iter(cols.values()))) if cols else 0
        for key, value in row.items():
            col = cols.get(key)
            if col is None:
                col = cols[key] = [None] * n
            col.append(value)
        for key, col in cols.items():
            if len(col) == n:
                col.append(None)

    def flush(self, unit: str) -> None:
        """Write every buffered table as the unit's part files, then mark the unit done."""
        if not _UNIT_RE.match(unit):
            raise ValueError(f"unit name {unit!r} must match {_UNIT_RE.pattern}")
        for table, cols in self._buf.items():
            (self.dir / table).mkdir(exist_ok=True)
            _atomic_write(to_table(table, cols), self.dir / table / f"part-{unit}.parquet")
        self._buf = {}
        (self.dir / "_units" / f"{unit}.done").write_text("")

    def seal(self, files: tuple[str, ...] = ()) -> None:
        """Write the directory's manifest (`traces.manifest`; `files`: top-level files it hashes
        too): its writer's last act, once every unit is flushed; a directory without one never
        passes `traces check`."""
        if self._buf:
            raise RuntimeError(f"{self.dir}: rows buffered but not flushed; flush before sealing")
        seal_dir(self.dir, self.run_id, files)


def write_tables(trace_dir: str | Path, run: dict[str, Any], tables: dict[str, pa.Table | dict],
                 files: dict[str, str] | None = None) -> str:
    """Write whole tables of one run at once (simulator output), and `files` (name -> text)
    beside them, hashed in the manifest too; returns the run id."""
    writer = TraceWriter(trace_dir, run)
    for name, cols in tables.items():
        if isinstance(cols, pa.Table):
            cols = {c: cols.column(c) for c in cols.column_names}
        n = len(next(iter(cols.values())))
        table = to_table(name, {**cols, "run_id": pa.array([writer.run_id] * n, pa.string())})
        (writer.dir / name).mkdir(exist_ok=True)
        _atomic_write(table, writer.dir / name / "part-all.parquet")
    (writer.dir / "_units" / "all.done").write_text("")
    for name, text in (files or {}).items():
        (writer.dir / name).write_text(text)
    writer.seal(tuple(files or ()))
    return writer.run_id


# ---------------------------------------------------------------- validation and reading

def _table_name_of(path: Path, schema: pa.Schema) -> str | None:
    meta = schema.metadata or {}
    if META_TABLE in meta:
        return meta[META_TABLE].decode()
    parent = path.parent.name
    return parent if parent in SCHEMAS else None


def check_file(path: str | Path, table: str | None = None) -> list[Violation]:
    """Validate one Parquet part file against the contract; return every violation found."""
    return checked_part(path, table)[0]


def checked_part(path: str | Path, table: str | None = None
                 ) -> tuple[list[Violation], pa.Table | None]:
    """(every violation of one part file, the table it holds as read for the check): a reader
    that validates takes the data from here rather than reading the file again."""
    path = Path(path)
    p = str(path)
    try:
        pf = pq.ParquetFile(path)
    except Exception as e:  # unreadable bytes: one clear violation, not a stack trace
        return [Violation(p, f"not a readable Parquet file ({type(e).__name__}: {e})")], None
    schema = pf.schema_arrow
    name = table or _table_name_of(path, schema)
    if name not in SCHEMAS:
        return [Violation(p, f"cannot tell which table this is (metadata {META_TABLE.decode()!r} "
                             f"missing and folder {path.parent.name!r} is not a table name)")], None
    out = _schema_violations(p, name, schema)
    if out:
        return out, None
    try:
        data = pq.read_table(path, schema=SCHEMAS[name])  # an older version's added columns null
    except Exception as e:  # a footer that parses over pages that do not
        return [Violation(p, f"not a readable Parquet file ({type(e).__name__}: {e})")], None
    out += _value_violations(p, name, data)
    if name == "runs" and data.num_rows != 1:
        out.append(Violation(p, f"runs part must hold exactly one row, has {data.num_rows}"))
    return out, data


def _schema_violations(p: str, name: str, schema: pa.Schema) -> list[Violation]:
    """A part's schema version, columns and types against its table's."""
    out: list[Violation] = []
    meta = schema.metadata or {}
    version = meta.get(META_VERSION, b"").decode() or None
    older = {str(v): added for v, added in ADDED_COLUMNS.get(name, {}).items()}
    if version != str(table_version(name)) and version not in older:
        out.append(Violation(p, f"schema version {version!r}, expected {table_version(name)!r} "
                                f"(table {name})"))
    expected, added = SCHEMAS[name], older.get(version, ())
    out += [Violation(p, f"unknown column (table {name})", column=c)
            for c in schema.names if c not in expected.names]
    out += [Violation(p, f"missing column (table {name})", column=c)
            for c in expected.names if c not in schema.names and c not in added]
    out += [Violation(p, f"column added after version {version} (table {name})", column=c)
            for c in added if c in schema.names]
    for field in expected:
        if field.name in schema.names and schema.field(field.name).type != field.type:
            out.append(Violation(p, f"type {schema.field(field.name).type}, expected {field.type}",
                                 column=field.name))
    return out


def _value_violations(p: str, name: str, data: pa.Table) -> list[Violation]:
    """A part's values: nulls, times finite, non-negative and in order, counts, cached tokens."""
    out: list[Violation] = []
    for field in SCHEMAS[name]:
        if not field.nullable and data.column(field.name).null_count:
            row = int(np.flatnonzero(data.column(field.name).is_null().to_numpy(
                zero_copy_only=False))[0])
            out.append(Violation(p, "null in a required column", column=field.name, row=row))
    for c in TIME_COLUMNS[name]:
        v = data.column(c).to_numpy(zero_copy_only=False).astype(float)  # nulls -> nan
        valid = ~data.column(c).is_null().to_numpy(zero_copy_only=False)
        bad_nan = np.flatnonzero(valid & ~np.isfinite(v))
        if bad_nan.size:
            out.append(Violation(p, f"non-finite time {v[bad_nan[0]]} ({bad_nan.size} rows)",
                                 column=c, row=int(bad_nan[0])))
        bad_neg = np.flatnonzero(valid & (v < 0))
        if bad_neg.size:
            out.append(Violation(p, f"negative time {v[bad_neg[0]]} ({bad_neg.size} rows)",
                                 column=c, row=int(bad_neg[0])))
    order = ORDERED_TIMES.get(name, ())
    if order:
        # Each timestamp against the latest earlier one present in its row (nulls skipped).
        latest = np.full(data.num_rows, np.nan)
        latest_col = np.full(data.num_rows, "", dtype=object)
        for col in order:
            v = data.column(col).to_numpy(zero_copy_only=False).astype(float)
            with np.errstate(invalid="ignore"):
                bad = np.flatnonzero(v < latest - 1e-9)
            if bad.size:
                r = int(bad[0])
                out.append(Violation(p, f"{col}={v[r]} before {latest_col[r]}={latest[r]} "
                                        f"({bad.size} rows)", column=col, row=r))
            present = ~np.isnan(v)
            latest = np.where(present, np.fmax(v, np.nan_to_num(latest, nan=-np.inf)), latest)
            latest_col = np.where(present, col, latest_col)
    for col in COUNT_COLUMNS.get(name, ()):
        v = data.column(col).to_numpy(zero_copy_only=False).astype(float)
        bad = np.flatnonzero(v < 0)
        if bad.size:
            out.append(Violation(p, f"negative count {v[bad[0]]:g} ({bad.size} rows)",
                                 column=col, row=int(bad[0])))
    for col, allowed in ENUM_COLUMNS.get(name, {}).items():
        values = data.column(col).to_pylist()
        bad = [i for i, v in enumerate(values) if v is not None and v not in allowed]
        if bad:
            out.append(Violation(p, f"{values[bad[0]]!r} is not one of {', '.join(allowed)} "
                                    f"({len(bad)} rows)", column=col, row=bad[0]))
    if name == "requests":
        cached = data.column("cached_prompt_tokens").to_numpy(zero_copy_only=False).astype(float)
        prompt = data.column("prompt_tokens").to_numpy(zero_copy_only=False).astype(float)
        bad = np.flatnonzero(cached > prompt)
        if bad.size:
            out.append(Violation(p, f"cached_prompt_tokens {cached[bad[0]]:g} > prompt_tokens "
                                    f"{prompt[bad[0]]:g} ({bad.size} rows)",
                                 column="cached_prompt_tokens", row=int(bad[0])))
    return out


def check_trace(path: str | Path) -> list[Violation]:
    """Validate a trace directory (every table, nested runs too) or a single part file."""
    path = Path(path)
    if not path.exists():
        return [Violation(str(path), "does not exist")]
    if path.is_file():
        from traces.manifest import verify_part  # the manifest module reads this one's parts

        return check_file(path) + [Violation(f, m) for f, m in verify_part(path)]
    out: list[Violation] = []
    if PARTIAL_RE.match(path.name):
        return [Violation(str(path), "a partial output its writer left when it was killed (the "
                                     "next write of the same output removes it)")]
    if not parts(path, "runs"):
        out.append(Violation(str(path), "no runs table: not a trace directory"))
    for sub in sorted(path.iterdir()):
        if sub.name.startswith((".", "_")) or not sub.is_dir():
            continue
        if sub.name not in SCHEMAS and parts(sub, "runs"):
            out.extend(check_trace(sub))  # a nested run (one engine of a two-engine trace)
            continue
        if sub.name not in SCHEMAS:
            out.append(Violation(str(sub), f"unknown table folder; known: {', '.join(SCHEMAS)}"))
            continue
        for part in parts(path, sub.name):
            out.extend(check_file(part, sub.name))
    requests = parts(path, "requests")
    if requests and not out and not any(pq.ParquetFile(f).metadata.num_rows for f in requests):
        out.append(Violation(str(path / "requests"), "the requests table is empty"))
    if not out:
        out.extend(_check_joins(path))
        out.extend(_check_unique(path))
    if parts(path, "runs"):  # after the contents: their violations say more than a hash does
        out.extend(Violation(f, message) for f, message in verify(path))
    return out


def _check_unique(trace_dir: Path) -> list[Violation]:
    import pandas as pd

    out = []
    for name, key in UNIQUE_KEYS.items():
        files = parts(trace_dir, name)
        if not files:
            continue
        cols = [pq.read_table(f, columns=list(key)).to_pandas().assign(_part=f.name,
                                                                       _row=lambda d: d.index)
                for f in files]
        rows = pd.concat(cols, ignore_index=True)
        dup = rows[rows.duplicated(list(key), keep="first")]
        if len(dup):
            first = dup.iloc[0]
            ident = ", ".join(f"{k}={first[k]!r}" for k in key)
            out.append(Violation(str(trace_dir / name / first["_part"]),
                                 f"duplicate {ident} ({len(dup)} duplicate rows in {name})",
                                 column=key[-1], row=int(first["_row"])))
    return out


def _check_joins(trace_dir: Path) -> list[Violation]:
    run_ids = set(read_table(trace_dir, "runs", validate=False).column("run_id").to_pylist())
    out = []
    for name in SCHEMAS:
        if name == "runs":
            continue
        for part in parts(trace_dir, name):
            ids = pq.read_table(part, columns=["run_id"]).column("run_id")
            mask = pc.invert(pc.is_in(ids, value_set=pa.array(sorted(run_ids), pa.string())))
            bad = np.flatnonzero(mask.to_numpy(zero_copy_only=False))
            if bad.size:
                out.append(Violation(str(part), f"run_id {ids[int(bad[0])].as_py()!r} not in runs",
                                     column="run_id", row=int(bad[0])))
    return out


def raise_if(violations: Iterable[Violation]) -> None:
    """Raise TraceError listing the violations (first MAX_REPORTED), if any."""
    vs = list(violations)
    if vs:
        more = f" (+{len(vs) - MAX_REPORTED} more)" if len(vs) > MAX_REPORTED else ""
        raise TraceError("; ".join(str(v) for v in vs[:MAX_REPORTED]) + more)


def read_table(trace_dir: str | Path, table: str, validate: bool = True) -> pa.Table:
    """Read one table of a trace directory (all parts), validating each part by default."""
    schema = schema_of(table)
    files = parts(trace_dir, table)
    if not files:
        return schema.empty_table()
    if not validate:
        return pa.concat_tables([pq.read_table(f, schema=schema) for f in files])
    checked = [checked_part(f, table) for f in files]
    raise_if(v for violations, _ in checked for v in violations)
    return pa.concat_tables([data for _, data in checked])


def read_run(trace_dir: str | Path) -> dict[str, Any]:
    """The (single) run row of a trace directory, with params_json decoded as `params`."""
    if not Path(trace_dir).is_dir():
        raise TraceError(f"{trace_dir}: no such trace directory")
    rows = read_table(trace_dir, "runs").to_pylist()
    if len(rows) != 1:
        raise TraceError(f"{trace_dir}: expected one run, found {len(rows)}")
    row = rows[0]
    row["params"] = json.loads(row["params_json"] or "{}")
    return row
