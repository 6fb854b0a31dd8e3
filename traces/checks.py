"""The data contract's checks: a trace directory's tables, keys, joins and seal (a part file's
own: `traces.part_checks`); every violation located by file, column and row."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from traces.manifest import MANIFEST, parts, verify
from traces.part_checks import check_file
from traces.schema import SCHEMAS, UNIQUE_KEYS
from traces.value_checks import directory_violations
from traces.violation import Violation

PARTIAL_RE = re.compile(r"^\..+\.partial-\d+$")
"""a hidden sibling an output directory is written into before its rename"""
MAX_REPORTED = 20


class TraceError(ValueError):
    """A trace violates the data contract; the message names file, column and row."""


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
