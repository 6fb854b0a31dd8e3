"""Host time of an in-process engine loop: what passes between a request's arrival and the step
that first schedules it, outside every step's own duration.

What it charges (measured: docs/measurements/host_time.md; `python benchmarks/host_time.py`
reprints it from any replays):
- each request added between two steps delays the next step (input processing): the first
  added in a gap `add_request_ms`, each further one in the same gap the smaller `add_next_ms`
  (a loop that adds in waves, as a program's, has no gap that added one alone: both come from
  the gaps that added several, `_first_and_next`);
- a request arriving at an idle engine also waits for the loop to wake from its sleep
  (`wake_ms`);
- the gap with nothing added passes between every two steps (`step_gap_ms`), charged with each
  step (folded into the step-time model's constant by `with_step_gap`).
All are fitted from the live runs a calibration is given (`fit_host_ms`) and charged by the
replica at the next step it plans (`sim.engine.replica`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd

from traces.store import read_run, read_table

GAP_CAP_MS = 5.0
"""gaps between steps longer than this are waits for work, not host time"""
GRID_KINDS = ("steps", "spec")
"""runs kinds of step-profiler grids (`trace steps`, `trace spec`): no live loop's gaps"""
WAKE_MIN_IDLE_MS = 1.0
"""an arrival this long after the last step, with nothing unfinished, found the loop asleep
(a program's next request submitted right after a step is not a wake)"""


def _engines(run: Path) -> list[Path]:
    """The run's engine traces: itself where it has steps, and those nested in it (an A1 run's
    draft beside its target at the root; a ToT run's draft and target)."""
    nested = [d for d in sorted(run.iterdir()) if d.is_dir() and (d / "steps").is_dir()]
    return ([run] if (run / "steps").is_dir() else []) + nested


def fit_host_ms(run_dirs: list[str | Path], engine: tuple[str, str] | None = None,
                ) -> HostTimes:
    """The loop's host times from live runs of in-process engines: each run directory is an
    engine trace or holds one per engine (stepped from one loop). 0 where not measurable.
    With `engine` (engine, device), every trace must have run there."""
    bases, firsts, nexts, waits = [], [], [], []
    for run in map(Path, run_dirs):
        engines = _engines(run)
        _check_engines(run, engines, engine)
        steps = pd.concat([read_table(d, "steps").to_pandas() for d in engines])
        reqs = pd.concat([read_table(d, "requests").to_pandas() for d in engines])
        if len(steps) < 2 or reqs.empty:
            continue
        start, end, gap_ms, added = step_gaps(steps, reqs)
        short = (gap_ms < GAP_CAP_MS) & (gap_ms >= 0)
        idle = gap_ms[short & (added == 0)]
        base = float(np.median(idle)) if len(idle) else 0.0
        bases.append(idle)
        firsts.append(gap_ms[short & (added == 1)] - base)
        more = short & (added > 1)
        nexts.append((gap_ms[more] - base, added[more] - 1))
        waits.append(idle_waits_ms(reqs, start, end))
    if sum(map(len, firsts)):
        first_ms = _median(firsts)
        extra = [(g - first_ms) / n for g, n in nexts]
        next_ms = _median(extra) if sum(map(len, extra)) else None
    else:
        first_ms, next_ms = _first_and_next(nexts)
    w = np.concatenate(waits) if waits else np.zeros(0)
    wake_ms = max(float(np.median(w)) - first_ms, 0.0) if len(w) else 0.0
    return HostTimes(first_ms, next_ms, wake_ms, _median(bases))


def _check_engines(run: Path, engines: list[Path], engine: tuple[str, str] | None) -> None:
    """A host-time run holds live engine traces, of `engine` where given."""
    if not engines:
        raise ValueError(f"{run}: no engine trace (a steps table, there or one level down)")
    for d in engines:
        r = read_run(d)
        if r["kind"] == "sim":  # a simulation's gaps are its calibration's host times
            raise ValueError(f"{d}: a simulation's output (runs kind 'sim'); host times come "
                             "from live runs")
        if engine is not None and (r["engine"], r["device"]) != tuple(engine):
            raise ValueError(f"{d}: ran on {r['engine']} on {r['device']}, the calibration's "
                             f"traces on {engine[0]} on {engine[1]}: host times are the "
                             "engine's and the device's")
        if r["kind"] in GRID_KINDS:  # a profiler adds whole cells at once, after set gaps
            raise ValueError(f"{d}: a step grid (runs kind {r['kind']!r}), whose gaps are the "
                             "profiler's; host times come from live runs")


def _first_and_next(nexts: list[tuple[np.ndarray, np.ndarray]]) -> tuple[float, float | None]:
    """The first and each further add's host time where no gap added a single request (a
    program loop submits its requests in waves): a line through the gaps' medians per number
    added, weighted by their counts, where they added two or more different numbers; else the
    gaps' median shared equally by their requests. (0, None) without such gaps."""
    gap_ms = np.concatenate([g for g, _ in nexts]) if nexts else np.zeros(0)
    more = np.concatenate([n for _, n in nexts]) if nexts else np.zeros(0, int)
    if not len(gap_ms):
        return 0.0, None
    counts = np.bincount(more)
    seen = np.flatnonzero(counts)
    medians = np.array([np.median(gap_ms[more == k]) for k in seen])
    if len(seen) < 2:
        share = max(float(medians[0]) / (seen[0] + 1), 0.0)
        return share, share
    next_ms, first_ms = np.polyfit(seen, medians, 1, w=np.sqrt(counts[seen]))
    next_ms = max(float(next_ms), 0.0)
    return max(float(first_ms), 0.0), next_ms


@dataclass(frozen=True)
class HostTimes:
    """What an engine loop spends outside its steps (`fit_host_ms`)."""

    add_request_ms: float
    """the first request added between two steps"""
    add_next_ms: float | None
    """each further one added in the same gap (None: not measured, as the first)"""
    wake_ms: float
    """an idle loop waking for an arrival, before the add"""
    step_gap_ms: float
    """between every two steps"""


def with_step_gap(model, gap_ms: float):
    """The step-time model with `gap_ms` added to every step (its constant term): a simulated
    step lasts from one step's start to the next's when nothing is added."""
    if not gap_ms:
        return model
    if not hasattr(model, "coef_ms"):
        raise ValueError(f"a step gap needs a model with a constant term, not {model.kind!r}")
    c = model.coef_ms
    return replace(model, coef_ms=(c[0] + gap_ms, *c[1:]))


def step_gaps(steps: pd.DataFrame, reqs: pd.DataFrame) -> tuple[np.ndarray, ...]:
    """(start_s, end_s) of each step in time order, and per gap between two steps its length in
    ms and the requests added in it: those that arrived while the previous step ran or in the
    gap after it (the loop adds them there, before the next step starts)."""
    steps = steps.sort_values("start_s")
    start = steps.start_s.to_numpy()
    end = start + steps.duration_ms.to_numpy() / 1e3
    arrivals = np.sort(reqs.arrival_s.to_numpy())
    added = np.searchsorted(arrivals, start[1:]) - np.searchsorted(arrivals, start[:-1])
    return start, end, (start[1:] - end[:-1]) * 1e3, added


def idle_waits_ms(reqs: pd.DataFrame, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Arrival to the next step's start, for requests that arrived alone at an idle loop."""
    a = reqs.arrival_s.to_numpy()
    fin = reqs.finish_s.fillna(np.inf).to_numpy()
    order = np.argsort(a)
    a, fin = a[order], fin[order]
    nxt = np.searchsorted(start, a)  # the first step starting after the arrival
    ok = (nxt > 0) & (nxt < len(start))
    nxt = np.minimum(nxt, len(start) - 1)
    prev_end = end[np.maximum(nxt - 1, 0)]
    asleep = ok & (a - prev_end >= WAKE_MIN_IDLE_MS / 1e3)
    # nothing unfinished that arrived before it (the loop had no work), and no other
    # arrival before its step (one add each)
    busy_before = np.maximum.accumulate(np.concatenate([[-np.inf], fin[:-1]]))
    alone = np.searchsorted(a, start[nxt], side="right") - np.arange(len(a)) == 1
    keep = asleep & (busy_before < a) & alone
    return (start[nxt][keep] - a[keep]) * 1e3


def _median(parts: list[np.ndarray]) -> float:
    v = np.concatenate(parts) if parts else np.zeros(0)
    return max(float(np.median(v)), 0.0) if len(v) else 0.0
