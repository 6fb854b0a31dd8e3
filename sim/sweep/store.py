"""A sweep's results directory: one Parquet file per finished (point, seed), and their table.

    DIR/points/<point_id>-s<seed>.parquet   one row, written by the worker that simulated it
    DIR/results.parquet                     the sweep's rows in sweep order (rebuilt at the end)
    DIR/sweep.json                          the sweep that last wrote results.parquet

A point file is written to a hidden temporary name and renamed into place, so it is complete or
absent: a killed worker or driver loses only the points still running, and a re-run computes
exactly the missing ones. Point files are content-addressed (`sim.sweep.spec.point_hash`), so
sweeps sharing a directory share the points they have in common.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from sim.sweep.spec import Point, Sweep

DROPPED = {"wall_s", "event_loop_s"}  # host timings: not a function of the point


def point_path(out_dir: Path, point_id: str, seed: int) -> Path:
    """Where the row of (point, seed) lives."""
    return Path(out_dir) / "points" / f"{point_id}-s{seed}.parquet"


def flatten(summary: dict, prefix: str = "") -> dict:
    """A summary's scalars with nested keys joined by '.' ({ttft_s: {p90}} -> ttft_s.p90);
    lists are kept as JSON text."""
    out = {}
    for k, v in summary.items():
        if not prefix and k in DROPPED:
            continue
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}."))
        elif isinstance(v, (list, tuple)):
            out[f"{prefix}{k}"] = json.dumps(v)
        else:
            out[f"{prefix}{k}"] = v
    return out


def write_point(path: Path, rows: list[dict]) -> None:
    """Write a point's rows atomically (temporary name, then rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{os.getpid()}.tmp"
    # every key of any row (a family section's policies may report keys of their own):
    # pyarrow takes its columns from the first row and would drop the others' silently
    keys = dict.fromkeys(k for r in rows for k in r)
    pq.write_table(pa.Table.from_pylist([{k: r.get(k) for k in keys} for r in rows]), tmp)
    os.replace(tmp, path)


def missing(out_dir: Path, points: list[Point]) -> list[Point]:
    """The points with no row on disk."""
    return [p for p in points if not point_path(out_dir, p.point_id, p.seed).exists()]


def collect(out_dir: Path, sweep: Sweep, points: list[Point]) -> pd.DataFrame:
    """The sweep's rows in sweep order: position, overrides, seed, then the point's rows (one;
    a family section's: one per policy)."""
    rows = []
    for p in points:
        ov = {("case" if k == "name" else k): (json.dumps(v, sort_keys=True)
                                                if isinstance(v, (dict, list)) else v)
              for k, v in p.overrides}
        for row in pq.read_table(point_path(out_dir, p.point_id, p.seed)).to_pylist():
            rows.append({"index": p.index, **ov, "seed": p.seed, **row})
    df = pd.DataFrame(rows)
    for col in df.columns:  # a column mixing text and numbers is stored as text
        kinds = {type(v) for v in df[col] if v is not None and v == v}
        if str in kinds and len(kinds) > 1:
            df[col] = df[col].map(lambda v: None if v is None else str(v))
    return df


def sweep_json(sweep: Sweep) -> str:
    """The sweep as `sweep.json` holds it."""
    spec = {"base": sweep.base, "base_dir": str(sweep.base_dir), "grid": sweep.grid,
            "cases": sweep.cases, "seeds": sweep.seeds, "seed_key": sweep.seed_key}
    return json.dumps(spec, indent=1, default=str) + "\n"


def check_same_sweep(out_dir: Path, sweep: Sweep) -> None:
    """Refuse a directory whose results belong to another sweep (they would be replaced); the
    same sweep again resumes it."""
    held = Path(out_dir) / "sweep.json"
    if held.exists() and held.read_text() != sweep_json(sweep):
        raise ValueError(f"{out_dir}: holds the results of another sweep (its sweep.json "
                         "differs); choose another output directory")
    if not held.exists() and Path(out_dir).is_dir():
        # a sweep killed before its first results holds only points; anything else is not ours
        other = sorted(p.name for p in Path(out_dir).iterdir()
                       if p.name != "points" and not p.name.startswith("."))
        if other:
            raise ValueError(f"{out_dir}: holds {other[0]!r}, not a sweep's output; choose an "
                             "empty or new directory")


def write_results(out_dir: Path, sweep: Sweep, df: pd.DataFrame) -> Path:
    """results.parquet and sweep.json, each replaced whole."""
    out_dir = Path(out_dir)
    path = out_dir / "results.parquet"
    tmp = out_dir / f".results.parquet.{os.getpid()}.tmp"
    pq.write_table(pa.Table.from_pandas(df, preserve_index=False), tmp)
    os.replace(tmp, path)
    (out_dir / "sweep.json").write_text(sweep_json(sweep))
    return path


def read_results(out_dir: str | Path) -> pd.DataFrame:
    """A finished sweep's results table."""
    path = Path(out_dir) / "results.parquet"
    if not path.exists():
        raise ValueError(f"{out_dir}: no results.parquet (run the sweep first)")
    return pq.read_table(path).to_pandas()
