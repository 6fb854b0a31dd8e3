"""Seed statistics: a metric's mean over seeds with a Student-t confidence interval."""

from __future__ import annotations

import numpy as np
import pandas as pd
from scipy import stats

LEVEL = 0.95


def mean_ci(values, level: float = LEVEL) -> tuple[float, float, float]:
    """(mean, lo, hi) of a sample; one value, or identical values, give a zero-width interval."""
    v = np.asarray([x for x in values if x is not None and x == x], dtype=float)
    if v.size == 0:
        return float("nan"), float("nan"), float("nan")
    m = float(v.mean())
    if v.size < 2 or np.all(v == v[0]):
        return m, m, m
    half = float(stats.t.ppf(0.5 + level / 2, v.size - 1) * v.std(ddof=1) / np.sqrt(v.size))
    return m, m - half, m + half


def by_point(df: pd.DataFrame, metrics: list[str], level: float = LEVEL) -> pd.DataFrame:
    """One row per point (its overrides) with `metric`, `metric.lo`, `metric.hi` over seeds."""
    missing = [m for m in metrics if m not in df.columns]
    if missing:
        raise ValueError(f"no such metric in the results: {missing} "
                         f"(have: {sorted(c for c in df.columns if c not in _KEYS)[:12]} ...)")
    if text := [m for m in metrics if not pd.api.types.is_numeric_dtype(df[m])]:
        raise ValueError(f"metric {text[0]}: not a number per run (a mean over seeds needs "
                         "one); the results hold it: " + str(df[text[0]].iloc[0]))
    # a family section's point (HELIOS) has a row per policy and seed: each policy its own row
    per_policy = "policy" in df.columns and df.groupby("point_id").policy.nunique().max() > 1
    series = ["policy"] if per_policy else []
    keys = override_columns(df) + series
    rows = []
    for _, g in df.groupby(["point_id"] + series, sort=False, dropna=False):
        row = {k: g[k].iloc[0] for k in keys} | {"point_id": g.point_id.iloc[0],
                                                 "seeds": len(g)}
        for m in metrics:
            row[m], row[f"{m}.lo"], row[f"{m}.hi"] = mean_ci(g[m], level)
        rows.append(row)
    return pd.DataFrame(rows)


_KEYS = {"index", "seed", "point_id", "calibration"}


def override_columns(df: pd.DataFrame) -> list[str]:
    """The columns that name a point's overrides (between `index` and `seed`)."""
    cols = list(df.columns)
    return cols[cols.index("index") + 1:cols.index("seed")]
