"""The workload type and the config-value checks every workload form shares."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from inputs.limits import MAX_ARRIVAL_S

NO_PREFIX_GROUP = -1
"""prefix_group of a request that shares no prefix"""


@dataclass(frozen=True)
class Workload:
    """Requests to serve, sorted by arrival: plain numpy columns."""

    arrival_s: np.ndarray
    """arrival time of each request (float64 seconds, non-decreasing, starts >= 0)"""
    prompt_tokens: np.ndarray
    """prompt length of each request (int64, >= 1)"""
    output_tokens: np.ndarray
    """tokens to generate for each request (int64, >= 1)"""
    prefix_group: np.ndarray | None = None
    """id of the shared prompt prefix each request starts with (int64), or None: no sharing"""
    prefix_tokens: np.ndarray | None = None
    """length of that shared prefix (int64, 0 <= prefix_tokens <= prompt_tokens); set together
    with prefix_group"""

    def __post_init__(self):
        # Copy into owned, read-only arrays: a frozen workload must not change under the
        # simulator's feet because a caller kept and mutated the array it passed in.
        arrival = owned(self.arrival_s, np.float64, "arrival_s")
        n = len(arrival)
        cols = {"arrival_s": arrival}
        for name in ("prompt_tokens", "output_tokens", "prefix_group", "prefix_tokens"):
            value = getattr(self, name)
            if value is None:
                cols[name] = None
                continue
            col = owned(value, np.int64, name)
            if len(col) != n:
                raise ValueError(f"Workload.{name} has {len(col)} rows, arrival_s has {n}")
            cols[name] = col
        if cols["prompt_tokens"] is None or cols["output_tokens"] is None:
            raise ValueError("Workload needs prompt_tokens and output_tokens")
        if (cols["prefix_group"] is None) != (cols["prefix_tokens"] is None):
            raise ValueError("Workload.prefix_group and prefix_tokens must be given together")
        if n:
            if not np.all(np.isfinite(arrival)):
                raise ValueError(f"Workload.arrival_s row {first_index(~np.isfinite(arrival))} "
                                 "is not finite")
            if arrival[0] < 0:
                raise ValueError(f"Workload.arrival_s starts at {arrival[0]}, must be >= 0")
            if arrival.max() > MAX_ARRIVAL_S:  # latencies would vanish in float precision
                row = first_index(arrival > MAX_ARRIVAL_S)
                raise ValueError(f"Workload.arrival_s row {row} is {arrival[row]!r} s, beyond "
                                 f"{MAX_ARRIVAL_S:.0e} s (latencies would vanish in the clock's "
                                 "precision)")
            if np.any(np.diff(arrival) < 0):
                raise ValueError(f"Workload.arrival_s decreases at row "
                                 f"{first_index(np.diff(arrival) < 0) + 1}: sort by arrival")
            for name in ("prompt_tokens", "output_tokens"):
                if np.any(cols[name] < 1):
                    raise ValueError(f"Workload.{name} row {first_index(cols[name] < 1)} is "
                                     f"{cols[name][first_index(cols[name] < 1)]}, must be >= 1")
            pt = cols["prefix_tokens"]
            if pt is not None:
                bad = (pt < 0) | (pt > cols["prompt_tokens"])
                if np.any(bad):
                    r = first_index(bad)
                    raise ValueError(f"Workload.prefix_tokens row {r} is {pt[r]}, must be in "
                                     f"[0, prompt_tokens={cols['prompt_tokens'][r]}]")
        for name, col in cols.items():
            object.__setattr__(self, name, col)

    def __len__(self) -> int:
        """Number of requests."""
        return len(self.arrival_s)

    def _replace(self, **cols: np.ndarray) -> Workload:
        fields = {"arrival_s": self.arrival_s, "prompt_tokens": self.prompt_tokens,
                  "output_tokens": self.output_tokens, "prefix_group": self.prefix_group,
                  "prefix_tokens": self.prefix_tokens}
        return Workload(**{**fields, **cols})

    def scaled(self, time_scale: float) -> Workload:
        """The same requests with arrival times multiplied by time_scale (0.5 doubles the rate)."""
        time_scale = positive(time_scale, "time_scale")
        return self._replace(arrival_s=self.arrival_s * time_scale)

    def with_output_scale(self, factor: float) -> Workload:
        """The same requests with output_tokens multiplied by factor, rounded, and at least 1."""
        factor = positive(factor, "factor")
        return self._replace(output_tokens=np.maximum(1, np.rint(self.output_tokens * factor)))

    def head(self, n: int) -> Workload:
        """The first n requests (all of them when n >= len)."""
        n = integer(n, "n", minimum=0)
        return Workload(*(None if c is None else c[:n] for c in
                          (self.arrival_s, self.prompt_tokens, self.output_tokens,
                           self.prefix_group, self.prefix_tokens)))


def owned(value: Any, dtype: type, name: str) -> np.ndarray:
    """An array the workload owns, of dtype, checked (no NaN, no silent float truncation)."""
    arr = np.asarray(value)
    if arr.ndim != 1:
        raise ValueError(f"Workload.{name} must be 1-D, has shape {arr.shape}")
    if dtype is np.int64 and arr.size and arr.dtype.kind == "f":
        # Refuse fractional token counts instead of truncating them.
        frac = ~np.isfinite(arr) | (arr != np.round(arr))
        if np.any(frac):
            raise ValueError(f"Workload.{name} row {first_index(frac)} is {arr[first_index(frac)]}, "
                             "not a whole number")
    out = np.array(arr, dtype=dtype, copy=True)
    out.flags.writeable = False
    return out


def first_index(mask: np.ndarray) -> int:
    """The first True index of a mask."""
    return int(np.flatnonzero(mask)[0])




def number(value: Any, key: str) -> float:
    """A config value that must be a finite number."""
    # bool is an int in Python; `rate_per_s: true` is a typo, not 1.0.
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"{key} must be a number, got {value!r}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{key} must be finite, got {value}")
    return value


def positive(value: Any, key: str) -> float:
    """A config value that must be a number > 0."""
    value = number(value, key)
    if value <= 0:
        raise ValueError(f"{key} must be > 0, got {value}")
    return value


def integer(value: Any, key: str, minimum: int | None = None) -> int:
    """A config value that must be a whole number (at least `minimum`)."""
    x = number(value, key)
    if not x.is_integer():
        raise ValueError(f"{key} must be a whole number, got {value!r}")
    n = int(x)
    if minimum is not None and n < minimum:
        raise ValueError(f"{key} must be >= {minimum}, got {n}")
    return n
