"""A shared machine's speed spells in sampled latency: one speed level per window of time.

Live steps on a shared CPU run at a level that holds for about a second and then moves (spells
of 1.4-1.9x a run's median), and the level itself drifts over minutes. A calibration's step
residual (actual over predicted) is taken in two parts: its `SPELL_S` window's level over all
its steps' median (`ServingModel.spell_log_quantiles`: spells and drift alike) and the step's
own noise within its window (`step_log_quantiles`; a serving prefill step's apart,
`prefill_log_quantiles`: prefill steps scatter two to three times as wide as decode steps, and
drawn from every step's noise a simulated TTFT tail came out too narrow). Sampled latency draws
a level per replica and window and each step's own noise, so each part of the variance counts
once and a sampled step's mean is about the mean run's; the spells sit inside a run, where they
make the per-request TPOT tail, and a run of decode iterations ends at a window's edge so that
no run spans two levels. Calibrations fitted before the split draw their whole residual per
step, a run level per replica (`run_log_quantiles`) and spells over it.

Why levels per window rather than per run: docs/measurements/spells.md; why in two parts:
docs/measurements/2026-11-30-noise-parts.md.
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
                     quantiles: int = 100) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Log quantiles of each step's SPELL_S window's speed level over all steps' (the levels
    sampled latency draws per window; taken per step, so that a window of few long steps, often
    a shape the model misprices rather than the machine's speed, weighs as little as its steps)
    and of each step's own noise (`window_parts`, drawn per step: the two multiply back to its
    ratio)."""
    return part_quantiles(*window_parts(run_ids, start_s, ratio), quantiles)


def part_quantiles(levels: np.ndarray, own: np.ndarray, quantiles: int = 100,
                   ) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """`fit_speed_levels`'s log quantiles from `window_parts`' per-step parts."""
    from sim.step_time.latency import midpoints

    return tuple(float(v) for v in np.quantile(levels, midpoints(21))), \
        tuple(float(v) for v in np.quantile(own, midpoints(quantiles)))


def window_parts(run_ids: np.ndarray, start_s: np.ndarray, ratio: np.ndarray,
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Per step, the log of its SPELL_S window's speed level over all steps' and of its ratio
    over its window's level, times all steps' (its own noise); levels are medians of actual /
    predicted, robust to the odd stalled step."""
    import pandas as pd

    df = pd.DataFrame({"run": run_ids, "window": (start_s // SPELL_S).astype(int),
                       "r": np.log(ratio)})
    every = float(df.r.median())
    level = df.groupby(["run", "window"]).r.transform("median").to_numpy()
    return level - every, df.r.to_numpy() - level + every


def step_noise(model, sampled: bool) -> tuple[tuple[float, ...], float, float]:
    """The log quantiles a step's residual factor is drawn from, and the factor's mean and std:
    in sampled latency a model's own-noise quantiles (`step_log_quantiles`) where it has them,
    else, and in mean latency, its residuals."""
    q = (getattr(model, "step_log_quantiles", ()) if sampled else ()) or \
        model.residual_log_quantiles
    e = np.exp(np.asarray(q, float))
    return tuple(q), float(e.mean()), float(e.std())


def prefill_noise(model, sampled: bool) -> tuple[float, ...]:
    """The log quantiles a prefill step's residual factor is drawn from in sampled latency: the
    model's prefill steps' own noise (`prefill_log_quantiles`) where it has them, taken at as
    many midpoints as `step_noise`'s (one draw of one generator either way), else
    `step_noise`'s."""
    q = step_noise(model, sampled)[0]
    own = getattr(model, "prefill_log_quantiles", ()) if sampled else ()
    if not own:
        return q
    if len(own) == len(q):
        return tuple(own)
    from sim.step_time.latency import midpoints

    return tuple(float(v) for v in np.quantile(np.asarray(own, float), midpoints(len(q))))
