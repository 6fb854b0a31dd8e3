"""A shared machine's speed spells in sampled latency: one speed level per window of time.

Live steps on a shared CPU run at a level that holds for about a second and then moves (spells
of 1.4-1.9x a run's median, `ServingModel.spell_log_quantiles`, measured per `SPELL_S` window
of the calibration's steps over their run's median), and the level itself drifts over minutes
(`run_log_quantiles`: windows over the overall median, drawn once per replica for the run).
Drawing a spell level per replica and window puts the spells inside a run, where they make the
per-request TPOT tail; a run of decode iterations ends at a window's edge so that no run spans
two levels.

Why levels per window rather than per run: docs/measurements/spells.md.
"""

from __future__ import annotations

import math

import numpy as np

SPELL_S = 1.0
"""window over which a shared machine's speed is taken as one level: its spells last about a
second (`python benchmarks/speed_spells.py`, 14 live runs of a full fidelity suite: lag-1
correlation of half-second windows' levels median 0.29, of one-second windows 0.19)"""


class Spells:
    """A replica's speed level per window of simulated time, drawn in window order."""

    __slots__ = ("log_q", "rng", "window_s", "window", "level")

    def __init__(self, log_q: tuple[float, ...], rng: np.random.Generator, window_s: float):
        self.log_q = log_q
        self.rng = rng  # its own generator: the levels do not depend on how many steps drew noise
        self.window_s = window_s
        self.window = -1
        self.level = 1.0

    def at(self, now_s: float) -> float:
        """The level of the window holding `now_s` (every earlier window drawn first, in order,
        so a replica's levels are the same whatever its events)."""
        w = int(now_s // self.window_s)
        while self.window < w:
            self.window += 1
            self.level = math.exp(self.log_q[int(self.rng.integers(len(self.log_q)))])
        return self.level

    def end_s(self) -> float:
        """Where the current window ends."""
        return (self.window + 1) * self.window_s


def speed_levels(model, rng: np.random.Generator | None) -> tuple[float, Spells | None]:
    """A replica's speed level for the run (one draw from the model's `run_log_quantiles`) and
    its spells within the run (seeded by one more draw, where the model has
    `spell_log_quantiles`); (1.0, None) in mean latency."""
    runs = getattr(model, "run_log_quantiles", (0.0,))
    drift = 1.0 if rng is None or len(runs) < 2 else math.exp(runs[int(rng.integers(len(runs)))])
    spells = getattr(model, "spell_log_quantiles", (0.0,))
    if rng is None or len(spells) < 2:
        return drift, None
    return drift, Spells(spells, np.random.default_rng(int(rng.integers(2**63))), SPELL_S)


def fit_speed_levels(run_ids: np.ndarray, start_s: np.ndarray, ratio: np.ndarray,
                 ) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Log quantiles of each SPELL_S window's speed level over the overall one (how far the
    machine's speed moved: a run's level in sampled latency) and over its own run's (the spells
    within a run); levels are medians of actual / predicted, robust to the odd stalled step."""
    import pandas as pd

    from sim.step_time.latency import midpoints

    df = pd.DataFrame({"run": run_ids, "window": (start_s // SPELL_S).astype(int), "r": ratio})
    run_level = df.groupby("run").r.median()
    window_level = df.groupby(["run", "window"]).r.median()
    spells = np.log(window_level.to_numpy()
                    / run_level.loc[window_level.index.get_level_values(0)].to_numpy())
    runs = np.log(window_level.to_numpy() / np.median(ratio))
    return tuple(float(v) for v in np.quantile(runs, midpoints(21))), \
        tuple(float(v) for v in np.quantile(spells, midpoints(21)))
