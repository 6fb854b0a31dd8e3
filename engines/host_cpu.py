"""The kernel's count of CPU ticks: how much of a traced run the hypervisor gave to other guests.

On a virtual machine `/proc/stat` counts `steal`, the ticks a virtual CPU was ready to run and
the host ran someone else. A live run's slow spells (steps at 2-6x their price for seconds)
follow it ([record](../docs/measurements/2026-12-03-heldout-reference-and-steal.md)): with both
virtual CPUs stepping one forward pass, a tick stolen from either stalls the step. The step
recorder samples the ticks about once a second into the `host_cpu` table, so any span of a
run's steps has its stolen share.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

STAT_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
"""the `cpu` line's first fields, in the kernel's order (guest time is inside user already)"""
SAMPLE_S = 1.0
"""seconds between two samples of a recorded run (one read of a short file: ~20 us)"""
STEAL_WEIGHT = 2.0
"""how much a live run's time-weighted step level rises per stolen share over its median (22
live runs on a 2-core VM: both virtual CPUs step one forward pass, a tick stolen from either
stalls it)"""


def stall_share(steal: float | None) -> float:
    """The share of a run's time its host's steal adds to its steps (`STEAL_WEIGHT` times the
    stolen share; 0 unmeasured): beside a latency tolerance, whether the host alone moved it."""
    return STEAL_WEIGHT * (steal or 0.0)


def cpu_ticks(stat: Path = Path("/proc/stat")) -> tuple[int, int] | None:
    """(stolen ticks, ticks in every state) of all CPUs since boot; None where the kernel
    counts none (not Linux, or a kernel without steal accounting)."""
    try:
        fields = stat.read_text().split("\n", 1)[0].split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu" or len(fields) <= len(STAT_FIELDS):
        return None
    ticks = [int(x) for x in fields[1:1 + len(STAT_FIELDS)]]
    return ticks[-1], sum(ticks)


def stolen_share(samples: pd.DataFrame, start_s: float | None = None,
                 end_s: float | None = None) -> float | None:
    """Stolen share of all ticks between the first sample at or after start_s and the last at
    or before end_s (a `host_cpu` table's rows of one recorder); None with fewer than two
    samples there or no tick counted."""
    t = samples.at_s.to_numpy(float)
    keep = (t >= (-np.inf if start_s is None else start_s)) & (
        t <= (np.inf if end_s is None else end_s))
    s = samples[keep].sort_values("at_s")
    if len(s) < 2:
        return None
    ticks = int(s.cpu_ticks.iloc[-1] - s.cpu_ticks.iloc[0])
    if ticks <= 0:
        return None
    return float((s.steal_ticks.iloc[-1] - s.steal_ticks.iloc[0]) / ticks)


def trace_stolen_share(trace_dir: str | Path) -> float | None:
    """The stolen share over a trace's `host_cpu` samples (its first replica's: every replica
    of a machine shares its CPUs); None where it has fewer than two."""
    from traces.store import read_table

    samples = read_table(trace_dir, "host_cpu").to_pandas()
    if not len(samples):
        return None
    return stolen_share(samples[samples.replica_id == samples.replica_id.min()])
