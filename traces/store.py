"""Reading and writing trace directories: crash-safe part files, resume, validated reads.

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
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from traces.checks import TraceError, check_sealed_once, key_violations, raise_if
from traces.manifest import parts, seal as seal_dir, unseal
from traces.part_checks import checked_parts
from traces.schema import schema_of
from traces.value_checks import trace_violations

_UNIT_RE = re.compile(r"^[A-Za-z0-9_.=-]+$")


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
            v = columns[field.name]
            v = v.cast(field.type) if isinstance(v, (pa.Array, pa.ChunkedArray)) else pa.array(
                v, type=field.type)
            if field.nullable and pa.types.is_floating(field.type) and v.null_count < len(v):
                # NaN in a nullable column means none (a request aborted before it was
                # scheduled): stored as null, which the checks allow; a NaN time they refuse
                v = pc.if_else(pc.is_nan(v), pa.scalar(None, field.type), v)
            arrays.append(v)
        elif field.nullable:
            arrays.append(pa.nulls(n, type=field.type))
        else:
            raise TraceError(f"{name}: missing required column {field.name!r}")
    return pa.Table.from_arrays(arrays, schema=schema)


def _params_differ(old: str, new: str) -> str:
    """Where two runs' parameters differ, by key path (the first three), not the whole blobs."""
    def leaves(v, path: str = "") -> dict:
        if isinstance(v, dict) and v:
            return {k: x for key, sub in v.items()
                    for k, x in leaves(sub, f"{path}.{key}" if path else str(key)).items()}
        return {path or "(all)": v}

    try:
        a, b = leaves(json.loads(old or "{}")), leaves(json.loads(new or "{}"))
    except ValueError:
        return f"trace has {old!r}, now {new!r}"
    keys = sorted(k for k in set(a) | set(b) if a.get(k, ...) != b.get(k, ...))
    return "; ".join(f"{k}: trace has {a.get(k, '(none)')!r}, now {b.get(k, '(none)')!r}"
                     for k in keys[:3]) + (f"; {len(keys) - 3} more" if len(keys) > 3 else "")


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
                    what = (_params_differ(old[key], run[key]) if key == "params_json" else
                            f"trace has {old[key]!r}, now {run[key]!r}")
                    raise TraceError(f"{runs_part}: cannot resume: {key} differs ({what})")
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


# ---------------------------------------------------------------- reading

def read_table(trace_dir: str | Path, table: str, validate: bool = True) -> pa.Table:
    """Read one table of a trace directory (all parts), validating each part by default."""
    schema = schema_of(table)
    files = parts(trace_dir, table)
    if not files:
        return schema.empty_table()
    if not validate:
        return pa.concat_tables([pq.read_table(f, schema=schema) for f in files])
    violations, data = checked_parts(files, table)
    raise_if(violations)
    raise_if(key_violations(Path(trace_dir), table, data)
             + trace_violations(Path(trace_dir), table, data))
    return data


def read_run(trace_dir: str | Path) -> dict[str, Any]:
    """The (single) run row of a trace directory, with params_json decoded as `params`."""
    if not Path(trace_dir).is_dir():
        raise TraceError(f"{trace_dir}: no such trace directory")
    rows = read_table(trace_dir, "runs").to_pylist()
    if len(rows) != 1:
        raise TraceError(f"{trace_dir}: expected one run, found {len(rows)}")
    check_sealed_once(trace_dir)
    row = rows[0]
    try:
        row["params"] = json.loads(row["params_json"] or "{}")
    except json.JSONDecodeError as e:
        raise TraceError(f"{trace_dir}: runs.params_json is not JSON ({e})") from None
    if not isinstance(row["params"], dict):
        raise TraceError(f"{trace_dir}: runs.params_json is not a JSON object")
    return row
