"""Vidur benchmark traces: a Poisson trace from a lengths CSV, reading ours, writing Vidur's form.

Split from `vidur_runner.py` (which drives Vidur in its own venv); plain csv/numpy, no Vidur.
"""

from __future__ import annotations

import csv
import math
import sys
from pathlib import Path

TRACE_DATE = "2023-08-21"
"""the `Date` every row of Vidur's trace-replay CSV carries (and the runner selects)"""


def make_poisson_trace(lengths_csv: Path, out_csv: Path, n: int, rate: float, seed: int) -> None:
    """Lengths of the first n rows of a Vidur trace CSV, Poisson arrivals (numpy default_rng(seed),
    exponential gaps of mean 1/rate, first arrival after one gap)."""
    import numpy as np

    with open(lengths_csv, newline="") as f:
        rows = [r for _, r in zip(range(n), csv.DictReader(f))]
    if len(rows) < n:
        sys.exit(f"vidur_runner: {lengths_csv} has only {len(rows)} rows, {n} asked")
    arrivals = np.cumsum(np.random.default_rng(seed).exponential(1.0 / rate, size=n))
    out_csv.parent.mkdir(parents=True, exist_ok=True)
    with open(out_csv, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["arrived_at", "num_prefill_tokens", "num_decode_tokens"])
        for t, r in zip(arrivals, rows):
            w.writerow([repr(float(t)), int(r["num_prefill_tokens"]), int(r["num_decode_tokens"])])
    print(f"[vidur_runner] wrote {out_csv}: {n} requests, Poisson {rate}/s, seed {seed}, "
          f"lengths from {lengths_csv}", file=sys.stderr, flush=True)


def read_trace(path: Path) -> list[tuple[float, int, int]]:
    want = ("arrived_at", "num_prefill_tokens", "num_decode_tokens")
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        if reader.fieldnames is None or any(c not in reader.fieldnames for c in want):
            sys.exit(f"vidur_runner: {path}: need columns {','.join(want)}, got {reader.fieldnames}")
        out = []
        for i, r in enumerate(reader, start=2):
            try:
                t, p, d = float(r[want[0]]), int(r[want[1]]), int(r[want[2]])
            except (TypeError, ValueError):
                sys.exit(f"vidur_runner: {path}: line {i}: not numbers: {r}")
            if not math.isfinite(t) or t < 0 or p < 1 or d < 1:
                # Vidur would clip token counts below 1: refuse rather than replay inexactly
                sys.exit(f"vidur_runner: {path}: line {i}: need arrived_at >= 0 and token counts >= 1")
            out.append((t, p, d))
    if not out:
        sys.exit(f"vidur_runner: {path}: no requests")
    return out


def write_vidur_trace(trace: list[tuple[float, int, int]], path: Path) -> None:
    """The form vidur 0.0.26's TraceReplayRequestGenerator reads."""
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["Date", "Time", "PromptTokenCount", "CompletionTokenCount"])
        for t, p, d in trace:
            w.writerow([TRACE_DATE, repr(t), p, d])
