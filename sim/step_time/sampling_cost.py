"""The step time that seeded sampling adds, fitted from a grid's greedy and seeded cells.

vLLM samples a request that carries a seed with a generator of its own (a draw over the
vocabulary per such request, beside the batch's), and top-p sorts the batch's probabilities:
`trace steps --regimes greedy,seeded` measured +5% a decode step at 1 sequence and +6% at 8 on the
2-core EPYC VM (target-large, 2.42 -> 2.54 ms and 2.94 -> 3.11 ms). Programs sample that way
(Dynasor's chunks and probes: temperature, a seed per request), so a greedy calibration runs their
steps fast. The term is `per_step_ms + per_seq_ms * seeded_seqs` for a step with any seeded
sequence sampling a token, fitted (non-negative, Huber) on what the grid's seeded steps take
beyond the same steps of the same cell run greedy just before (same shape, same machine speed:
a fit against the step-time model instead drowned the 0.1-0.3 ms in the model's own error and
found half of it); `calibrate` then takes it out of their durations, so one calibration serves
greedy and program traffic. The engine recorder counts each step's seeded sequences
(`step_seeded`), so live program replays' steps are priced, and taken apart, as well; traces
recorded before that say it only through a grid cell's regime.
The grid's seeded regimes sample without top-p, as Dynasor's reasoning chunks and
self-consistency's branches do: top-p below 1 filters the whole batch and costs several times
the seeded term, so a term fitted on a regime with top-p overprices the reasoning steps
(`docs/measurements/2026-11-27-sampling-cost.md`); the probes' few steps with top-p are priced
as seeded alone.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from sim.step_time.logprob_cost import robust_nonnegative_fit
from traces import read_table
from traces.ids import cell_regime

MIN_STEPS = 20
"""seeded steps with a greedy twin the fit needs"""


def attach_seeded(steps: pd.DataFrame, runs: list[dict],
                  trace_dirs: list[str | Path] = ()) -> pd.DataFrame:
    """The steps with `seeded_seqs` (sequences of the step that sample with a seed: as the
    engine counted them in `step_seeded` for runs that recorded it, else every sequence of a
    grid cell whose regime seeds; 0 elsewhere) and `greedy_twin_ms`: the duration of the same
    step of the cell's greedy run, where it has one of the same shape (NaN else)."""
    seeded_cells = {}
    for run in runs:
        regimes = (run["params"].get("sampling") or {}).get("regimes") or {}
        seeded_cells[run["run_id"]] = {name for name, r in regimes.items() if r.get("seeded")}
    cells = steps.cell_id.fillna("")
    regime = [cell_regime(c) for c in cells]
    seeds = [bool(seeded_cells.get(run)) and g in seeded_cells[run]
             for run, g in zip(steps.run_id, regime)]
    seqs = (steps.decode_seqs + steps.prefill_seqs).to_numpy()
    out = steps.assign(seeded_seqs=np.where(seeds, seqs, 0).astype(np.int64))
    recorded = pd.concat([read_table(d, "step_seeded").to_pandas() for d in trace_dirs]) \
        if trace_dirs else None
    if recorded is not None and len(recorded):  # live runs too (program replays, served runs)
        keys = ["run_id", "replica_id", "step_id"]
        counts = out[keys].merge(recorded, on=keys, how="left").seeded_seqs.fillna(0)
        has = out.run_id.isin(set(recorded.run_id)).to_numpy()
        out["seeded_seqs"] = np.where(has, counts.to_numpy(), out.seeded_seqs).astype(np.int64)
    # A grid runs each cell in every regime back to back: a seeded step's greedy twin has the
    # same shape and the machine's speed of the moment, so their difference is the term alone.
    base = [c[: len(c) - len(g) - 1] if g != "greedy" else c
            for c, g in zip(cells, regime)]
    keyed = pd.DataFrame({"run_id": steps.run_id.to_numpy(), "base": base, "regime": regime,
                          "step_id": steps.step_id.to_numpy(), "p": steps.prefill_tokens.to_numpy(),
                          "d": steps.decode_seqs.to_numpy(), "ms": steps.duration_ms.to_numpy()})
    keyed["k"] = keyed.groupby(["run_id", "base", "regime"]).step_id.rank(method="first")
    greedy = keyed[keyed.regime == "greedy"].drop(columns=["regime", "step_id"])
    twins = keyed.merge(greedy, on=["run_id", "base", "k"], how="left", suffixes=("", "_g"))
    # (grid cells only: a live step, with no regime, would be its own twin)
    same = (twins.p == twins.p_g) & (twins.d == twins.d_g) & np.asarray(seeds) & \
        out.seeded_seqs.gt(0).to_numpy()
    return out.assign(greedy_twin_ms=np.where(same, twins.ms_g, np.nan))


def fit_seeded_cost(steps: pd.DataFrame) -> tuple[float, float] | None:
    """(per_step_ms, per_seq_ms) of seeded sampling, from the seeded steps without
    log-probabilities against their greedy twins: 0 when none sampled with seeds, None when
    under `MIN_STEPS` have a twin."""
    seeded = steps.seeded_seqs.to_numpy() > 0
    if not seeded.any():
        return 0.0, 0.0
    rows = steps[seeded & (steps.logprob_tokens.to_numpy() == 0)
                 & steps.greedy_twin_ms.notna().to_numpy()]
    if len(rows) < MIN_STEPS:
        return None
    excess = rows.duration_ms.to_numpy() - rows.greedy_twin_ms.to_numpy()
    x = np.column_stack([np.ones(len(rows)), rows.seeded_seqs.to_numpy(dtype=float)])
    per_step, per_seq = robust_nonnegative_fit(x, excess)
    return per_step, per_seq


def seeded_ms(seeded_seqs, cost: tuple[float, float]):
    """The term for steps of `seeded_seqs` seeded sequences (0 for a step with none)."""
    n = np.asarray(seeded_seqs)
    return np.where(n > 0, cost[0] + cost[1] * n, 0.0)
