"""The data contract's checks: a part file's schema and values, a trace directory's tables,
keys, joins and seal; every violation located by file, column and row."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from traces.manifest import MANIFEST, parts, verify
from traces.schema import (ADDED_COLUMNS, COUNT_COLUMNS, ENUM_COLUMNS, META_TABLE, META_VERSION,
                           NOT_ABOVE, ORDERED_TIMES, RANGE_COLUMNS, RUN_PARAMS, SCHEMAS,
                           TIME_COLUMNS, UNIQUE_KEYS, table_version)
from traces.value_checks import directory_violations, part_violations
from traces.violation import Violation

PARTIAL_RE = re.compile(r"^\..+\.partial-\d+$")
"""a hidden sibling an output directory is written into before its rename"""
MAX_REPORTED = 20


class TraceError(ValueError):
    """A trace violates the data contract; the message names file, column and row."""


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
        # a small part decodes faster on this thread than through the pool's hand-offs
        data = _conformed(pf.read(use_threads=pf.metadata.num_rows > 65_536), SCHEMAS[name])
    except Exception as e:  # a footer that parses over pages that do not
        return [Violation(p, f"not a readable Parquet file ({type(e).__name__}: {e})")], None
    out += _value_violations(p, name, data) + part_violations(p, name, data)
    if name == "runs" and data.num_rows != 1:
        out.append(Violation(p, f"runs part must hold exactly one row, has {data.num_rows}"))
    return out, data


def _conformed(data: pa.Table, schema: pa.Schema) -> pa.Table:
    """A part's table in its table's schema (column order, metadata; the columns an older
    version lacks null), as `pq.read_table(path, schema=)` gives it, from the file already
    open: a tiny part's read through the dataset layer costs several times its data."""
    names = set(data.column_names)
    columns = [data.column(f.name) if f.name in names else pa.nulls(data.num_rows, f.type)
               for f in schema]
    return pa.Table.from_arrays(columns, schema=schema)


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
    if name == "runs":
        out += _params_violations(p, data)
    return out + _range_violations(p, name, data)


def _params_violations(p: str, data: pa.Table) -> list[Violation]:
    """Each run's params_json: a JSON object holding what its kind's readers look up
    (`RUN_PARAMS`)."""
    import json

    out = []
    kinds = data.column("kind").to_pylist()
    # a nested run (one engine of a two-engine trace) holds its engine's parameters alone
    nested = (Path(p).parent.parent.parent / "runs").is_dir()
    for r, text in enumerate(data.column("params_json").to_pylist()):
        try:
            params = json.loads(text or "{}")
        except json.JSONDecodeError as e:
            out.append(Violation(p, f"not JSON ({e})", column="params_json", row=r))
            continue
        if not isinstance(params, dict):
            out.append(Violation(p, f"not a JSON object ({type(params).__name__})",
                                 column="params_json", row=r))
            continue
        for key, what in ({} if nested else RUN_PARAMS.get(kinds[r], {})).items():
            problem = _param_problem(params, key.lstrip("?"), what, key.startswith("?"))
            if problem:
                out.append(Violation(p, f"{key.lstrip('?')} {problem} (a {kinds[r]} run's "
                                        "readers need it)", column="params_json", row=r))
    return out


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v)


_PARAM_CHECKS = {
    "count": (lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1,
              "a whole number >= 1"),
    "whole": (lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0,
              "a whole number >= 0"),
    "object": (lambda v: isinstance(v, dict), "an object"),
    "numbers": (lambda v: isinstance(v, dict) and all(
        _number(x) or isinstance(x, (bool, list)) or x is None for x in v.values()),
        "an object of numbers"),
    "counts": (lambda v: isinstance(v, list) and v and all(
        _PARAM_CHECKS["count"][0](x) for x in v), "a list of whole numbers >= 1"),
    "fractions": (lambda v: isinstance(v, list) and v and all(
        _number(x) and 0 <= x <= 1 for x in v), "a list of numbers in [0, 1]"),
    "names": (lambda v: isinstance(v, list) and v and all(isinstance(x, str) for x in v),
              "a list of names"),
}


def _param_problem(params: dict, key: str, what: str, optional: bool) -> str | None:
    """What is wrong with dotted `key` of `params` as `what` (None: nothing)."""
    node = params
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return None if optional else "missing"
        node = node[part]
    ok, expected = _PARAM_CHECKS[what]
    return None if ok(node) else f"is {_json_text(node)}, expected {expected}"


def _json_text(v) -> str:
    """A value as JSON text, cut to 40 characters."""
    import json

    text = json.dumps(v)
    return text if len(text) <= 40 else text[:37] + "..."


def _numbers(data: pa.Table, col: str) -> np.ndarray:
    return data.column(col).to_numpy(zero_copy_only=False).astype(float)  # nulls -> nan


def _range_violations(p: str, name: str, data: pa.Table) -> list[Violation]:
    """Numbers outside their physical range (`RANGE_COLUMNS`), counts above their bound
    (`NOT_ABOVE`)."""
    out: list[Violation] = []
    for col, (low, high) in RANGE_COLUMNS.get(name, {}).items():
        v = _numbers(data, col)
        valid = ~data.column(col).is_null().to_numpy(zero_copy_only=False)
        with np.errstate(invalid="ignore"):
            bad = np.flatnonzero(valid & ~((v >= low) & (v <= high)))  # NaN fails too
        if bad.size:
            out.append(Violation(p, f"{v[bad[0]]:g} outside [{low:g}, {high:g}] ({bad.size} "
                                    "rows)", column=col, row=int(bad[0])))
    for col, bound in NOT_ABOVE.get(name, ()):
        v, limit = _numbers(data, col), _numbers(data, bound)
        with np.errstate(invalid="ignore"):
            bad = np.flatnonzero(v > limit)
        if bad.size:
            out.append(Violation(p, f"{col} {v[bad[0]]:g} > {bound} {limit[bad[0]]:g} "
                                    f"({bad.size} rows)", column=col, row=int(bad[0])))
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
        out.extend(directory_violations(path))  # the readers' `trace_violations`
    if parts(path, "runs"):  # after the contents: their violations say more than a hash does
        out.extend(Violation(f, message) for f, message in verify(path))
    return out


_CHECKED: dict[Path, tuple] = {}
"""per trace directory read in this process: the state of its files when its checks passed"""


def check_sealed_once(trace_dir: str | Path) -> None:
    """Refuse (TraceError) a sealed directory whose bytes changed since it was sealed: a reader
    must not compute from them. Once per state of its files in a process (a reader reads a
    trace many times); an unsealed one is `traces check`'s to judge."""
    path = Path(trace_dir).resolve()
    if not (path / MANIFEST).exists():
        return
    state = tuple(sorted((str(f), s.st_mtime_ns, s.st_size) for f in path.rglob("*")
                         if f.is_file() for s in (f.stat(),)))
    if _CHECKED.get(path) != state:
        raise_if(Violation(f, m) for f, m in verify(path))
        _CHECKED[path] = state


def key_violations(trace_dir: Path, name: str, data: pa.Table) -> list[Violation]:
    """A table as read whole: a key that repeats (`UNIQUE_KEYS`), a row of a run the
    directory's runs table does not hold."""
    out = []
    key = UNIQUE_KEYS.get(name)
    repeats = _repeats(data, key) if key else None
    if repeats is not None:
        first, _, keys = repeats
        out.append(Violation(str(trace_dir / name), f"duplicate {_ident(data, key, first)} "
                             f"({keys} keys repeat in {name})", column=key[-1]))
    if name != "runs" and data.num_rows:
        runs = {i for f in parts(trace_dir, "runs")
                for i in pq.read_table(f, columns=["run_id"]).column("run_id").to_pylist()}
        other = set(pc.unique(data["run_id"]).to_pylist()) - runs
        if other:
            out.append(Violation(str(trace_dir / name), f"run_id {sorted(other)[0]!r} not in "
                                 "runs", column="run_id"))
    return out


def _repeats(data: pa.Table, key: tuple) -> tuple[int, int, int] | None:
    """Rows whose key an earlier row has: (the first such row, how many rows, how many keys
    repeat); None where every key is its own. One rule for `traces check` and the readers."""
    n = data.num_rows
    if n < 2:
        return None
    # a stable sort keeps each key's rows in table order: a row after its key's first repeats it
    order = pc.sort_indices(data.select(list(key)), [(k, "ascending") for k in key]).to_numpy()
    t = data.select(list(key)).take(order)
    same = np.ones(n - 1, dtype=bool)
    for k in key:
        same &= pc.fill_null(pc.equal(t[k].slice(1), t[k].slice(0, n - 1)), False).to_numpy(
            zero_copy_only=False)
    if not same.any():
        return None
    starts = same & ~np.concatenate(([False], same[:-1]))  # a key's first repeat
    return int(order[1:][same].min()), int(same.sum()), int(starts.sum())


def _ident(data: pa.Table, key: tuple, row: int) -> str:
    """A row's key as `name=value` pairs."""
    values = data.select(list(key)).slice(row, 1).to_pylist()[0]
    return ", ".join(f"{k}={values[k]!r}" for k in key)


def _check_unique(trace_dir: Path) -> list[Violation]:
    out = []
    for name, key in UNIQUE_KEYS.items():
        files = parts(trace_dir, name)
        if not files:
            continue
        tables = [pq.read_table(f, columns=list(key)) for f in files]
        data = pa.concat_tables(tables)
        repeats = _repeats(data, key)
        if repeats is None:
            continue
        first, rows, _ = repeats
        starts = np.cumsum([0] + [t.num_rows for t in tables])
        i = int(np.searchsorted(starts, first, side="right")) - 1  # the part it is in
        out.append(Violation(str(files[i]), f"duplicate {_ident(data, key, first)} ({rows} "
                             f"duplicate rows in {name})", column=key[-1],
                             row=first - int(starts[i])))
    return out


def _check_joins(trace_dir: Path) -> list[Violation]:
    run_ids = {i for f in parts(trace_dir, "runs")
               for i in pq.read_table(f, columns=["run_id"]).column("run_id").to_pylist()}
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
