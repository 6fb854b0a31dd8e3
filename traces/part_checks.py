"""One part file's checks: its schema against its table's, its values row by row (nulls,
times, counts, enums, ranges, a run's parameters) and against each other within the part
(`traces.value_checks`); `checked_parts` reads a table's parts and checks their values at once
where every check reads one row at a time."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from traces.schema import (ADDED_COLUMNS, COUNT_COLUMNS, ENUM_COLUMNS, META_TABLE, META_VERSION,
                           NOT_ABOVE, ORDERED_TIMES, RANGE_COLUMNS, RUN_PARAMS, SCHEMAS,
                           TIME_COLUMNS, table_version)
from traces.value_checks import part_violations
from traces.violation import Violation

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
    out, data, name = _read_part(Path(path), table)
    if data is None:
        return out, None
    return out + _values_violations(str(path), name, data), data


PART_WISE = ("runs", "steps")
"""tables whose part checks read more than a row at a time (a run's nesting, from its path;
steps in their order within a part)"""


def checked_parts(files: list, table: str) -> tuple[list[Violation], pa.Table | None]:
    """(every violation of a table's parts, their rows as read, in one table): each part's
    schema checked and the values of all checked at once where every check reads one row at a
    time (else, or where that finds any, part by part, as `checked_part` reports them)."""
    if table in PART_WISE:
        checked = [checked_part(f, table) for f in files]
        out = [v for violations, _ in checked for v in violations]
        return out, None if out else pa.concat_tables([d for _, d in checked])
    datas, out, known = [], [], None
    for f in files:
        violations, data, _ = _read_part(Path(f), table, known)
        out += violations
        datas.append(data)
        if data is not None and not violations:
            known = data.schema
    if out:
        return out, None
    data = pa.concat_tables(datas)
    if _values_violations("", table, data):  # found again, part by part
        out = [v for f, d in zip(files, datas) for v in _values_violations(str(f), table, d)]
    return out, None if out else data


def _read_part(path: Path, table: str | None, known: pa.Schema | None = None
               ) -> tuple[list[Violation], pa.Table | None, str | None]:
    """(a part's schema's violations, its rows in its table's schema, the table's name);
    a schema equal to `known` (a part's already checked) is not checked again."""
    p = str(path)
    try:
        pf = pq.ParquetFile(path)
    except Exception as e:  # unreadable bytes: one clear violation, not a stack trace
        return [Violation(p, f"not a readable Parquet file ({type(e).__name__}: {e})")], None, \
            None
    schema = pf.schema_arrow
    name = table or _table_name_of(path, schema)
    if name not in SCHEMAS:
        return [Violation(p, f"cannot tell which table this is (metadata {META_TABLE.decode()!r} "
                             f"missing and folder {path.parent.name!r} is not a table name)")], \
            None, None
    if known is None or not schema.equals(known, check_metadata=True):
        out = _schema_violations(p, name, schema)
        if out:
            return out, None, name
    try:
        # a small part decodes faster on this thread than through the pool's hand-offs
        data = _conformed(pf.read(use_threads=pf.metadata.num_rows > 65_536), SCHEMAS[name])
    except Exception as e:  # a footer that parses over pages that do not
        return [Violation(p, f"not a readable Parquet file ({type(e).__name__}: {e})")], None, \
            name
    return [], data, name


def _values_violations(p: str, name: str, data: pa.Table) -> list[Violation]:
    """A part's values, each row's and the part's rows against each other."""
    out = _value_violations(p, name, data) + part_violations(p, name, data)
    if name == "runs" and data.num_rows != 1:
        out.append(Violation(p, f"runs part must hold exactly one row, has {data.num_rows}"))
    return out


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


